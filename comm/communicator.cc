// The public calls. Each builds an Op, passes the one validate(), and goes
// through the one submit(): ten collectives, one copy of the checking code.
#include "comm/communicator.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator_impl.h"
#include "comm/device.h"
#include "comm/transport/shm/memory.h"
#include "kernels/cpu/reduce.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

std::size_t buffer_elements(const Op& op, int size) {
  switch (op.kind) {
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
    case OpKind::all_to_all: return op.count * static_cast<std::size_t>(size);
    default: return op.count;
  }
}

bool needs_send_buffer(const Op& op, int rank) {
  switch (op.kind) {
    case OpKind::recv:
    case OpKind::barrier: return false;
    case OpKind::broadcast: return rank == op.root;
    default: return true;
  }
}

bool needs_recv_buffer(const Op& op, int rank) {
  switch (op.kind) {
    case OpKind::send:
    case OpKind::barrier: return false;
    case OpKind::reduce: return rank == op.root;
    default: return true;
  }
}

// "rank 3, all_reduce: ", the start of every refusal; built only for one.
std::string call_text(const Op& op, int rank) {
  return "rank " + std::to_string(rank) + ", " + std::string(name(op.kind)) + ": ";
}

// Names the first thing wrong with `op`'s arguments. Out of line and cold:
// validate() only calls it once its own cheap tests found something.
[[noreturn, gnu::noinline, gnu::cold]] void refuse(const Op& op, int rank, int size) {
  auto call = [&] { return call_text(op, rank); };
  if (!is_valid(op.dtype)) throw InvalidUsage(call() + "unknown DataType " + std::to_string(int(op.dtype)));
  if (!is_valid(op.reduce_op)) throw InvalidUsage(call() + "unknown ReduceOp " + std::to_string(int(op.reduce_op)));
  if (!can_reduce(op.dtype, op.reduce_op))
    throw InvalidUsage(call() + std::string(name(op.reduce_op)) + " is a bitwise operator, for the integer types "
                       "(i8, u8, i32, i64), not for " + std::string(name(op.dtype)));
  bool rooted = op.kind == OpKind::broadcast || op.kind == OpKind::reduce;
  bool p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
  if ((rooted || p2p) && (op.root < 0 || op.root >= size))
    throw InvalidUsage(call() + (p2p ? "peer " : "root ") + std::to_string(op.root) + " is out of range [0, " +
                       std::to_string(size) + ")");
  if (p2p && op.root == rank) throw InvalidUsage(call() + "a rank cannot send to or receive from itself");
  std::size_t most_bytes;
  if (__builtin_mul_overflow(op.count, 8 * static_cast<std::size_t>(size), &most_bytes))
    throw InvalidUsage(call() + "count " + std::to_string(op.count) + " overflows the buffer size");
  if (needs_send_buffer(op, rank) && !op.send && !op.send_chunks)
    throw InvalidUsage(call() + "send buffer is null with count > 0");
  throw InvalidUsage(call() + "receive buffer is null with count > 0");
}

// Whether `op`'s send and receive buffers overlap other than in its
// in-place form: the same buffer, or for reduce_scatter the receive buffer
// at this rank's slice of the send buffer (NCCL's) or at its start, for
// all_gather the send buffer at this rank's slice of the receive buffer.
// The algorithms read an input that overlaps their output only in those
// forms; any other overlap gave wrong results with no error.
bool overlaps_otherwise(const Op& op, int rank, int size) {
  if (op.recv_chunks || op.send_chunks) return false;  // check_chunks, check_send_chunks
  const std::size_t es = dtype_bytes(op.dtype);
  const std::size_t send_bytes = send_elements(op, rank, size) * es, recv_bytes = recv_elements(op, rank, size) * es;
  auto* send = static_cast<const std::byte*>(op.send);
  auto* recv = static_cast<const std::byte*>(op.recv);
  if (send_bytes == 0 || recv_bytes == 0 || send >= recv + recv_bytes || recv >= send + send_bytes) return false;
  const std::size_t slice = op.count * es * static_cast<std::size_t>(rank);
  switch (op.kind) {
    case OpKind::reduce_scatter: return recv != send + slice && recv != send;
    case OpKind::all_gather: return send != recv + slice;
    default: return send != recv;
  }
}

