// torch.distributed's operations as braid calls (process_group.h).
#include "process_group.h"

#include <Python.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "braid/errors.h"
#include "tensors.h"

namespace braid::torch_backend {

namespace {

// What the errors of an all_to_all run as sends and receives say first.
constexpr const char* kRunsAsExchange =
    "braid: this all_to_all runs as a send to and a receive from every peer (count: the elements of that peer's part)";

// The timeout torch passes (init_process_group's or new_group's `timeout`,
// 30 minutes unless given) is the group's, longer or shorter than
// BRAID_TIMEOUT, as gloo and NCCL honour it: a job whose rank 0 prepares
// data for ten minutes while the others wait says so there. (It was capped
// at BRAID_TIMEOUT, 5 minutes unless set, whatever torch was told.) One
// longer than BRAID_TIMEOUT's own bound, 1e7 s, counts as that: a
// timedelta of a thousand years, meant as "never", overflowed every
// deadline computed from it, and the first wait failed at once.
runtime::Config group_config(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kLongest = std::chrono::seconds(10'000'000);
  runtime::Config config = runtime::config();
  if (timeout.count() > 0) {
    config.timeout = std::min(timeout, kLongest);
    config.timeout_name = "the process group's timeout";
  }
  return config;
}

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw InvalidUsage(std::string("braid: ") + op + ": " + what);
}

// Copies `tensors`, in order, into consecutive parts of `flat` (coalesced
// all-reduce, reduce-scatter's list of inputs, scatter's).
void flatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()).copy_(tensor);
    offset += tensor.numel();
  }
}

int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& tensor : tensors) total += tensor.numel();
  return total;
}

// Where the tensors lie one after another in one storage, each contiguous
// (list(t.chunk(n)), t.split(k), t.unbind(0) of a contiguous t), the block
// they fill as one flat view, which a braid call reads or writes in place:
// no staging tensor, no copy. An undefined tensor otherwise.
at::Tensor one_block(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return {};
  const at::Tensor& first = tensors[0];
  const auto* next = static_cast<const std::byte*>(first.data_ptr());
  for (const auto& tensor : tensors) {
    if (tensor.numel() == 0 || !tensor.is_contiguous() || tensor.scalar_type() != first.scalar_type() ||
        tensor.data_ptr() != next || !tensor.storage().is_alias_of(first.storage()))
      return {};
    next += tensor.nbytes();
  }
  return first.as_strided({total_numel(tensors)}, {1}, first.storage_offset());
}

// Whether the contiguous tensors `a` and `b` share any byte.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto* a_begin = static_cast<const std::byte*>(a.data_ptr());
  const auto* b_begin = static_cast<const std::byte*>(b.data_ptr());
  return a.nbytes() && b.nbytes() && a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

// `finish`, then the staging block marked reusable: a call's last step on
// success (a failed call's block is freed, staging.h).
std::function<void()> then_reusable(std::function<void()> finish, std::function<void()> reusable) {
  return [finish = std::move(finish), reusable = std::move(reusable)] {
    if (finish) finish();
    reusable();
  };
}

// Copies consecutive parts of `flat` (of `count` elements each, or each
// tensor's own count when `count` is 0) into `tensors`.
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors, int64_t count = 0) {
  int64_t offset = 0;
  for (auto& tensor : tensors) {
    int64_t n = count ? count : tensor.numel();
    tensor.copy_(flat.narrow(0, offset, n).view(tensor.sizes()));
    offset += n;
  }
}

// Elements of `tensor` each rank's part holds, from torch's split sizes
// (in rows of dimension 0); equal parts when `splits` is empty.
std::vector<int64_t> element_splits(const at::Tensor& tensor, const std::vector<int64_t>& splits, int size) {
  const int64_t rows = tensor.dim() ? tensor.size(0) : 1;
  const int64_t row_elements = rows ? tensor.numel() / rows : 0;
  std::vector<int64_t> counts(static_cast<std::size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0)
      refuse("alltoall_base", std::to_string(rows) + " rows do not split into " + std::to_string(size) +
                                  " equal parts; pass split sizes");
    std::fill(counts.begin(), counts.end(), rows / size * row_elements);
    return counts;
  }
  if (splits.size() != counts.size())
    refuse("alltoall_base", std::to_string(splits.size()) + " split sizes for " + std::to_string(size) + " ranks");
  int64_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (splits[r] < 0) refuse("alltoall_base", "negative split size " + std::to_string(splits[r]));
    counts[r] = splits[r] * row_elements;
    total += splits[r];
  }
  if (total != rows)
    refuse("alltoall_base", "split sizes add up to " + std::to_string(total) + " rows, the tensor has " +
                                std::to_string(rows));
  return counts;
}

}  // namespace

namespace {

// Lets the GIL go for its lifetime where the calling thread holds it
// (destroy_process_group from Python): the completion threads run Python
// callbacks, which take it, and the group waits for them.
class GilLetGo {
 public:
  GilLetGo() : saved_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~GilLetGo() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  GilLetGo(const GilLetGo&) = delete;
  GilLetGo& operator=(const GilLetGo&) = delete;

 private:
  PyThreadState* saved_;
};

}  // namespace

// The process's groups. While there are two or more, none runs a call in
// the caller's thread (Communicator::set_inline): torch lets async calls on
// two groups be issued in opposite orders on two ranks (gloo completes
// them), and a call run in the caller's thread returns only once its peers
// have joined it, which the peer does only after its own first call, on the
// other group. One group alone keeps the faster inline path, for the calls
// its caller waits for at once (Issuer, below).
namespace {

std::mutex groups_mutex;
std::vector<std::shared_ptr<Issuer>> groups;

void inline_while_alone() {
  for (const auto& group : groups) group->set_alone(groups.size() == 1);
}

}  // namespace

// A call that runs in the caller's thread (the group alone, a small call)
// returns only once every peer has joined it. torch's async_op=True then
// did not return at once, and a rank that waited for a peer through another
// channel (the store, a gloo group) before waiting for the call deadlocked
// with that peer until the group's timeout; gloo returns at once. So while
// the group is alone, a collective on host tensors is held back when torch
// asks for it, and issued
//   - in the caller's thread when the caller waits for it without a
//     deadline: a synchronous call (no async_op) waits at once, and keeps
//     the inline path's latency;
//   - on the progress thread kHoldTime later, or at once when anything else
//     happens on the group: its next call, is_completed(), a wait with a
//     deadline, get_future() (DDP's hooks), the group's end.
// At most one call is held, so calls keep their issue order. Device calls
// are not held (their stream order is taken at issue), nor sends and
// receives (an inline one that must wait for its peer goes to the progress
// thread anyway).
//
// A call whose hazards (earlier calls in flight on the same host bytes,
// ProcessGroupBraid::InFlight) have not all finished is deferred: queued
// here, with every later call of the group behind it, and issued by the
// holding thread, in order, once they have (call_finished() wakes it; the
// hazards are issued calls, bounded by their own timeout). The caller
// returns at once. (It waited there, as the call was made, and an async
// chain then followed by a go-ahead to the peers through the store, or
// issued on two groups in opposite orders, deadlocked until the group's
// timeout.) A device call meeting deferred calls waits for them in the
// caller, bounded by the group's timeout: braid takes its stream's order as
// it is issued, which a later issue would move past the caller's next
// kernels.
Issuer::Issuer(comm::Communicator& comm, Completer& completer, std::chrono::milliseconds timeout)
    : comm_(comm), completer_(completer), timeout_(timeout), thread_([this] { hold_loop(); }) {
  completer_.queue()->set_finished_hook([this] { call_finished(); });
}

