// Private: the state behind a Communicator, shared by communicator.cc (the
// API and validation), engine.cc (the queue and progress thread) and
// setup.cc (creating the world and split communicators).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/exchange.h"
#include "comm/communicator.h"
#include "comm/device.h"
#include "comm/status.h"
#include "comm/transport/transport.h"
#include "runtime/config.h"
#include "runtime/rank_info.h"

namespace braid::runtime {
class Store;
class StoreServer;
}  // namespace braid::runtime

namespace braid::comm {

// Host memory for staged copies, kept from call to call (communicator.cc):
// a fresh block of a megabyte or more is a fresh mapping, whose pages the
// kernel zeroes at first touch, a huge page at a time. Blocks come back
// when the call holding one has run, and the pool keeps a few, up to
// kHeldBytes. A registered pool's blocks are registered memory (the copies
// a direct collective's peers read): a fresh region is also one every
// peer maps anew, and a reduce_scatter of 16 MiB into the start of its
// registered send buffer took 57-65 ms with one per call, against 1 ms
// into the rank's slice.
class CopyPool : public std::enable_shared_from_this<CopyPool> {
 public:
  explicit CopyPool(bool registered = false) : registered_(registered) {}
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;
  std::shared_ptr<void> take(std::size_t bytes);

 private:
  static constexpr std::size_t kHeldBytes = std::size_t{256} << 20;
  static constexpr std::size_t kHeldBlocks = 8;
  void* allocate(std::size_t bytes) const;
  static void free_block(void* block, bool registered);
  const bool registered_;
  std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> free_;  // (capacity, block)
  std::size_t held_ = 0;
};

// A copy of a call's input that the call reads instead (an avg of halves
// scaled down, the in-place forms a direct collective cannot read in
// place: communicator.cc). It is filled from the caller's input when the
// call runs (fill(), by the engine), since calls issued before it may still
// write that input: filled at issue, an all_reduce in place followed by an
// avg of the same f16 buffer, issued without a wait between, averaged the
// old values. Memory is taken when the call runs, from `pool`, and given
// back once it has run (taken at issue, each of a thousand calls issued
// back to back held a fresh copy, whose pages the kernel zeroed: an f16 avg
// all_reduce of 1 MiB on 2 ranks took 700 us, against 90 for f32's), and
// only where the algorithm chosen reads the copy. The in-place all_to_all's
// registered copy, which decides the algorithm, is taken, and `op` pointed
// at it, when the call is issued.
struct StagedInput {
  std::shared_ptr<void> memory;    // null: none, or none yet (pool)
  std::shared_ptr<CopyPool> pool;  // where the memory comes from when the call runs
  const void* from = nullptr;
  std::size_t count = 0;  // elements of dtype
  DataType dtype = DataType::u8;
  int shift = 0;          // f16/bf16 scaled by 2^shift; 0: copied as it is
  // A copy for an algorithm that reads the peers' inputs in place (direct)
  // alone: the others read the caller's input.
  bool for_direct = false;
  explicit operator bool() const { return memory != nullptr || pool != nullptr; }
  // Fills the copy where the algorithm reads one (taking it from the pool
  // first, and pointing op.send at it). An avg of halves that
  // `algorithm_scales` its inputs itself gets an unscaled copy, or none, and
  // op.avg_inputs_unscaled set; `algorithm_maps_inputs` (direct) is whether
  // a copy for_direct is read.
  void fill(Op& op, bool algorithm_scales, bool algorithm_maps_inputs);
  // Once the call has run: memory from the pool goes back to it.
  void release() {
    if (pool) memory.reset();
  }
};

// The avg of f16 and bf16 on host memory (communicator.cc): each rank's
// input scaled by a power of two into `input`'s copy, or one from `pool`
// where the call has none, which `op` then sends (op.avg_scale_up set),
// unless the algorithm scales the input as it reads it (the reducing rings
// and the direct collectives: fill); the algorithm's divide by the ranks
// scales the result back up.
void scale_avg_inputs(Op& op, StagedInput& input, int rank, int size, const std::shared_ptr<CopyPool>& pool);

// How many times this process has been forked into (pthread_atfork, counted
// from the first call): a communicator made before the last fork belongs
// to the parent (communicator.cc).
unsigned fork_generation();

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  // Set once, after `error`, under `mu` where other threads may wait; read
  // without it by Work's first look, so a completed call costs no lock.
  std::atomic<bool> done{false};
  std::exception_ptr error;
  // A call on device memory: its stream's side (comm/device.h).
  std::shared_ptr<StagedOp> staged;
  std::chrono::milliseconds timeout{0};
  StagedInput input;  // filled when the call runs; kept while the state lives
  std::vector<void*> recv_chunks;  // a list-form all_gather's buffers (Op::recv_chunks points here)
  std::vector<const void*> send_chunks;  // a list-form reduce_scatter's (Op::send_chunks)
  std::shared_ptr<std::atomic<bool>> failure_seen;  // its communicator's (Impl::failure_seen)
  // fork_generation() at the call: in a child forked since, no thread will
  // ever complete it (the parent's progress thread is not there).
  unsigned born_in = fork_generation();
  void complete(std::exception_ptr e);
  // complete() for a state no other thread can see yet (a call run inline
  // before enqueue returns its Work): no lock, no one to notify.
  void complete_unshared(std::exception_ptr e) {
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  // Until `done`. Bounded: the call (and every one queued before it) fails
  // by itself within BRAID_TIMEOUT of starting.
  void wait_done() {
    if (done.load(std::memory_order_acquire)) return;
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(1), [this] { return done.load(); })) {
    }
  }
};