[[noreturn, gnu::noinline, gnu::cold]] void refuse_overlap(const Op& op, int rank) {
  std::string in_place = "the same pointer for both";
  if (op.kind == OpKind::reduce_scatter)
    in_place = "the receive buffer at this rank's slice of the send buffer (send + rank x count) or at its start";
  if (op.kind == OpKind::all_gather)
    in_place = "the send buffer at this rank's slice of the receive buffer (recv + rank x count)";
  throw InvalidUsage(call_text(op, rank) + "the send and receive buffers overlap, but not as an in-place call; "
                     "pass buffers that do not overlap, or for an in-place call " + in_place);
}

// The list form of all_gather (Op::recv_chunks): every rank's buffer
// there, none overlapping another (two ranks' parts in one place), nor the
// send buffer, except recv_chunks[rank] that is the send buffer (in place).
[[gnu::noinline]] void check_chunks(const Op& op, int rank, int size) {
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  std::vector<std::pair<const std::byte*, int>> at;  // each buffer's start, by address
  for (int r = 0; r < size; ++r) {
    auto* chunk = static_cast<const std::byte*>(op.recv_chunks[r]);
    if (!chunk) throw InvalidUsage(call_text(op, rank) + "receive buffer " + std::to_string(r) + " is null with count > 0");
    auto* send = static_cast<const std::byte*>(op.send);
    if (chunk < send + bytes && send < chunk + bytes && !(r == rank && chunk == send))
      throw InvalidUsage(call_text(op, rank) + "receive buffer " + std::to_string(r) + " overlaps the send buffer" +
                         (r == rank ? " other than as in place (the same pointer)"
                                    : "; only this rank's own (receive buffer " + std::to_string(rank) +
                                          ") may be the send buffer, for an in-place call"));
    at.emplace_back(chunk, r);
  }
  std::sort(at.begin(), at.end());
  for (std::size_t k = 1; k < at.size(); ++k)
    if (at[k].first < at[k - 1].first + bytes)
      throw InvalidUsage(call_text(op, rank) + "receive buffers " + std::to_string(std::min(at[k - 1].second, at[k].second)) +
                         " and " + std::to_string(std::max(at[k - 1].second, at[k].second)) +
                         " overlap; each rank's part needs a buffer of its own");
}

// The list form of reduce_scatter (Op::send_chunks): every rank's input
// there, none sharing a byte with the receive buffer unless it is this
// rank's own at the same address (in place). Inputs may share bytes with
// one another: they are only read.
[[gnu::noinline]] void check_send_chunks(const Op& op, int rank, int size) {
  const std::size_t bytes = op.count * dtype_bytes(op.dtype);
  auto* recv = static_cast<const std::byte*>(op.recv);
  for (int r = 0; r < size; ++r) {
    auto* chunk = static_cast<const std::byte*>(op.send_chunks[r]);
    if (!chunk) throw InvalidUsage(call_text(op, rank) + "send buffer " + std::to_string(r) + " is null with count > 0");
    if (chunk < recv + bytes && recv < chunk + bytes && !(r == rank && chunk == recv))
      throw InvalidUsage(call_text(op, rank) + "send buffer " + std::to_string(r) + " overlaps the receive buffer" +
                         (r == rank ? " other than as in place (the same pointer)"
                                    : "; only this rank's own (send buffer " + std::to_string(rank) +
                                          ") may be the receive buffer, for an in-place call"));
  }
}

// Every call's argument check, as branch-free tests with one branch on
// the lot (issue 18: a small call's budget is a few hundred instructions);
// refuse() then names what failed.
void validate(const Op& op, int rank, int size) {
  const bool rooted = op.kind == OpKind::broadcast || op.kind == OpKind::reduce;
  const bool p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
  // count x 8 x size overflows where count > SIZE_MAX / 8 / size: no division per call
  std::size_t most_bytes;
  const bool overflows = __builtin_mul_overflow(op.count, 8 * static_cast<std::size_t>(size), &most_bytes);
  const bool moves_data = buffer_elements(op, size) != 0;
  const bool bad = !is_valid(op.dtype) | !is_valid(op.reduce_op) | !can_reduce(op.dtype, op.reduce_op) |
                   ((rooted | p2p) & (static_cast<unsigned>(op.root) >= static_cast<unsigned>(size))) |
                   (p2p & (op.root == rank)) | overflows |
                   (moves_data & ((needs_send_buffer(op, rank) & !op.send & !op.send_chunks) |
                                  (needs_recv_buffer(op, rank) & !op.recv & !op.recv_chunks)));
  if (bad) [[unlikely]] refuse(op, rank, size);
  if (moves_data && overlaps_otherwise(op, rank, size)) [[unlikely]] refuse_overlap(op, rank);
  if (moves_data && op.recv_chunks) check_chunks(op, rank, size);
  if (moves_data && op.send_chunks) check_send_chunks(op, rank, size);
}