void Issuer::set_alone(bool alone) {
  alone_.store(alone, std::memory_order_relaxed);
  comm_.set_inline(alone);
}

namespace {

bool all_finished(const Issuer::Hazards& hazards) {
  return std::all_of(hazards.begin(), hazards.end(), [](const std::shared_ptr<Completion>& completion) {
    std::lock_guard lock(completion->mutex);
    return completion->finished;
  });
}

}  // namespace

void Issuer::issue(std::function<comm::Work()> issue, Pending pending, bool holdable, bool on_device,
                   std::function<Hazards()> find_hazards) {
  Spent spent;
  std::unique_lock lock(mutex_);
  issued_cv_.wait(lock, [this] { return !issuing_; });
  release_locked(spent);
  const Hazards hazards = find_hazards();
  if (on_device && (!deferred_.empty() || !all_finished(hazards))) {
    issuing_ = true;
    ++waiting_callers_;
    hold_cv_.notify_one();
    const bool clear =
        undeferred_cv_.wait_for(lock, timeout_, [&] { return deferred_.empty() && all_finished(hazards); });
    --waiting_callers_;
    issuing_ = false;
    issued_cv_.notify_all();
    if (!clear)
      refuse_locked(pending, std::make_exception_ptr(std::runtime_error(
                                 "braid: earlier calls on this group, deferred until the calls sharing memory with "
                                 "them had finished, were not issued within the group's timeout (" +
                                 std::to_string(timeout_.count()) + " ms), so this device call was not issued")));
  } else if (!deferred_.empty() || !all_finished(hazards)) {
    deferred_.push_back(Deferred{std::move(issue), std::move(pending), hazards});
    lock.unlock();
    hold_cv_.notify_one();
    return;
  }
  if (holdable && alone_.load(std::memory_order_relaxed) && !stopping_) {
    held_.emplace(Held{std::move(issue), std::move(pending), Clock::now() + kHoldTime});
    // A holding thread already timing an earlier call wakes by this one's
    // due time anyway: waking it for each call cost a thread switch per
    // synchronous call (a third of a small call's time on two cores).
    const bool wake = hold_thread_idle_;
    lock.unlock();
    if (wake) hold_cv_.notify_one();
    return;
  }
  // Not held: runs here or on the progress thread, as braid decides; its
  // refusal (bad arguments) reaches the caller, as before it was issued.
  if (std::exception_ptr error = issue_unlocked(lock, issue, pending)) refuse_locked(pending, error);
}

// A call refused in issue() throws to its caller, who gets no Work; it
// counts as finished for the calls that took it as a hazard.
void Issuer::refuse_locked(Pending& pending, std::exception_ptr error) {
  {
    std::lock_guard done(pending.completion->mutex);
    pending.completion->finished = true;
    pending.completion->error = error;
  }
  hold_cv_.notify_one();
  undeferred_cv_.notify_all();
  std::rethrow_exception(error);
}

void Issuer::run_here(const std::shared_ptr<Completion>& completion) {
  Spent spent;
  std::unique_lock lock(mutex_);
  if (!held_ || held_->pending.completion != completion) return;
  Held held = std::move(*held_);
  held_.reset();
  std::exception_ptr error = issue_unlocked(lock, held.issue, held.pending);
  spent.drop(std::move(held.issue));
  if (error) completer_.queue()->push_failed(std::move(held.pending), error);
}

// A call run in the caller's thread returns only once every peer has joined
// it: meanwhile other threads asking about their Works (is_completed, a
// wait with a timeout, get_future; torch holds the GIL through the first)
// must not wait for it, so the lock is let go. `issuing` holds later issues
// back until this call has reached braid and the completer, in order.
std::exception_ptr Issuer::issue_unlocked(std::unique_lock<std::mutex>& lock,
                                          const std::function<comm::Work()>& issue, Pending& pending) {
  issuing_ = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    pending.work = issue();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  issuing_ = false;
  if (!error) completer_.push(std::move(pending));
  issued_cv_.notify_all();
  if (waiting_callers_ != 0) undeferred_cv_.notify_all();
  return error;
}

void Issuer::release_held() {
  Spent spent;
  std::lock_guard lock(mutex_);
  release_locked(spent);
}

void Issuer::release(const std::shared_ptr<Completion>& completion) {
  Spent spent;
  std::lock_guard lock(mutex_);
  if (held_ && held_->pending.completion == completion) release_locked(spent);
}

void Issuer::release_locked(Spent& spent) {
  if (!held_) return;
  Held held = std::move(*held_);
  held_.reset();
  issue_off_thread(std::move(held.issue), std::move(held.pending), spent);
}

// On the progress thread: inline off for this one call. groups_mutex keeps
// set_alone (another group made or ended) from turning it back meanwhile.
void Issuer::issue_off_thread(std::function<comm::Work()> issue, Pending pending, Spent& spent) {
  std::exception_ptr error;
  try {
    std::lock_guard groups_lock(groups_mutex);
    comm_.set_inline(false);
    struct Restore {
      Issuer& issuer;
      ~Restore() { issuer.comm_.set_inline(issuer.alone_.load(std::memory_order_relaxed)); }
    } restore{*this};
    pending.work = issue();
  } catch (...) {
    error = std::current_exception();
  }
  spent.drop(std::move(issue));
  if (error)
    completer_.queue()->push_failed(std::move(pending), error);
  else
    completer_.push(std::move(pending));
}

bool Issuer::front_ready_locked() { return !deferred_.empty() && all_finished(deferred_.front().hazards); }

// Issues the deferred calls at the front whose hazards have finished (one
// that fails to issue is marked failed at once, and so counts as finished
// for the next).
void Issuer::issue_ready_locked(Spent& spent) {
  if (deferred_.empty()) return;
  while (front_ready_locked()) {
    Deferred call = std::move(deferred_.front());
    deferred_.pop_front();
    issue_off_thread(std::move(call.issue), std::move(call.pending), spent);
  }
  if (deferred_.empty()) undeferred_cv_.notify_all();
}

void Issuer::call_finished() {
  {
    std::lock_guard lock(mutex_);
    if (deferred_.empty() && waiting_callers_ == 0) return;
  }
  hold_cv_.notify_one();
  undeferred_cv_.notify_all();
}

bool Issuer::wait_undeferred(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  ++waiting_callers_;
  const bool clear = undeferred_cv_.wait_for(lock, limit, [this] { return deferred_.empty(); });
  --waiting_callers_;
  return clear;
}