// The state of every call that completed without error before its Work was
// returned (the engine's lean path): shared, never freed, no count to move.
std::shared_ptr<WorkState> completed_work();

// A send or receive in flight (comm/engine_p2p.cc): its messages are
// posted, and whoever holds the engine's `running` drives them.
// A call whose buffer overlaps that of an earlier one in flight, where
// either of the two writes it (a receive), waits for it (waits_for): a
// send is posted only once the receives it overlaps have landed, a receive
// only once those of them from the same peer have; one that overlaps calls
// still in flight lands in `staging`, copied into the caller's buffer once
// they have landed. A call behind a held one of the same peer and direction is
// held too (engine_p2p.cc: blockers).
struct PointToPoint {
  PointToPoint(const Op& o, std::shared_ptr<WorkState> s) : op(o), state(std::move(s)) {}
  Op op;  // before x, which keeps a reference to it
  std::shared_ptr<WorkState> state;
  std::optional<Exchange> x;
  std::vector<Request> requests;
  std::size_t done = 0;  // requests[0, done) completed and released
  Clock::time_point deadline;
  std::vector<const PointToPoint*> waits_for;  // earlier calls in `p2p`
  void* caller_buffer = nullptr;               // a staged receive's
  std::vector<std::byte> staging;
  bool posted = false;
  bool landed = false;  // posted, its messages done, a staged receive copied out
};

struct Communicator::Impl {
  // Identity.
  int rank = 0;
  int size = 1;
  std::uint32_t comm_id = 0;
  std::string key_prefix;
  // A split communicator's ranks in the world, by rank, and a note that
  // every error of this communicator ends with: "; on communicator
  // braid/world/split0/color1, whose ranks 0, 1 are world ranks 2, 3". Its
  // errors number ranks within it, which in a trainer's mesh (tp, dp and
  // pp groups) was a different process on each group. Empty for a world.
  std::vector<int> world_ranks;
  std::string scope_note;
  unsigned born_in = 0;  // fork_generation() when it was made
  runtime::RankInfo info;

  // Rendezvous and transports.
  std::shared_ptr<runtime::StoreServer> store_server;  // rank 0's world and its splits, without a launcher
  std::shared_ptr<runtime::Store> store;
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::string> hosts;  // [rank] host identity (runtime/topology.h)
  bool one_host = false;           // every rank on this host (set with hosts)
  std::vector<std::string> cpus;   // [rank] its allowed CPUs (runtime::allowed_cpus), exchanged with hosts
  std::unique_ptr<StatusBoard> status;
  // Staged copies' memory (CopyPool), shared with the blocks it lent.
  std::shared_ptr<CopyPool> copies = std::make_shared<CopyPool>();
  std::shared_ptr<CopyPool> registered_copies = std::make_shared<CopyPool>(true);