// Finds where the buffers live (op.memory): both on one side, one device;
// device memory only where CUDA was built; a stream only for device memory.
// The common call, with no stream in a process without a CUDA driver, has
// no pointer that can be device memory and nothing here can fail: submit()
// leaves its op.memory host memory without calling this.
void locate_buffers(Op& op, int rank, int size) {
  auto call = [&] { return call_text(op, rank); };
  const bool moves_data = buffer_elements(op, size) > 0;
  const void* send = moves_data && needs_send_buffer(op, rank) ? op.send : nullptr;
  const void* recv = moves_data && needs_recv_buffer(op, rank) ? op.recv : nullptr;
  runtime::Location in, out;  // host memory, unless a CUDA driver is loaded (or a test locates)
  if (runtime::device_memory_possible()) {
    in = runtime::locate(send);
    out = recv == send ? in : runtime::locate(recv);
  }
  if (send && recv && (in.kind != out.kind || in.device != out.device))
    throw InvalidUsage(call() + "the send buffer is in " + runtime::describe(in) + " but the receive buffer in " +
                       runtime::describe(out) + "; both must be in the same memory");
  op.memory = send ? in : out;
  if ((op.recv_chunks || op.send_chunks) && moves_data) {
    const void* const* table = op.recv_chunks ? op.recv_chunks : op.send_chunks;
    bool host = op.memory.kind == runtime::MemoryKind::host;
    for (int r = 0; r < size && host; ++r)
      host = !runtime::device_memory_possible() || runtime::locate(table[r]).kind == runtime::MemoryKind::host;
    if (!host || op.stream.cuda != nullptr)
      throw InvalidUsage(call() + "the list form (one " + (op.recv_chunks ? "receive" : "send") +
                         " buffer per rank) takes host memory and no stream; " +
                         (op.recv_chunks ? "gather device buffers into one buffer of size x count"
                                         : "pass device inputs as one buffer of size x count"));
  }
  if (op.memory.kind == runtime::MemoryKind::device && !runtime::cuda_built())
    throw InvalidUsage(call() + "the buffers are in " + runtime::describe(op.memory) +
                       ", but this braid was built without CUDA (nvcc was not found when it was configured); "
                       "rebuild it with the CUDA toolkit installed, or pass host memory");
  if (op.stream.cuda != nullptr && !runtime::cuda_built())
    throw InvalidUsage(call() + "a CUDA stream was given, but this braid was built without CUDA");
  if (op.stream.cuda != nullptr && moves_data && op.memory.kind == runtime::MemoryKind::host)
    throw InvalidUsage(call() + "a CUDA stream was given, but the buffers are in host memory; pass device "
                       "buffers with a stream, or host buffers without one");
}

Op make(OpKind kind, const void* send, void* recv, std::size_t count, DataType dtype,
        ReduceOp reduce_op = ReduceOp::sum, int root = -1, Stream stream = {}) {
  Op op;
  op.stream = stream;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.root = root;
  return op;
}

}  // namespace

std::size_t send_elements(const Op& op, int rank, int size) {
  if (!needs_send_buffer(op, rank)) return 0;
  return op.kind == OpKind::all_gather ? op.count : buffer_elements(op, size);
}

std::size_t recv_elements(const Op& op, int rank, int size) {
  if (!needs_recv_buffer(op, rank)) return 0;
  return op.kind == OpKind::reduce_scatter ? op.count : buffer_elements(op, size);
}