void Issuer::hold_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    hold_thread_idle_ = true;
    hold_cv_.wait(lock, [this] { return (stopping_ && deferred_.empty()) || held_ || front_ready_locked(); });
    hold_thread_idle_ = false;
    Spent spent;
    issue_ready_locked(spent);
    if (stopping_) {
      release_locked(spent);
    } else if (held_) {
      if (Clock::now() >= held_->due)
        release_locked(spent);
      else if (spent.empty())
        hold_cv_.wait_until(lock, held_->due);  // then look again: it may be another call by now
    }
    if (!spent.empty()) {
      lock.unlock();
      spent.let_go();
      lock.lock();
    }
    if (stopping_ && deferred_.empty() && !held_) return;
  }
}

// A call that another thread is issuing (a wait() running the held call in
// its own thread, while its peers are late) must reach the completer before
// the group ends: the group's end freed the completer and the communicator
// under it, and that thread crashed (SIGSEGV) once its peers came. The
// wait is bounded by the call's own timeout; the deferred calls' by their
// hazards', issued calls that the completion threads still finish.
void Issuer::stop() {
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    issued_cv_.wait(lock, [this] { return !issuing_; });
  }
  hold_cv_.notify_one();
  undeferred_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void quiesce(std::chrono::milliseconds limit) {
  std::vector<std::shared_ptr<Issuer>> issuers;
  std::vector<std::shared_ptr<CompletionQueue>> queues;
  {
    std::lock_guard lock(groups_mutex);
    issuers = groups;
    for (const auto& group : groups) queues.push_back(group->completer().queue());
  }
  // So that the held call's callbacks, too, run before the end (a group
  // ended meanwhile has none: its Issuer stopped).
  for (const auto& issuer : issuers) issuer->release_held();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto left = [&] {
    return std::chrono::ceil<std::chrono::milliseconds>(
        std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero()));
  };
  for (const auto& issuer : issuers) issuer->wait_undeferred(left());
  for (const auto& queue : queues) queue->wait_quiet(left());
}

ProcessGroupBraid::ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), torch_store_(store) {
  runtime::Config config = group_config(timeout);
  Rendezvous found = rendezvous(*store, rank, size, config);
  store_server_ = std::move(found.server);
  comm_ = comm::Communicator::create_world(found.info, config);
  completer_ = std::make_unique<Completer>();
  issuer_ = std::make_shared<Issuer>(*comm_, *completer_, config.timeout);
  std::lock_guard lock(groups_mutex);
  groups.push_back(issuer_);
  inline_while_alone();
}


ProcessGroupBraid::~ProcessGroupBraid() {
  {
    std::lock_guard lock(groups_mutex);
    groups.erase(std::find(groups.begin(), groups.end(), issuer_));
    inline_while_alone();
  }
  // Joining the completion threads with the GIL held deadlocked with a
  // callback (a .then() of Python) waiting for it.
  GilLetGo let_go;
  issuer_->stop();  // issues the held call, if any, before the completer drains
  completer_.reset();
}

namespace {

// The host bytes from a tensor's first element to its last (none for a
// device tensor or an empty one: device calls keep their stream's order).
using Span = ProcessGroupBraid::Span;

void add_spans(std::vector<Span>& spans, const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_sparse()) {  // no storage of its own: its indices' and values'
      add_spans(spans, {t._indices(), t._values()});
      continue;
    }
    if (!t.defined() || t.is_cuda() || t.numel() == 0) continue;
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * std::abs(t.stride(d));
    const auto* begin = static_cast<const std::byte*>(t.data_ptr());
    spans.emplace_back(begin, begin + (last + 1) * t.element_size());
  }
}

bool meet(const std::vector<Span>& a, const std::vector<Span>& b) {
  for (const Span& x : a)
    for (const Span& y : b)
      if (x.first < y.second && y.first < x.second) return true;
  return false;
}

}  // namespace

Issuer::Hazards ProcessGroupBraid::enter_in_flight(InFlight call, bool copies_in) {
  Issuer::Hazards earlier;
  std::lock_guard lock(in_flight_mu_);
  std::erase_if(in_flight_, [](const InFlight& c) {
    std::lock_guard done(c.completion->mutex);
    return c.completion->finished;
  });
  for (const InFlight& c : in_flight_)
    if ((copies_in || c.copies_out) && meet(c.spans, call.spans)) earlier.push_back(c.completion);
  in_flight_.push_back(std::move(call));
  return earlier;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::enqueue(Call call) {
  std::vector<Span> touched;  // the host bytes of every tensor the call reads or writes
  add_spans(touched, call.outputs);
  add_spans(touched, call.keep_alive);
  auto completion = std::make_shared<Completion>();
  auto find_hazards = [this, in_flight = InFlight{completion, std::move(touched), static_cast<bool>(call.finish)},
                       copies_in = static_cast<bool>(call.copy_in)]() mutable {
    return enter_in_flight(std::move(in_flight), copies_in);
  };
  Pending pending;
  pending.finish = std::move(call.finish);
  pending.keep_alive = std::move(call.keep_alive);
  pending.outputs = std::move(call.outputs);
  pending.runs_as = std::move(call.runs_as);
  pending.future = make_future();
  pending.completion = completion;
  auto work = c10::make_intrusive<BraidWork>(getRank(), call.type, pending, completer_->queue(), issuer_);
  work->set_source_rank(call.source_rank);
  auto on_cuda = [](const std::vector<at::Tensor>& tensors) {
    return std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_cuda(); });
  };
  const bool on_device = on_cuda(pending.outputs) || on_cuda(pending.keep_alive);
  const bool holdable = !on_device && call.type != c10d::OpType::SEND && call.type != c10d::OpType::RECV;
  std::function<comm::Work()> issue = std::move(call.issue);
  if (call.copy_in)
    issue = [copy_in = std::move(call.copy_in), issue = std::move(issue)] {
      copy_in();
      return issue();
    };
  try {
    // A device call may wait there for deferred calls, whose callbacks take
    // the GIL (where the caller holds it).
    std::optional<GilLetGo> let_go;
    if (on_device) let_go.emplace();
    issuer_->issue(std::move(issue), std::move(pending), holdable, on_device, find_hazards);
  } catch (...) {  // refused before it reached braid: nothing to wait for
    std::lock_guard lock(in_flight_mu_);
    std::erase_if(in_flight_, [&](const InFlight& c) { return c.completion == completion; });
    throw;
  }
  return work;
}