  // Settings: runtime::config() unless given explicitly; split inherits them.
  runtime::Config config;
  std::string forced_algo;
  std::chrono::milliseconds timeout{300'000};
  std::size_t inline_bytes = 0;
  std::atomic<bool> inline_on{true};  // Communicator::set_inline: small calls may run in the caller's thread

  // Engine: issue order is queue order; `running` marks the thread that runs
  // calls (the one op in flight, or the point-to-point calls below).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<Op, std::shared_ptr<WorkState>>> queue;
  bool running = false;
  // Sends and receives queued back to back run together (engine_p2p.cc),
  // in issue order; only the thread holding `running` touches them, and
  // they are done before any later call runs. p2p_entered: the last of
  // them the status board was told of.
  std::vector<std::unique_ptr<PointToPoint>> p2p;
  Op p2p_entered;
  Clock::time_point next_look{};  // look_for_collectives_instead's next read of the status board
  bool p2p_handed = false;   // under `mu`: a caller left calls in `p2p` for the worker
  bool p2p_running = false;  // under `mu`: the worker runs `p2p` (interrupt it for the next)
  bool stopping = false;
  std::thread worker;
  std::exception_ptr failure;  // first error; the communicator is aborted after it
  std::string failure_text;    // its message, for the calls refused after it
  // Set once a wait() or test() threw a call's error (any call's: after the
  // first error each later call carries its text), or the caller aborted.
  // Shared with the calls' WorkStates, which may outlive the communicator.
  // A failure no one saw is said as the communicator is destroyed: a
  // program that dropped its last calls' Works ended with no word of it.
  std::shared_ptr<std::atomic<bool>> failure_seen = std::make_shared<std::atomic<bool>>(false);
  bool set_up = false;          // its transports connected on every rank (forget_store_keys)
  // The reason of an abort that waits for the call another thread runs
  // (start_worker's failure during a lean or inline call); settle() aborts.
  std::string deferred_abort;
  // The engine's state as the lean path (engine_lean.cc) sees it, in one
  // word that changes only by atomic read-modify-writes: the next
  // collective's sequence number (in units of kOneSeq), kBusy (a call is
  // queued or running, or the communicator failed: the lean path stays
  // out), kLean (a lean call runs: the worker waits for it) and kQueued (a
  // call was queued while another ran, so a lean call that ends hands over
  // under `mu`). engine.cc changes it with `mu` held, the lean path without.
  static constexpr std::uint64_t kBusy = 1, kLean = 2, kQueued = 4, kOneSeq = 8;
  std::atomic<std::uint64_t> gate{kOneSeq};  // collectives are numbered from 1, in issue order
  // Point-to-point ops are numbered per peer and direction instead: ranks
  // issue different numbers of them, so a global number would not match.
  std::map<int, std::uint64_t> sends_to, receives_from;
  int split_count = 0;
  ExchangeContext exchange;  // routes, tuning and buffers every operation reuses
  std::mutex staging_mu;                  // orders staging + queueing of calls on device memory
  std::unique_ptr<DeviceStaging> device;  // from the first call on device memory
  std::unique_ptr<Reducer> device_reducer;  // with `device`: the direct collectives' kernels
  // cuda_ipc: device memory of the ranks of this host as registered
  // regions, connected with `device` where setup.cc left its options (there
  // are ranks on this host). Not in `transports`: it carries no messages.
  std::optional<cuda_ipc::CudaIpcOptions> cuda_ipc;
  std::unique_ptr<Transport> device_regions;
  std::mutex choice_mu;
  struct Choices {
    Algorithm last;                              // for Communicator::last_algorithm
    std::array<std::string_view, 4> logged{};   // algorithms already logged at info
  };
  std::array<Choices, 16> choices_by_kind{};  // [OpKind]
  // The lean path (engine_lean.cc): per kind, the one-shot algorithm that
  // select.cc runs every host call of that kind on up to `bytes`; asked once.
  // noted_bytes: the size of the last call that note_choice() was told of
  // through the lean path, while no other choice for the kind came since
  // (note_choice clears it): a run of same-sized calls is noted once.
  struct Lean {
    Algorithm algorithm;
    std::size_t bytes = 0;
    std::size_t noted_bytes = kNotNoted;
  };
  static constexpr std::size_t kNotNoted = ~std::size_t{0};
  std::array<Lean, 16> lean_by_kind{};  // [OpKind]; algorithm.run null: none
  // prepare() has run (before the first call runs): a flag and a lock
  // rather than std::call_once, which sets thread-locals on every call.
  std::atomic<bool> prepared{false};
  std::mutex prepare_mu;
  // For the Exchange's timeout messages: where `peer` is, who holds `op` up.
  const Exchange::PeerState peer_state = [this](const Op& op, int peer) { return describe_wait(op, peer); };

  ~Impl();
  std::shared_ptr<WorkState> enqueue(Op op, StagedInput input = {});
  // Runs `op` at once through the lean path and returns its completed
  // state, or null (nothing done) where that path does not apply.
  std::shared_ptr<WorkState> try_lean(Op& op, StagedInput& input);
  // Once, with the transports connected: the slots and lean_by_kind.
  void prepare();
  void ensure_prepared() {
    if (!prepared.load(std::memory_order_acquire)) prepare_once();
  }
  void prepare_once();
  Lean steady_lean(const CallShape& shape) const;
  std::string describe_wait(const Op& op, int peer);
  // A failed call's error with this rank and op in front, after the
  // communicator was aborted with it and it was kept as `failure`.
  std::exception_ptr fail(const Op& op, std::exception_ptr raw);
  void start_device(int ordinal);
  void execute(Op& op, WorkState& state, bool inline_call = false);
  bool refuse_after_failure(const Op& op, WorkState& state);
  void fail_with(std::exception_ptr error);
  // Point-to-point calls (engine_p2p.cc).
  bool runs_with_point_to_point(const Op& op, const WorkState& state) const;
  void run_point_to_point(std::unique_lock<std::mutex>& lock);
  bool run_point_to_point_inline(const Op& op, const std::shared_ptr<WorkState>& state);
  void start_point_to_point(const Op& op, std::shared_ptr<WorkState> state);
  std::vector<const PointToPoint*> blockers(const Op& op) const;
  bool may_post(const PointToPoint& call) const;
  void post(PointToPoint& call);
  bool land(PointToPoint& call);
  bool finish_point_to_point(bool inline_call);
  void drive_point_to_point(Clock::time_point until);
  void look_for_collectives_instead();
  void fail_point_to_point(std::exception_ptr raw, bool inline_call);
  void run_worker();
  bool start_worker(const Op& op, WorkState& state);
  void hold_caller(const Op& op, WorkState& state);
  std::uint64_t take_gate(bool collective, bool may_run_now);
  void settle();
  void hand_over();
  CallShape shape_of(const Op& op) const;
  bool registered(const Op& op) const;
  // Under BRAID_ALGO=direct, points an in-place all_to_all's input at a
  // registered copy, returned for the call to fill and keep (communicator.cc).
  StagedInput stage_in_place_all_to_all(Op& op) const;
  // Likewise a reduce_scatter into the start of its send buffer on a rank
  // other than 0 (refused on device memory).
  StagedInput stage_reduce_scatter_at_start(Op& op) const;
  void note_choice(OpKind kind, const Algorithm& algorithm);
  // Closes the transports after a failure, telling the peers `reason`.
  void abort(const std::string& reason);
  // Communicator::abort (engine.cc).
  void abort_by_caller(const std::string& reason);
};

// Builds the transports of a communicator whose identity, store and hosts are set.
void connect_transports(Communicator::Impl& impl);
// At its end, with its threads stopped: the last of the communicator's ranks
// to get here removes its keys from the store (sparing its splits'). Best
// effort, bounded in time, never throws.
void forget_store_keys(Communicator::Impl& impl) noexcept;

}  // namespace braid::comm