namespace {

std::atomic<unsigned> forks{0};

// A communicator used in a child forked after it was made: its progress
// thread does not exist there and its connections and shared memory are
// the parent's. A call would take the parent's place in the job (and leave
// the parent out of step); closing it closed the parent's connections.
[[noreturn, gnu::noinline, gnu::cold]] void refuse_forked(const Op& op, int rank) {
  throw InvalidUsage(call_text(op, rank) + "this communicator was made in the process this one was forked from; "
                     "a forked child cannot use it (create one in the child, or fork before creating it)");
}

}  // namespace

unsigned fork_generation() {
  static const bool counting = pthread_atfork(nullptr, nullptr, [] { forks.fetch_add(1, std::memory_order_relaxed); }) == 0;
  (void)counting;
  return forks.load(std::memory_order_relaxed);
}

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

// In a forked child the communicator is the parent's: it is left as it is
// (leaked), as tearing it down would join threads that do not exist there
// and shut the parent's connections down.
Communicator::~Communicator() {
  if (impl_ && impl_->born_in != forks.load(std::memory_order_relaxed)) new auto(std::move(impl_));
}

void Communicator::abort(const std::string& reason) {
  if (impl_->born_in != forks.load(std::memory_order_relaxed))
    throw InvalidUsage("rank " + std::to_string(impl_->rank) +
                       ", abort: this communicator was made in the process this one was forked from; a forked "
                       "child cannot abort it (its connections are the parent's)");
  impl_->abort_by_caller(reason);
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
std::chrono::milliseconds Communicator::timeout() const { return impl_->timeout; }
void Communicator::set_inline(bool on) { impl_->inline_on.store(on, std::memory_order_relaxed); }

// The avg of f16 and bf16 on host memory. Summed as they come, the inputs
// overflowed on the way to an average the type holds (two ranks of 40000
// in f16 reach 80000 > 65504) and the result was inf. Each rank's input is
// scaled by 2^-k first, 2^k the least power of two >= the ranks, so no
// partial sum exceeds the largest input; the algorithm divides the sum by
// the ranks as before and scales each quotient back by 2^k as it divides
// (Op::avg_scale_up), so the result costs no pass of its own. Scaling by a
// power of two is exact in these types and commutes with rounding (short
// of subnormals), so wherever summing first was exact the result is the
// same bits.
namespace {

int avg_shift(int size) { return std::countr_zero(std::bit_ceil(static_cast<unsigned>(size))); }

}  // namespace

void* CopyPool::allocate(std::size_t bytes) const {
  if (registered_) return shm::regions::allocate(bytes);
  return new std::byte[bytes];  // uninitialised: every byte is written by fill()
}

void CopyPool::free_block(void* block, bool registered) {
  if (registered) shm::regions::release(block);
  else delete[] static_cast<std::byte*>(block);
}

CopyPool::~CopyPool() {
  for (auto& [capacity, block] : free_) free_block(block, registered_);
}

std::shared_ptr<void> CopyPool::take(std::size_t bytes) {
  void* block = nullptr;
  std::size_t capacity = 0;
  {
    std::lock_guard lock(mu_);
    // The smallest block that holds it, and not one far larger.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && it->first <= 4 * bytes + 4096 && (best == free_.end() || it->first < best->first))
        best = it;
    if (best != free_.end()) {
      capacity = best->first;
      block = best->second;
      held_ -= capacity;
      free_.erase(best);
    }
  }
  if (!block) {
    block = allocate(bytes);
    capacity = bytes;
  }
  std::weak_ptr<CopyPool> home = weak_from_this();
  const bool registered = registered_;
  return std::shared_ptr<void>(block, [home, capacity, registered](void* raw) {
    void* dropped = raw;  // what is freed here, outside the lock: raw, or the smallest block it displaces
    if (const std::shared_ptr<CopyPool> pool = home.lock()) {
      std::lock_guard lock(pool->mu_);
      if (pool->held_ + capacity <= kHeldBytes) {
        dropped = nullptr;
        if (pool->free_.size() == kHeldBlocks) {  // the smallest goes
          auto smallest = std::min_element(pool->free_.begin(), pool->free_.end(),
                                           [](const auto& a, const auto& b) { return a.first < b.first; });
          if (smallest->first >= capacity) {
            dropped = raw;
          } else {
            dropped = smallest->second;
            pool->held_ -= smallest->first;
            pool->free_.erase(smallest);
          }
        }
        if (dropped != raw) {
          pool->free_.emplace_back(capacity, raw);
          pool->held_ += capacity;
        }
      }
    }
    if (dropped) free_block(dropped, registered);
  });
}

void scale_avg_inputs(Op& op, StagedInput& input, int rank, int size, const std::shared_ptr<CopyPool>& pool) {
  if (op.reduce_op != ReduceOp::avg || (op.dtype != DataType::f16 && op.dtype != DataType::bf16) ||
      op.memory.kind != runtime::MemoryKind::host || size == 1)
    return;
  if (op.kind != OpKind::all_reduce && op.kind != OpKind::reduce_scatter && op.kind != OpKind::reduce) return;
  const std::size_t count = send_elements(op, rank, size);
  if (count == 0) return;  // the same count on every rank: none scales
  op.avg_scale_up = avg_shift(size);
  // A copy the call makes anyway (a registered one: reduce_scatter at the
  // start of its send buffer) is scaled as it is filled; otherwise one from
  // the pool, which op.send points at once it is taken (fill). Until then
  // the call is judged by the caller's input, registered or not: the
  // algorithms that read registered inputs (direct) scale them as they
  // read them.
  if (!input) input = StagedInput{nullptr, pool, op.send, count, op.dtype, 0};
  input.shift = -avg_shift(size);
}

void StagedInput::fill(Op& op, bool algorithm_scales, bool algorithm_maps_inputs) {
  if (!memory && !pool) return;
  // An avg the algorithm scales as it reads, on every rank that runs it, so
  // that a neighbour's first send (the ring's) is its input as it is on
  // every rank.
  const bool unscaled = shift != 0 && algorithm_scales;
  if (unscaled) op.avg_inputs_unscaled = true;
  const bool read = memory || (shift != 0 && !unscaled) || (for_direct && algorithm_maps_inputs);
  if (!read) return;  // op.send is the caller's input
  if (!memory) {
    memory = pool->take(count * dtype_bytes(dtype));
    op.send = memory.get();
  }
  if (shift != 0 && !unscaled)
    kernels::cpu::scale_halves(memory.get(), from, count, dtype, shift);
  else
    std::memcpy(memory.get(), from, count * dtype_bytes(dtype));
}

namespace {

// Whether `op`'s input of `count` elements lies in registered memory (where
// a direct collective may read it).
bool registered_input(const Op& op, std::size_t count) {
  RegionRef ref;
  return shm::regions::find(op.send, count * dtype_bytes(op.dtype), ref);
}

}  // namespace

// An in-place all_to_all under BRAID_ALGO=direct. The direct collective
// cannot run it in place (a peer would overwrite a block of this rank's
// input before reading it: select.cc), and whether a call is in place is
// each rank's own business, so a rank in place that fell back to pairwise
// while its peers ran direct failed them all with a mismatch. A registered
// input is copied instead into registered memory, which the direct
// collective reads while it writes the caller's buffer: every rank runs
// direct. (Unforced, host all_to_all runs pairwise, in place or not.)
StagedInput Communicator::Impl::stage_in_place_all_to_all(Op& op) const {
  if (op.kind != OpKind::all_to_all || forced_algo != "direct" || op.memory.kind != runtime::MemoryKind::host)
    return {};
  const std::size_t count = send_elements(op, rank, size);
  const std::size_t bytes = count * dtype_bytes(op.dtype);
  auto* send = static_cast<const std::byte*>(op.send);
  auto* recv = static_cast<const std::byte*>(op.recv);
  if (bytes == 0 || send >= recv + bytes || recv >= send + bytes || !registered_input(op, count)) return {};
  // Taken now and op.send pointed at it: the copy is what makes the call
  // not in place, and so one the direct collective can run.
  StagedInput staged{registered_copies->take(bytes), registered_copies, op.send, count, op.dtype};
  op.send = staged.memory.get();
  return staged;
}

// reduce_scatter into the start of its send buffer on a rank other than 0
// (not NCCL's in-place form, the rank's own slice). The ring serves it, but
// a direct collective (registered host buffers under BRAID_ALGO=direct,
// device buffers through CUDA IPC) reads the peers' input blocks straight
// from their buffers, and this rank's result overwrote one before a peer
// had read it: wrong results on the other ranks. A registered input is
// copied into registered memory, which a direct collective then reads (the
// ring reads the caller's input: StagedInput::for_direct); on device
// memory the form is refused.
StagedInput Communicator::Impl::stage_reduce_scatter_at_start(Op& op) const {
  if (op.kind != OpKind::reduce_scatter || rank == 0 || op.send != op.recv || op.count == 0) return {};
  if (op.memory.kind == runtime::MemoryKind::device)
    throw InvalidUsage(call_text(op, rank) + "on device memory the receive buffer must be this rank's slice of the "
                       "send buffer (send + rank x count) or a buffer of its own, not the send buffer's start");
  const std::size_t count = send_elements(op, rank, size);
  if (!registered_input(op, count)) return {};
  return StagedInput{nullptr, registered_copies, op.send, count, op.dtype, 0, true};
}

Work Communicator::submit(Op&& op) {
  if (impl_->born_in != forks.load(std::memory_order_relaxed)) [[unlikely]] refuse_forked(op, impl_->rank);
  try {
    validate(op, impl_->rank, impl_->size);
  } catch (const InvalidUsage& e) {
    if (impl_->scope_note.empty()) throw;
    throw InvalidUsage(e.what() + impl_->scope_note);  // which process "rank 1" of a split is
  }
  if (op.stream.cuda != nullptr || runtime::device_memory_possible()) locate_buffers(op, impl_->rank, impl_->size);
  StagedInput input = impl_->stage_in_place_all_to_all(op);
  if (!input) input = impl_->stage_reduce_scatter_at_start(op);
  scale_avg_inputs(op, input, impl_->rank, impl_->size, impl_->copies);
  if (auto done = impl_->try_lean(op, input)) return Work(std::move(done));  // small one-shot calls (engine_lean.cc)
  return Work(impl_->enqueue(op, std::move(input)));  // the state keeps the input until the engine is done
}

Work Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                              Stream stream) {
  return submit(make(OpKind::all_reduce, send, recv, count, dtype, op, -1, stream));
}