namespace {

// Whether the one tensor of allreduce, broadcast or reduce is a view with
// gaps (every other column of a matrix), which they refused where gloo
// takes it (a review helper's case): it then runs through a flat copy,
// once refused where it overlaps itself (it is written back).
bool through_copy(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1 || tensors[0].layout() != at::kStrided || tensors[0].is_non_overlapping_and_dense())
    return false;
  check_strided(tensors[0], op, true);
  return true;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::through_flat_copy(
    c10d::OpType type, const std::vector<at::Tensor>& tensors, const char* op, bool reduces,
    const std::function<std::function<comm::Work()>(Buffer)>& run) {
  std::vector<at::Tensor> outputs = tensors;
  StagingPool::Lease flat = staging_.take(total_numel(tensors), tensors[0].options());
  Call call{type, run(reduces ? reducible(flat.tensor, op) : movable(flat.tensor, op)), outputs, {flat.tensor},
            then_reusable([flat = flat.tensor, outputs]() mutable { unflatten(flat, outputs); }, flat.reusable)};
  call.copies_in([flat = flat.tensor, tensors] { flatten_into(flat, tensors); }, {});  // they are its outputs
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  if (through_copy(tensors, "broadcast")) {
    const int root = static_cast<int>(opts.rootRank);
    return through_flat_copy(c10d::OpType::BROADCAST, tensors, "broadcast", false, [this, root](Buffer b) {
      return std::function<comm::Work()>(
          [this, b, root] { return comm_->broadcast(b.data, b.data, b.count, b.dtype, root); });
    });
  }
  at::Tensor& tensor = single_tensor(tensors, "broadcast");
  Buffer buffer = movable(tensor, "broadcast");
  int root = static_cast<int>(opts.rootRank);
  return enqueue({c10d::OpType::BROADCAST,
                  [this, buffer, root] { return comm_->broadcast(buffer.data, buffer.data, buffer.count, buffer.dtype, root); },
                  {tensor}, {}, {}});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return allreduce_sparse(tensors[0], opts);
  if (through_copy(tensors, "allreduce")) {
    const ReduceOp op = reduce_op(opts.reduceOp, "allreduce");
    return through_flat_copy(c10d::OpType::ALLREDUCE, tensors, "allreduce", true, [this, op](Buffer b) {
      return std::function<comm::Work()>(
          [this, b, op] { return comm_->all_reduce(b.data, b.data, b.count, b.dtype, op); });
    });
  }
  at::Tensor& tensor = single_tensor(tensors, "allreduce");
  Buffer buffer = reducible(tensor, "allreduce");
  ReduceOp op = reduce_op(opts.reduceOp, "allreduce");
  return enqueue({c10d::OpType::ALLREDUCE,
                  [this, buffer, op] { return comm_->all_reduce(buffer.data, buffer.data, buffer.count, buffer.dtype, op); },
                  {tensor}, {}, {}});
}

// A sparse (COO) tensor, summed as gloo sums one: each rank's coalesced
// indices and values are all_gathered (padded to the most any rank holds,
// after an all_gather of the counts; a padded value is 0 at index 0, which
// adds nothing) and every rank coalesces them all into the tensor, in place
// (DDP over nn.Embedding(sparse=True) reduces its gradients so; they were
// refused; helper-134's finding 1).
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_sparse(at::Tensor& tensor,
                                                                   const c10d::AllreduceOptions& opts) {
  if (opts.reduceOp != c10d::ReduceOp::SUM) refuse("allreduce", "a sparse tensor is reduced by sum only (as gloo's)");
  if (!tensor.is_cpu()) refuse("allreduce", "a sparse tensor must be on the CPU (as gloo's)");
  const at::Tensor input = tensor.coalesce();
  movable(input._values(), "allreduce");  // refuses a dtype braid does not move
  struct Gathered {
    std::vector<std::int64_t> counts;
    at::Tensor indices, values, sent_indices, sent_values;
  };
  auto gathered = std::make_shared<Gathered>();
  Call call{c10d::OpType::ALLREDUCE, {}, {tensor}, {input}, {},
            "braid: a sparse allreduce runs as all_gathers of every rank's indices and values"};
  call.issue = [this, input, gathered] {
    const int size = getSize();
    std::int64_t nnz = input._nnz();
    gathered->counts.assign(static_cast<std::size_t>(size), 0);
    comm_->all_gather(&nnz, gathered->counts.data(), 1, DataType::i64).wait();
    const std::int64_t most = *std::max_element(gathered->counts.begin(), gathered->counts.end());
    at::Tensor indices = at::zeros({input.sparse_dim(), most}, input._indices().options());
    indices.narrow(1, 0, nnz).copy_(input._indices());
    std::vector<std::int64_t> value_sizes = input._values().sizes().vec();
    value_sizes[0] = most;
    at::Tensor values = at::zeros(value_sizes, input._values().options());
    values.narrow(0, 0, nnz).copy_(input._values());
    gathered->sent_indices = indices;
    gathered->sent_values = values;
    gathered->indices = at::empty({size, input.sparse_dim(), most}, indices.options());
    value_sizes.insert(value_sizes.begin(), size);
    gathered->values = at::empty(value_sizes, values.options());
    const Buffer send_indices = movable(indices, "allreduce"), send_values = movable(values, "allreduce");
    comm_->all_gather(send_indices.data, gathered->indices.data_ptr(), send_indices.count, send_indices.dtype);
    return comm_->all_gather(send_values.data, gathered->values.data_ptr(), send_values.count, send_values.dtype);
  };
  call.finish = [tensor, gathered, sizes = input.sizes().vec()]() mutable {
    std::vector<at::Tensor> indices, values;
    for (std::size_t r = 0; r < gathered->counts.size(); ++r) {
      indices.push_back(gathered->indices[static_cast<std::int64_t>(r)].narrow(1, 0, gathered->counts[r]));
      values.push_back(gathered->values[static_cast<std::int64_t>(r)].narrow(0, 0, gathered->counts[r]));
    }
    tensor.copy_(at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), sizes).coalesce());
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) refuse("allreduce_coalesced", "no tensors");
  // Through a flat copy (or in place where they form one block): views with
  // gaps are fine, as gloo takes them; one that overlaps itself is not.
  for (const auto& tensor : tensors) {
    check_strided(tensor, "allreduce_coalesced", true);
    if (tensor.scalar_type() != tensors[0].scalar_type() || tensor.device() != tensors[0].device())
      refuse("allreduce_coalesced", "every tensor must have the first one's dtype and device");
  }
  ReduceOp op = reduce_op(opts.reduceOp, "allreduce_coalesced");
  auto all_reduce = [this, op](Buffer buffer) {
    return [this, buffer, op] { return comm_->all_reduce(buffer.data, buffer.data, buffer.count, buffer.dtype, op); };
  };
  if (at::Tensor block = one_block(tensors); block.defined())
    return enqueue({c10d::OpType::ALLREDUCE_COALESCED, all_reduce(reducible(block, "allreduce_coalesced")), tensors,
                    {block}, {}});
  return through_flat_copy(c10d::OpType::ALLREDUCE_COALESCED, tensors, "allreduce_coalesced", true, all_reduce);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  if (through_copy(tensors, "reduce")) {
    const ReduceOp op = reduce_op(opts.reduceOp, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    return through_flat_copy(c10d::OpType::REDUCE, tensors, "reduce", true, [this, op, root](Buffer b) {
      return std::function<comm::Work()>(
          [this, b, op, root] { return comm_->reduce(b.data, b.data, b.count, b.dtype, op, root); });
    });
  }
  at::Tensor& tensor = single_tensor(tensors, "reduce");
  Buffer buffer = reducible(tensor, "reduce");
  ReduceOp op = reduce_op(opts.reduceOp, "reduce");
  int root = static_cast<int>(opts.rootRank);
  return enqueue({c10d::OpType::REDUCE,
                  [this, buffer, op, root] {
                    return comm_->reduce(buffer.data, buffer.data, buffer.count, buffer.dtype, op, root);
                  },
                  {tensor}, {}, {}});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  at::Tensor& input = single_tensor(inputs, "allgather");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
    refuse("allgather", "needs one list of " + std::to_string(getSize()) + " output tensors");
  check_same(outputs[0], input, "allgather", true);
  return gather_list(c10d::OpType::ALLGATHER, "allgather", input, outputs[0], {});
}