Work Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                                  ReduceOp op, Stream stream) {
  return submit(make(OpKind::reduce_scatter, send, recv, recv_count, dtype, op, -1, stream));
}

Work Communicator::reduce_scatter(std::span<const void* const> send, void* recv, std::size_t recv_count,
                                  DataType dtype, ReduceOp op) {
  if (send.size() != static_cast<std::size_t>(impl_->size))
    throw InvalidUsage("rank " + std::to_string(impl_->rank) + ", reduce_scatter: " + std::to_string(send.size()) +
                       " send buffers for a communicator of " + std::to_string(impl_->size) +
                       " ranks; the list form takes one per rank" + impl_->scope_note);
  Op call = make(OpKind::reduce_scatter, nullptr, recv, recv_count, dtype, op);
  call.send_chunks = send.data();
  return submit(std::move(call));
}

Work Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype,
                              Stream stream) {
  return submit(make(OpKind::all_gather, send, recv, send_count, dtype, ReduceOp::sum, -1, stream));
}

Work Communicator::all_gather(const void* send, std::span<void* const> recv, std::size_t send_count,
                              DataType dtype) {
  if (recv.size() != static_cast<std::size_t>(impl_->size))
    throw InvalidUsage("rank " + std::to_string(impl_->rank) + ", all_gather: " + std::to_string(recv.size()) +
                       " receive buffers for a communicator of " + std::to_string(impl_->size) +
                       " ranks; the list form takes one per rank" + impl_->scope_note);
  Op op = make(OpKind::all_gather, send, nullptr, send_count, dtype);
  op.recv_chunks = recv.data();
  return submit(std::move(op));
}

Work Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                             Stream stream) {
  return submit(make(OpKind::broadcast, send, recv, count, dtype, ReduceOp::sum, root, stream));
}

Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                          int root, Stream stream) {
  return submit(make(OpKind::reduce, send, recv, count, dtype, op, root, stream));
}

Work Communicator::send(const void* buffer, std::size_t count, DataType dtype, int peer, Stream stream) {
  return submit(make(OpKind::send, buffer, nullptr, count, dtype, ReduceOp::sum, peer, stream));
}

Work Communicator::recv(void* buffer, std::size_t count, DataType dtype, int peer, Stream stream) {
  return submit(make(OpKind::recv, nullptr, buffer, count, dtype, ReduceOp::sum, peer, stream));
}

Work Communicator::all_to_all(const void* send, void* recv, std::size_t count_per_peer, DataType dtype,
                              Stream stream) {
  return submit(make(OpKind::all_to_all, send, recv, count_per_peer, dtype, ReduceOp::sum, -1, stream));
}

Work Communicator::barrier() { return submit(make(OpKind::barrier, nullptr, nullptr, 0, DataType::u8)); }

// Registered memory is the shm transport's kind (memfds the ranks of a host
// map into each other); a transport that registers other memory adds its own.
void* Communicator::allocate(std::size_t bytes) { return shm::regions::allocate(bytes); }