// The parts of a list all_gather on the host that braid can write one by
// one (Communicator::all_gather's list form): each contiguous, none sharing
// a byte with another or with the input, unless it is the input itself
// (this rank's part, in place). Empty where the list goes through staging
// (tensors on a GPU, views with gaps, overlaps).
std::vector<void*> separate_parts(const std::vector<at::Tensor>& results, const at::Tensor& input, int rank) {
  std::vector<void*> parts;
  if (input.is_cuda() || input.numel() == 0) return {};
  for (std::size_t r = 0; r < results.size(); ++r) {
    const at::Tensor& part = results[r];
    if (part.is_cuda() || !part.is_contiguous() || part.nbytes() != input.nbytes()) return {};
    const bool in_place = static_cast<int>(r) == rank && part.data_ptr() == input.data_ptr();
    if (!in_place && overlap(part, input)) return {};
    for (std::size_t k = 0; k < r; ++k)
      if (overlap(part, results[k])) return {};
    parts.push_back(part.data_ptr());
  }
  return parts;
}

// allgather's and gather's shared part: an all_gather of `input` into
// `results` (a gather's non-root passes none), through the results' own
// block where they form one apart from the input, or in place (the input
// is this rank's part of it), else into each result where they are
// separate host tensors (separate_parts), else through a staging block.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather_list(c10d::OpType type, const char* op,
                                                              const at::Tensor& input, std::vector<at::Tensor> results,
                                                              std::string runs_as) {
  // Sent from a contiguous copy (in the order unflatten reads it back)
  // where it is not.
  const at::Tensor sent = input.is_contiguous() ? input : at::empty(input.sizes(), input.options());
  auto enqueue_with_copy = [&](Call call) {
    if (!sent.is_same(input)) call.copies_in([sent, input] { sent.copy_(input); }, {input});
    return enqueue(std::move(call));
  };
  Buffer send = movable(sent, op);
  auto all_gather = [this, send](Buffer recv) {
    return [this, send, recv] { return comm_->all_gather(send.data, recv.data, send.count, send.dtype); };
  };
  if (at::Tensor block = one_block(results);
      block.defined() && (!overlap(sent, block) || sent.data_ptr() == results[getRank()].data_ptr()))
    return enqueue_with_copy({type, all_gather(movable(block, op)), results, {sent, block}, {}, std::move(runs_as)});
  if (std::vector<void*> parts = separate_parts(results, sent, getRank()); !parts.empty())
    return enqueue_with_copy({type, [this, send, parts] { return comm_->all_gather(send.data, parts, send.count, send.dtype); },
                    results, {sent}, {}, std::move(runs_as)});
  StagingPool::Lease flat = staging_.take(getSize() * input.numel(), input.options());
  int64_t count = input.numel();
  return enqueue_with_copy({type, all_gather(movable(flat.tensor, op)), results, {sent, flat.tensor},
                  then_reusable([flat = flat.tensor, results, count]() mutable { unflatten(flat, results, count); },
                                flat.reusable),
                  std::move(runs_as)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  check_contiguous(input, "_allgather_base");
  check_contiguous(output, "_allgather_base");
  if (output.scalar_type() != input.scalar_type() || output.numel() != getSize() * input.numel())
    refuse("_allgather_base", "the output must have the input's dtype and " + std::to_string(getSize()) +
                                  " times its elements");
  // An input that shares memory with the output, but not as braid's
  // in-place form (the input at this rank's part of the output), is read
  // from a copy, as alltoall_base's is: the form is each rank's own, so
  // braid's refusal came on some ranks only, and the others waited in the
  // call until the group's timeout (a review helper's case).
  const auto* own_part = static_cast<const std::byte*>(output.data_ptr()) + getRank() * input.nbytes();
  const bool copied = overlap(input, output) && input.data_ptr() != own_part;
  const at::Tensor from = copied ? at::empty_like(input, at::MemoryFormat::Contiguous) : input;
  Buffer send = movable(from, "_allgather_base");
  Buffer recv = movable(output, "_allgather_base");
  Call call{c10d::OpType::_ALLGATHER_BASE,
            [this, send, recv] { return comm_->all_gather(send.data, recv.data, send.count, send.dtype); },
            {output}, {from}, {}};
  if (copied) call.copies_in([from, input] { from.copy_(input); }, {input});
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  at::Tensor& input = single_tensor(inputs, "gather");
  // It runs as an all_gather, which has no root: one out of range gathered
  // nowhere, without a word.
  if (opts.rootRank < 0 || opts.rootRank >= getSize())
    refuse("gather", "root " + std::to_string(opts.rootRank) + " is out of range for a group of " +
                         std::to_string(getSize()));
  const bool root = getRank() == opts.rootRank;
  if (root && (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize())))
    refuse("gather", "the root needs one list of " + std::to_string(getSize()) + " output tensors");
  if (!root && !(outputs.empty() || (outputs.size() == 1 && outputs[0].empty())))
    refuse("gather", "only the root passes output tensors");
  std::vector<at::Tensor> results = root ? outputs[0] : std::vector<at::Tensor>{};
  check_same(results, input, "gather", true);
  if (by_messages(input)) return gather_by_messages(input, std::move(results), static_cast<int>(opts.rootRank));
  return gather_list(c10d::OpType::GATHER, "gather", input, std::move(results),
                     "braid: gather runs as an all_gather of every rank's tensor (count: its elements)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  at::Tensor& output = single_tensor(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  if (is_root && (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize())))
    refuse("scatter", "the root needs one list of " + std::to_string(getSize()) + " input tensors");
  if (!is_root && !(inputs.empty() || (inputs.size() == 1 && inputs[0].empty())))
    refuse("scatter", "only the root passes input tensors");
  if (is_root) check_same(inputs[0], output, "scatter");
  if (by_messages(output))
    return scatter_by_messages(output, is_root ? inputs[0] : std::vector<at::Tensor>{}, root);
  // Below that size the root broadcasts its inputs' own block where they form one (a
  // root's buffer is only read).
  at::Tensor block = is_root ? one_block(inputs[0]) : at::Tensor();
  StagingPool::Lease staged;
  if (!block.defined()) staged = staging_.take(getSize() * output.numel(), output.options());
  at::Tensor flat = block.defined() ? block : staged.tensor;
  Buffer whole = movable(flat, "scatter");
  at::Tensor mine = flat.narrow(0, getRank() * output.numel(), output.numel());
  std::function<void()> finish = [output, mine]() mutable { output.copy_(mine.view(output.sizes())); };
  if (staged.reusable) finish = then_reusable(std::move(finish), staged.reusable);
  Call call{c10d::OpType::SCATTER,
            [this, whole, root] { return comm_->broadcast(whole.data, whole.data, whole.count, whole.dtype, root); },
            {output}, {flat}, finish,
            "braid: scatter runs as a broadcast of the root's whole list (count: the world size times each "
            "tensor's elements)"};
  if (is_root && !block.defined()) call.copies_in([flat, list = inputs[0]] { flatten_into(flat, list); }, inputs[0]);
  return enqueue(std::move(call));
}

// From this many bytes per rank on, a gather or scatter of host tensors
// goes as messages between the root and each rank, as NCCL's do; below it,
// as an all_gather or a broadcast of the whole list, which one host's shared
// slots run faster. Those hold the world size's tensors on every rank: on 3
// ranks of 128 MiB each, each non-root's peak grew by 385 MiB where gloo's
// did not grow (helper-134's finding 2). The same choice on every rank: it
// reads only the tensor each rank passes alike (gather's input, scatter's
// output).
constexpr std::size_t kByMessagesBytes = std::size_t{256} << 10;

bool ProcessGroupBraid::by_messages(const at::Tensor& tensor) {
  return tensor.is_cpu() && tensor.nbytes() >= kByMessagesBytes && getSize() > 1;
}

// Each non-root sends its input to the root, which receives every peer's
// straight into its result (through one flat staging tensor where the
// results are not all contiguous) and copies its own.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather_by_messages(const at::Tensor& input,
                                                                     std::vector<at::Tensor> results, int root) {
  const at::Tensor sent = input.is_contiguous() ? input : at::empty(input.sizes(), input.options());
  const Buffer send = movable(sent, "gather");
  const std::size_t bytes = sent.nbytes();
  const std::string runs_as = "braid: gather runs as messages from each rank to the root (count: its elements)";
  Call call{c10d::OpType::GATHER, {}, results, {sent}, {}, runs_as};
  if (getRank() != root) {
    call.issue = [this, send, root] { return comm_->send(send.data, send.count, send.dtype, root); };
  } else {
    bool direct = true;
    for (const at::Tensor& r : results) direct = direct && r.is_cpu() && r.is_contiguous() && !overlap(r, sent);
    std::vector<std::byte*> into(results.size());
    if (direct) {
      for (std::size_t p = 0; p < results.size(); ++p) into[p] = static_cast<std::byte*>(results[p].data_ptr());
    } else {
      StagingPool::Lease flat = staging_.take(getSize() * input.numel(), input.options());
      for (std::size_t p = 0; p < results.size(); ++p) into[p] = static_cast<std::byte*>(flat.tensor.data_ptr()) + p * bytes;
      call.keep_alive.push_back(flat.tensor);
      call.finish = then_reusable([flat = flat.tensor, results, count = input.numel()]() mutable {
        unflatten(flat, results, count);
      }, flat.reusable);
    }
    call.issue = [this, send, into, bytes, root] {
      std::memmove(into[root], send.data, bytes);
      comm::Work last;
      for (int p = 0; p < getSize(); ++p)
        if (p != root) last = comm_->recv(into[p], send.count, send.dtype, p);
      return last;
    };
  }
  if (!sent.is_same(input)) call.copies_in([sent, input] { sent.copy_(input); }, {input});
  return enqueue(std::move(call));
}

// The root sends each rank its part (from one flat staging copy where the
// parts are not all contiguous) and copies its own; each other rank
// receives straight into its output where it is contiguous.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::scatter_by_messages(const at::Tensor& output,
                                                                      std::vector<at::Tensor> parts, int root) {
  const at::Tensor into = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
  const Buffer received = movable(into, "scatter");
  const std::size_t bytes = into.nbytes();
  const std::string runs_as = "braid: scatter runs as messages from the root to each rank (count: its elements)";
  Call call{c10d::OpType::SCATTER, {}, {output}, {into}, {}, runs_as};
  if (!into.is_same(output)) call.finish = [output, into]() mutable { output.copy_(into); };
  if (getRank() != root) {
    call.issue = [this, received, root] { return comm_->recv(received.data, received.count, received.dtype, root); };
    return enqueue(std::move(call));
  }
  bool direct = true;
  for (const at::Tensor& part : parts) direct = direct && part.is_cpu() && part.is_contiguous();
  std::vector<const std::byte*> from(parts.size());
  if (direct) {
    for (std::size_t p = 0; p < parts.size(); ++p) from[p] = static_cast<const std::byte*>(parts[p].data_ptr());
    call.keep_alive.insert(call.keep_alive.end(), parts.begin(), parts.end());
  } else {
    StagingPool::Lease flat = staging_.take(getSize() * output.numel(), output.options());
    for (std::size_t p = 0; p < parts.size(); ++p)
      from[p] = static_cast<const std::byte*>(flat.tensor.data_ptr()) + p * bytes;
    call.copies_in([flat = flat.tensor, parts] { flatten_into(flat, parts); }, parts);
    call.keep_alive.push_back(flat.tensor);
    call.finish = then_reusable(call.finish ? call.finish : [] {}, flat.reusable);
  }
  call.issue = [this, received, from, bytes, root] {
    std::memmove(received.data, from[root], bytes);
    comm::Work last;
    for (int p = 0; p < getSize(); ++p)
      if (p != root) last = comm_->send(from[p], received.count, received.dtype, p);
    return last;
  };
  return enqueue(std::move(call));
}

// The inputs of a list reduce_scatter on the host that braid can read one
// by one (Communicator::reduce_scatter's list form): each contiguous, none
// sharing a byte with the output unless it is the output itself (this
// rank's input, in place). Inputs may share bytes with one another: they
// are only read. Empty where the list goes through staging (tensors on a
// GPU, views with gaps, an input over the output).
std::vector<const void*> separate_inputs(const std::vector<at::Tensor>& inputs, const at::Tensor& output, int rank) {
  std::vector<const void*> parts;
  if (output.is_cuda() || output.numel() == 0) return {};
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    const at::Tensor& part = inputs[r];
    if (part.is_cuda() || !part.is_contiguous() || part.nbytes() != output.nbytes()) return {};
    const bool in_place = static_cast<int>(r) == rank && part.data_ptr() == output.data_ptr();
    if (!in_place && overlap(part, output)) return {};
    parts.push_back(part.data_ptr());
  }
  return parts;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  at::Tensor& output = single_tensor(outputs, "reduce_scatter");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
    refuse("reduce_scatter", "needs one list of " + std::to_string(getSize()) + " input tensors");
  check_same(inputs[0], output, "reduce_scatter");
  // The result arrives in the inputs' logical order: an output in another
  // memory format gets it through a contiguous copy.
  at::Tensor got = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
  // The inputs' own block is read in place where the output lies apart from
  // it (in place, braid's ring would leave partial sums in the other ranks'
  // parts, which are the caller's inputs).
  at::Tensor block = one_block(inputs[0]);
  if (block.defined() && overlap(got, block)) block = at::Tensor();
  ReduceOp op = reduce_op(opts.reduceOp, "reduce_scatter");
  // Else each input is read where it is, when they are separate host tensors.
  if (std::vector<const void*> parts = block.defined() ? std::vector<const void*>{} : separate_inputs(inputs[0], got, getRank());
      !parts.empty()) {
    Buffer recv = reducible(got, "reduce_scatter");
    std::function<void()> finish;
    if (!got.is_same(output)) finish = [output, got]() mutable { output.copy_(got); };
    std::vector<at::Tensor> kept = inputs[0];
    kept.push_back(got);
    return enqueue({c10d::OpType::REDUCE_SCATTER,
                    [this, parts, recv, op] { return comm_->reduce_scatter(parts, recv.data, recv.count, recv.dtype, op); },
                    {output}, std::move(kept), finish});
  }
  StagingPool::Lease staged;
  if (!block.defined()) staged = staging_.take(getSize() * output.numel(), output.options());
  at::Tensor flat = block.defined() ? block : staged.tensor;
  Buffer send = reducible(flat, "reduce_scatter");
  Buffer recv = reducible(got, "reduce_scatter");
  std::function<void()> finish;
  if (!got.is_same(output)) finish = [output, got]() mutable { output.copy_(got); };
  if (staged.reusable) finish = then_reusable(std::move(finish), staged.reusable);
  Call call{c10d::OpType::REDUCE_SCATTER,
            [this, send, recv, op] { return comm_->reduce_scatter(send.data, recv.data, recv.count, recv.dtype, op); },
            {output}, {flat, got}, finish};
  if (!block.defined()) call.copies_in([flat, list = inputs[0]] { flatten_into(flat, list); }, inputs[0]);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  check_contiguous(input, "_reduce_scatter_base");
  check_contiguous(output, "_reduce_scatter_base");
  if (output.scalar_type() != input.scalar_type() || input.numel() != getSize() * output.numel())
    refuse("_reduce_scatter_base", "the input must have the output's dtype and " + std::to_string(getSize()) +
                                       " times its elements");
  // As in _allgather_base: an overlap other than braid's in-place forms
  // (the output at this rank's part of the input, or at its start) is
  // read from a copy of the input.
  const auto* own_part = static_cast<const std::byte*>(input.data_ptr()) + getRank() * output.nbytes();
  const bool copied =
      overlap(input, output) && output.data_ptr() != own_part && output.data_ptr() != input.data_ptr();
  const at::Tensor from = copied ? at::empty_like(input, at::MemoryFormat::Contiguous) : input;
  Buffer send = reducible(from, "_reduce_scatter_base");
  Buffer recv = reducible(output, "_reduce_scatter_base");
  ReduceOp op = reduce_op(opts.reduceOp, "_reduce_scatter_base");
  Call call{c10d::OpType::_REDUCE_SCATTER_BASE,
            [this, send, recv, op] { return comm_->reduce_scatter(send.data, recv.data, recv.count, recv.dtype, op); },
            {output}, {from}, {}};
  if (copied) call.copies_in([from, input] { from.copy_(input); }, {input});
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_split_sizes,
                                                                std::vector<int64_t>& input_split_sizes,
                                                                const c10d::AllToAllOptions& opts) {
  check_contiguous(input, "alltoall_base");
  check_contiguous(output, "alltoall_base");
  if (output.scalar_type() != input.scalar_type()) refuse("alltoall_base", "input and output dtypes differ");
  if (!output_split_sizes.empty() || !input_split_sizes.empty())
    return alltoall_unequal(output, input, output_split_sizes, input_split_sizes);
  if (output.numel() != input.numel()) refuse("alltoall_base", "input and output element counts differ");
  // An input that shares memory with the output, but is not it (braid's
  // in-place form), is read from a copy, as the unequal splits' is (braid
  // refused the call in its own API's terms).
  const bool copied = overlap(input, output) && input.data_ptr() != output.data_ptr();
  const at::Tensor from = copied ? at::empty_like(input, at::MemoryFormat::Contiguous) : input;
  Buffer send = per_rank(movable(from, "alltoall_base"), getSize(), "alltoall_base");
  Buffer recv = movable(output, "alltoall_base");
  Call call{c10d::OpType::ALLTOALL_BASE,
            [this, send, recv] { return comm_->all_to_all(send.data, recv.data, send.count, send.dtype); },
            {output}, {from}, {}};
  if (copied) call.copies_in([from, input] { from.copy_(input); }, {input});
  return enqueue(std::move(call));
}