void Communicator::deallocate(void* pointer) { shm::regions::release(pointer); }

TrafficStats Communicator::traffic() const {
  TrafficStats stats;
  for (const auto& t : impl_->transports) {
    stats.bytes_sent += t->bytes_sent();
    stats.bytes_received += t->bytes_received();
  }
  return stats;
}

namespace {

// std::out_of_range from .at() crossed the API with its library text
// ("vector::_M_range_check: __n (which is 18446744073709551615)"), where
// errors.h promises braid's five errors (found by a review helper).
void check_rank(const char* what, int rank, int size) {
  if (rank < 0 || rank >= size)
    throw InvalidUsage(std::string(what) + ": rank " + std::to_string(rank) + " is out of range [0, " +
                       std::to_string(size) + ")");
}

}  // namespace

std::string Communicator::transport_of(int peer) const {
  check_rank("transport_of", peer, impl_->size);
  if (peer == impl_->rank) return "self";
  Transport* t = impl_->exchange.routes.at(static_cast<std::size_t>(peer));
  return t ? std::string(t->name()) : "none";
}

int Communicator::host_index(int rank) const {
  check_rank("host_index", rank, impl_->size);
  const auto& hosts = impl_->hosts;
  if (hosts.empty()) return 0;
  const std::string& mine = hosts.at(static_cast<std::size_t>(rank));
  std::vector<std::string> seen;
  for (const std::string& host : hosts) {
    if (host == mine) break;
    if (std::find(seen.begin(), seen.end(), host) == seen.end()) seen.push_back(host);
  }
  return static_cast<int>(seen.size());
}

AlgorithmChoice Communicator::last_algorithm(OpKind kind) const {
  if (static_cast<std::size_t>(kind) >= impl_->choices_by_kind.size())
    throw InvalidUsage("last_algorithm: OpKind " + std::to_string(static_cast<int>(kind)) + " is not a call kind");
  std::lock_guard lock(impl_->choice_mu);
  const Algorithm& last = impl_->choices_by_kind.at(static_cast<std::size_t>(kind)).last;
  if (last.name.empty()) return {};
  std::string reason = describe(last.reason);
  if ((last.name == "direct" || last.name == "cuda_ipc") && kind != OpKind::send && kind != OpKind::recv &&
      impl_->exchange.last_direct_one_worker.load(std::memory_order_relaxed))
    reason += "; one worker: rank 0 did every rank's share (BRAID_DIRECT_WORKERS)";
  const bool ordered = impl_->exchange.last_direct_stream_ordered.load(std::memory_order_relaxed);
  const bool flagged = impl_->exchange.last_direct_flag_ordered.load(std::memory_order_relaxed);
  if (flagged && (last.name == "direct" || last.name == "cuda_ipc"))
    reason += "; flag gate: each call holds its caller until every rank's kernels are queued, and the streams "
              "wait for each other by flags in device memory, one-thread kernels before and after the call's "
              "(BRAID_CUDA_GATE)";
  else if (ordered && (last.name == "direct" || last.name == "cuda_ipc"))
    reason += "; event gate: each call holds its caller until every rank's kernels are queued, and the streams "
              "wait for each other's CUDA IPC events (BRAID_CUDA_GATE)";
  else if (impl_->config.cuda_gate == "auto" && impl_->exchange.gpu_shared.load(std::memory_order_relaxed))
    reason += "; host gate: a peer's process shares this GPU, so each call holds its caller (BRAID_CUDA_GATE=auto)";
  return {std::string(last.name), reason};
}

std::string Communicator::transport_summary() const {
  std::string summary;
  for (const auto& t : impl_->transports) summary += (summary.empty() ? "" : "+") + std::string(t->name());
  return summary.empty() ? "none" : summary;
}

}  // namespace braid::comm