// Unequal parts travel as point-to-point messages, as NCCL's all-to-allv:
// the part for every peer sent to it and the part from every peer received
// into its place in the output, all queued at once (the engine runs sends
// and receives queued back to back together) and this rank's own part
// copied. Each message is checked against its receive's count, so split
// sizes that disagree across ranks fail the call on the receiving rank,
// naming both counts. (It was one all-to-all of equal slots sized by a
// blocking all-reduce: the extra rows of a disagreeing split were cut or
// padded with zeros, silently, and an async call blocked its caller.)
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall_unequal(at::Tensor& output, at::Tensor& input,
                                                                   const std::vector<int64_t>& output_splits,
                                                                   const std::vector<int64_t>& input_splits) {
  const int size = getSize(), me = getRank();
  const std::vector<int64_t> sends = element_splits(input, input_splits, size);
  const std::vector<int64_t> recvs = element_splits(output, output_splits, size);
  if (sends[me] != recvs[me])
    refuse("alltoall_base", "this rank sends itself " + std::to_string(sends[me]) + " elements but expects " +
                                std::to_string(recvs[me]) + " from itself");
  // The messages leave from and land in host tensors: an input that shares
  // memory with the output is copied first (the parts land while others
  // are still to be sent), and device tensors go through host copies
  // (device sends and receives run one at a time, and a large send waits
  // for its receive: the exchange would wait on itself).
  const bool device = !input.is_cpu() || !output.is_cpu();
  const auto* in_begin = static_cast<const std::byte*>(input.data_ptr());
  const auto* out_begin = static_cast<const std::byte*>(output.data_ptr());
  const bool shared = input.nbytes() && output.nbytes() && in_begin < out_begin + output.nbytes() &&
                      out_begin < in_begin + input.nbytes();
  at::Tensor from = device ? input.cpu() : shared ? at::empty_like(input) : input;
  at::Tensor into = device ? at::empty(output.sizes(), output.options().device(at::kCPU)) : output;
  // Counts as movable() gives them: elements of braid's dtype, or bytes.
  const Buffer whole = movable(from, "alltoall_base");
  const auto element = static_cast<std::size_t>(from.element_size());
  const std::size_t units = whole.dtype == DataType::u8 ? element : 1;
  auto* in = static_cast<const std::byte*>(from.data_ptr());
  auto* out = static_cast<std::byte*>(into.data_ptr());
  std::vector<Part> parts(static_cast<std::size_t>(size));
  std::size_t at_in = 0, at_out = 0;  // elements
  for (int p = 0; p < size; ++p) {
    const auto send = static_cast<std::size_t>(sends[p]), recv = static_cast<std::size_t>(recvs[p]);
    parts[p] = {in + at_in * element, out + at_out * element, send * units, recv * units};
    at_in += send;
    at_out += recv;
  }
  std::function<void()> finish;
  if (device) finish = [output, into]() mutable { output.copy_(into); };
  const std::size_t unit_bytes = element / units;
  Call call{c10d::OpType::ALLTOALL_BASE, exchange(parts, whole.dtype), {output}, {from, into}, finish, kRunsAsExchange};
  call.copies_in(
      [from, input, shared, own = parts[me], unit_bytes] {
        if (shared) from.copy_(input);
        copy_own(own, unit_bytes);
      },
      shared ? std::vector<at::Tensor>{input} : std::vector<at::Tensor>{});
  return enqueue(std::move(call));
}

// The point-to-point form of an all_to_all (this rank's own part is
// copied by copy_own, as the call is issued): at step k a send to the rank
// k ahead and a receive from the rank k behind, so that every pair's calls
// meet at once (calls complete in issue order: once the last is done, all
// are).
std::function<comm::Work()> ProcessGroupBraid::exchange(std::vector<Part> parts, DataType dtype) {
  return [this, parts = std::move(parts), dtype] {
    const int size = getSize(), me = getRank();
    if (size == 1) return comm_->barrier();
    comm::Work last;
    for (int step = 1; step < size; ++step) {
      const int peer_to = (me + step) % size, peer_from = (me - step + size) % size;
      comm_->send(parts[peer_to].from, parts[peer_to].send_count, dtype, peer_to);
      last = comm_->recv(parts[peer_from].into, parts[peer_from].recv_count, dtype, peer_from);
    }
    return last;
  };
}

// all_to_all of lists (torch's dist.all_to_all, which gloo lacks): input
// p goes to rank p, and what rank p sends lands in output p; the tensors
// may differ in size from peer to peer. Host tensors, contiguous, are sent
// from and received into where they lie; others through copies: a tensor
// on a GPU or not contiguous, and an input sharing memory with an output
// (parts land while others are still to be sent).
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  const int size = getSize(), me = getRank();
  if (outputs.size() != static_cast<std::size_t>(size) || inputs.size() != static_cast<std::size_t>(size))
    refuse("alltoall", "needs one output and one input tensor per rank (" + std::to_string(size) + " each), got " +
                           std::to_string(outputs.size()) + " outputs and " + std::to_string(inputs.size()) +
                           " inputs");
  for (const auto* list : {&inputs, &outputs})
    for (const at::Tensor& t : *list) {
      check_strided(t, "alltoall", list == &outputs);
      if (t.scalar_type() != inputs[0].scalar_type())
        refuse("alltoall", "every tensor must have one dtype; " + std::string(c10::toString(t.scalar_type())) +
                               " beside " + c10::toString(inputs[0].scalar_type()));
    }
  for (int p = 0; p < size; ++p)
    for (int q = 0; q < p; ++q)
      if (overlap(outputs[p], outputs[q]))
        refuse("alltoall", "output tensors " + std::to_string(q) + " and " + std::to_string(p) +
                               " share memory; each rank's part needs a tensor of its own");
  if (inputs[me].numel() != outputs[me].numel())
    refuse("alltoall", "this rank sends itself " + std::to_string(inputs[me].numel()) + " elements but expects " +
                           std::to_string(outputs[me].numel()) + " from itself");
  std::vector<at::Tensor> from(size), into(size), kept;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_in;  // (host copy, input), made as the call is issued
  std::vector<Part> parts(static_cast<std::size_t>(size));
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (output, the host tensor it arrives in)
  for (int p = 0; p < size; ++p) {
    const at::Tensor& in = inputs[p];
    const bool shares = std::any_of(outputs.begin(), outputs.end(), [&](const at::Tensor& o) { return overlap(in, o); });
    if (!in.is_cpu()) {
      from[p] = in.cpu().contiguous();
    } else if (shares || !in.is_contiguous()) {
      from[p] = at::empty(in.sizes(), in.options());
      copy_in.emplace_back(from[p], in);
    } else {
      from[p] = in;
    }
    const at::Tensor& out = outputs[p];
    into[p] = out.is_cpu() && out.is_contiguous() ? out : at::empty(out.sizes(), out.options().device(at::kCPU));
    if (!into[p].is_same(out)) copy_back.emplace_back(out, into[p]);
    parts[p] = {static_cast<const std::byte*>(from[p].data_ptr()), static_cast<std::byte*>(into[p].data_ptr()),
                movable(from[p], "alltoall").count, movable(into[p], "alltoall").count};
  }
  const Buffer unit = movable(from[0], "alltoall");
  const std::size_t unit_bytes = unit.dtype == DataType::u8 ? 1 : static_cast<std::size_t>(from[0].element_size());
  kept = from;
  kept.insert(kept.end(), into.begin(), into.end());
  std::function<void()> finish;
  if (!copy_back.empty())
    finish = [copy_back]() mutable {
      for (auto& [output, arrived] : copy_back) output.copy_(arrived);
    };
  std::vector<at::Tensor> read;
  for (const auto& [copy, input] : copy_in) read.push_back(input);
  Call call{c10d::OpType::ALLTOALL, exchange(parts, unit.dtype), outputs, std::move(kept), finish, kRunsAsExchange};
  call.copies_in(
      [copy_in, own = parts[me], unit_bytes] {
        for (const auto& [copy, input] : copy_in) copy.copy_(input);
        copy_own(own, unit_bytes);
      },
      read);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  at::Tensor& tensor = single_tensor(tensors, "send");
  if (tag != 0)
    refuse("send", "tag " + std::to_string(tag) +
                       " is not supported: braid matches messages between two ranks by their order; use tag 0");
  check_format_contiguous(tensor, "send");
  Buffer buffer = movable(tensor, "send");
  return enqueue({c10d::OpType::SEND,
                  [this, buffer, dst_rank] { return comm_->send(buffer.data, buffer.count, buffer.dtype, dst_rank); },
                  {tensor}, {}, {}});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  at::Tensor& tensor = single_tensor(tensors, "recv");
  if (tag != 0)
    refuse("recv", "tag " + std::to_string(tag) +
                       " is not supported: braid matches messages between two ranks by their order; use tag 0");
  check_format_contiguous(tensor, "recv");
  Buffer buffer = movable(tensor, "recv");
  return enqueue({c10d::OpType::RECV,
                  [this, buffer, src_rank] { return comm_->recv(buffer.data, buffer.count, buffer.dtype, src_rank); },
                  {tensor}, {}, {}, {}, src_rank});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::barrier(const c10d::BarrierOptions& opts) {
  return enqueue({c10d::OpType::BARRIER, [this] { return comm_->barrier(); }, {}, {}, {}});
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupBraid>(store, rank, size, timeout);
}

}  // namespace braid::torch_backend
