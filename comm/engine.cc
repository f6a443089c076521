// The engine: runs a communicator's operations one at a time, in issue order
// (except that sends and receives queued back to back run together, so that
// the two halves of an exchange never wait for each other: engine_p2p.cc).
//
// Small operations run in the caller's thread when nothing is queued or
// running (a thread hand-off would cost more than the operation), unless
// Communicator::set_inline turned that off; others go
// to a progress thread started on first use, so the caller can compute while
// they run. The thread sleeps on a condition variable when idle. An error
// aborts the communicator: the reason goes to the store for the peers, the
// transports are shut down so peers blocked on this rank fail fast, and every
// queued or later operation fails with AbortedError naming the first error.
//
// Before an algorithm runs, every rank must be known to have called the same
// operation with the same arguments: the algorithm's own schedule proves it
// (Algorithm::agrees) or agree_signatures runs first, so a mismatch fails
// every rank before any user buffer is written.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator_impl.h"
#include "runtime/errors.h"
#include "runtime/topology.h"

namespace braid::comm {
namespace {

// A peer's reason may blame this very rank ("rank 3 did not answer RDMA",
// relayed by a peer's farewell or the status board), which read oddly
// where rank 3 printed it, alive: say what it means there.
std::string blamed_note(const std::string& text, int rank) {
  const std::string me = "rank " + std::to_string(rank);
  for (const char* blame : {" did not answer RDMA", " exited, crashed, hung or became unreachable"})
    if (text.find(": " + me + blame) != std::string::npos)
      return " (" + me + ", this rank, still runs: the network path between the two lost its packets, or a "
             "port on it went down)";
  return "";
}

// "all_reduce #4" of a mismatch text "mismatched collectives: rank 0
// called all_reduce #4 (...) but ..." (or "runs"); `rank` -1 takes any rank.
std::optional<std::string> mismatch_call(std::string_view text, int rank) {
  const std::string_view mismatch = "mismatched collectives: rank ";
  auto at = text.find(mismatch);
  if (at == std::string_view::npos) return std::nullopt;
  at += mismatch.size();
  if (rank >= 0 && !text.substr(at).starts_with(std::to_string(rank) + " ")) return std::nullopt;
  const auto from = text.find(' ', at) + 1;  // past the rank's number
  const auto verb = text.substr(from);
  const std::size_t start = from + (verb.starts_with("called ") ? 7 : verb.starts_with("runs ") ? 5 : 0);
  if (start == from) return std::nullopt;
  const auto hash = text.find('#', start);
  if (hash == std::string_view::npos) return std::nullopt;
  auto end = hash + 1;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  return std::string(text.substr(start, end - start));
}

// Whether `text` names `call` ("all_reduce #4", not "all_reduce #40").
bool names(std::string_view text, const std::string& call) {
  for (auto at = text.find(call); at != std::string_view::npos; at = text.find(call, at + 1))
    if (at + call.size() == text.size() || !std::isdigit(static_cast<unsigned char>(text[at + call.size()])))
      return true;
  return false;
}

// The same exception type, with this rank and operation in front.
// `scope` ends the message (Impl::scope_note): which processes a split
// communicator's rank numbers are.
std::exception_ptr with_context(const Op& op, int rank, std::exception_ptr error, StatusBoard* status,
                                const std::string& scope) {
  std::string where = "rank " + std::to_string(rank) + ", " + describe(op) + ": ";
  // Once: a peer's reason quoted in the text may end with it already.
  auto scoped = [&](std::string text) { return text.find(scope) == std::string::npos ? text + scope : text; };
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(TimeoutError(scoped(e.what())));  // already says who waits for whom
  } catch (const RemoteError& e) {
    std::string why = e.peer() >= 0 && status ? status->abort_reason(e.peer()) : std::string();
    // The peer's reason is not quoted where this text holds it already, or
    // where the peer found a mismatch over this rank's very call: this
    // text names that disagreement ("rank 1 called X but rank 0 called Y"
    // against "rank 0 called Y but rank 1 called X"; "rank 0 runs X with
    // ring, rank 1 with ..." alike).
    const std::optional<std::string> call = mismatch_call(e.what(), rank);
    const bool mirror = call && mismatch_call(why, -1) && names(why, *call);
    const bool told = why.empty() || mirror || std::string_view(e.what()).find(why) != std::string_view::npos;
    std::string text = where + e.what() + (told ? "" : "; it had failed first: " + why);
    text += blamed_note(text, rank);
    return std::make_exception_ptr(RemoteError(scoped(text), e.peer()));
  } catch (const InvalidUsage& e) {
    return std::make_exception_ptr(InvalidUsage(scoped(where + e.what())));
  } catch (const AbortedError& e) {
    return std::make_exception_ptr(AbortedError(e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(SystemError(scoped(where + e.what())));
  }
}

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

void WorkState::complete(std::exception_ptr e) {
  {
    std::lock_guard lock(mu);
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

std::shared_ptr<WorkState> completed_work() {
  static WorkState* const completed = [] {
    auto* state = new WorkState;  // never freed: Works may outlive every communicator
    state->done.store(true, std::memory_order_release);
    return state;
  }();
  return std::shared_ptr<WorkState>(std::shared_ptr<WorkState>(), completed);  // no control block
}

Communicator::Impl::~Impl() {
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  cv.notify_all();
  if (worker.joinable()) worker.join();
  // A job's last broadcasts, which their roots left before every peer had
  // entered them (exchange_slots.cc), are checked here; said, as a
  // destructor cannot throw. Not after a failure, which said its own.
  if (!failure) {
    const auto wait = std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(2000));
    const std::string late = check_early_calls_at_end(exchange, Clock::now() + wait);
    if (!late.empty()) spdlog::error("{} (found as rank {} destroyed the communicator)", late, rank);
  } else if (!failure_seen->load(std::memory_order_acquire)) {
    spdlog::error("{} (no wait() or test() of this communicator's calls threw it: said as rank {} destroyed the "
                  "communicator)", failure_text, rank);
  }
  status.reset();
  for (auto& t : transports) t->shutdown();
  forget_store_keys(*this);
}

std::shared_ptr<WorkState> Communicator::Impl::enqueue(Op op, StagedInput input) {
  ensure_prepared();
  auto state = std::make_shared<WorkState>();
  state->failure_seen = failure_seen;
  state->input = std::move(input);
  if (op.recv_chunks) {  // the caller's table may go once the call returns
    state->recv_chunks.assign(op.recv_chunks, op.recv_chunks + size);
    op.recv_chunks = state->recv_chunks.data();
  }
  if (op.send_chunks) {
    state->send_chunks.assign(op.send_chunks, op.send_chunks + size);
    op.send_chunks = state->send_chunks.data();
  }
  // Device memory: the copies and the gate go on the caller's stream now,
  // before the call takes its sequence number, and staging and queueing
  // happen under staging_mu so that gates open in queue order. Not under mu:
  // a CUDA call that waits for the device (which may wait for a gate) must
  // not keep the progress thread from running the calls that open them.
  std::unique_lock staging_lock(staging_mu, std::defer_lock);
  if (op.memory.kind == runtime::MemoryKind::device) {
    staging_lock.lock();
    if (!device) start_device(op.memory.device);
    if (exchange.gpu_shared.load(std::memory_order_relaxed)) device->note_gpu_shared();
    CallShape shape = shape_of(op);
    shape.registered = registration_matters(shape) && registered(op);  // shareable through CUDA IPC
    state->staged = device->stage(op, rank, size, shape);
    state->timeout = timeout;
  }
  std::unique_lock lock(mu);
  const bool collective = op.kind != OpKind::send && op.kind != OpKind::recv;
  if (op.kind == OpKind::send) {
    op.seq = ++sends_to[op.root];
    if (status) status->sent(op.root, op.seq);  // ask_sent's answers count it from now
  } else if (op.kind == OpKind::recv) {
    op.seq = ++receives_from[op.root];
  }
  if (!collective) op.next_collective = gate.load(std::memory_order_relaxed) / kOneSeq;
  // Run here if the engine is idle: small calls (a hand-off would cost more
  // than the call), and calls whose caller waits for them anyway (gate
  // `host`: two hand-offs saved).
  const bool held = state->staged && state->staged->holds_caller();
  const bool small = (inline_on.load(std::memory_order_relaxed) && op.count * dtype_bytes(op.dtype) <= inline_bytes &&
                      !state->staged) ||
                     held;
  const std::uint64_t before = take_gate(collective, small);
  if (collective) op.seq = before / kOneSeq;
  if (small && !(before & kBusy)) {  // nothing queued or running, no failure: run it here
    running = true;
    lock.unlock();
    if (staging_lock.owns_lock()) staging_lock.unlock();
    bool handed = false;  // a send or receive still waiting for its peer, left to the worker
    if (runs_with_point_to_point(op, *state)) handed = !run_point_to_point_inline(op, state);
    else execute(op, *state, true);
    lock.lock();
    if (handed) {
      p2p_handed = true;
      if (!worker.joinable() && !start_worker(op, *state)) p2p.clear(), p2p_handed = false;
    }
    running = false;
    settle();
  } else if (failure) {
    // Refused here, with the calls still queued before it, rather than by
    // the worker: a caller issuing calls in a loop outpaced the worker's
    // refusals, the queue grew without bound, and a caller that tests an
    // earlier call's Work now and then to stop (braid-bench -n 100000000
    // after a peer timed out) never saw it done. A call that still runs
    // (the one Communicator::abort cuts short, or the worker refusing)
    // completes first, so that calls still complete in issue order: the
    // wait is that call's, bounded by its own waits.
    if (staging_lock.owns_lock()) staging_lock.unlock();  // refusals open the gates in issue order
    while (running || p2p_handed || (gate.load(std::memory_order_acquire) & kLean))
      cv.wait_for(lock, std::chrono::milliseconds(1));
    std::deque<std::pair<Op, std::shared_ptr<WorkState>>> earlier;
    earlier.swap(queue);
    lock.unlock();
    for (auto& [queued_op, queued] : earlier) refuse_after_failure(queued_op, *queued);
    refuse_after_failure(op, *state);
  } else {
    if (!worker.joinable() && !start_worker(op, *state)) return state;
    queue.emplace_back(op, state);
    const bool take_in = p2p_running && runs_with_point_to_point(op, *state);
    lock.unlock();
    cv.notify_all();
    if (take_in)  // the worker may sleep in a transport: it takes this call in now
      for (Transport* t : exchange.distinct) t->interrupt();
  }
  if (held) {
    if (lock.owns_lock()) lock.unlock();
    if (staging_lock.owns_lock()) staging_lock.unlock();
    hold_caller(op, *state);
  }
  return state;
}

// Gate `host` (comm/device.h): the caller's thread waits for the call as
// Work::wait does (one run here is done already), then queues the result's
// copy back. No other thread has the state yet, and the engine is done with it.
void Communicator::Impl::hold_caller(const Op& op, WorkState& state) {
  state.wait_done();
  if (state.error) return;
  try {
    state.staged->finish_on_caller();
  } catch (const std::exception& e) {
    const std::string where = "rank " + std::to_string(rank) + ", " + describe(op) + ": ";
    state.error = std::make_exception_ptr(SystemError(where + e.what()));
  }
}

// With `mu` held: takes the call's place in the gate (its sequence number
// if `collective`) and marks the engine busy; returns the gate as it was,
// whose kBusy says whether the call must queue. A call that queues sets
// kQueued, so that a lean call running meanwhile sees the gate changed.
std::uint64_t Communicator::Impl::take_gate(bool collective, bool may_run_now) {
  std::uint64_t before = gate.load(std::memory_order_relaxed), after;
  do {
    after = (before + (collective ? kOneSeq : 0)) | kBusy;
    if ((before & kBusy) || !may_run_now) after |= kQueued;
  } while (!gate.compare_exchange_weak(before, after, std::memory_order_acq_rel, std::memory_order_relaxed));
  return before;
}

// With `mu` held, after a call ran (running is false again): an abort that
// waited for it happens now; the worker takes what other threads queued
// meanwhile; with nothing queued the engine is idle for the lean path
// again, unless the communicator failed.
void Communicator::Impl::settle() {
  if (!deferred_abort.empty()) abort(std::exchange(deferred_abort, std::string()));
  if (!queue.empty() || p2p_handed) {
    cv.notify_all();  // else no wake-up: a sleeping worker costs a system call to wake
    return;
  }
  if (!failure) gate.fetch_and(~(kBusy | kQueued), std::memory_order_release);
}

// A lean call that ended while the gate changed under it (another thread
// queued a call) or that failed: the rest is the engine's, under `mu`.
void Communicator::Impl::hand_over() {
  std::lock_guard lock(mu);
  gate.fetch_and(~kLean, std::memory_order_release);
  settle();
}

// The device path, on the first call on device memory (staging_mu held):
// staging, the Reducer, and cuda_ipc to the ranks of this host.
void Communicator::Impl::start_device(int ordinal) {
  auto staging = make_device_staging(ordinal, timeout, config.cuda_gate);
  device_reducer = staging->make_reducer();
  exchange.device_reducer = device_reducer.get();
  exchange.device_id = staging->device_uuid();
  exchange.device_mps = staging->mps();
  if (cuda_ipc) device_regions = staging->connect_regions(store, key_prefix, *cuda_ipc);
  exchange.device_regions = device_regions.get();
  device = std::move(staging);
}

// Called with `mu` held. A process out of threads gets a named error, not
// a queued call that no thread will ever run: the communicator aborts (so
// its peers fail too) and the call's Work carries the error.
bool Communicator::Impl::start_worker(const Op& op, WorkState& state) {
  try {
    worker = std::thread([this] { run_worker(); });
    return true;
  } catch (const std::system_error& e) {
    auto error = std::make_exception_ptr(SystemError(
        "rank " + std::to_string(rank) + ", " + describe(op) +
        ": cannot start the communicator's progress thread (" + e.what() +
        "): the process is out of threads (ulimit -u, the cgroup's pids.max, kernel.threads-max); "
        "destroy communicators that are no longer used or raise the limit"));
    fail_with(error);
    // A call another thread runs (lean or inline) still uses the
    // transports: closing them under it would make it fail, or worse. The
    // abort waits until that call ends (settle), which it does on its own.
    if (running || (gate.load(std::memory_order_acquire) & kLean)) deferred_abort = message_of(error);
    else abort(message_of(error));
    if (state.staged) state.staged->open_gate();
    state.complete(error);
    return false;
  }
}

void Communicator::Impl::run_worker() {
  std::unique_lock lock(mu);
  for (;;) {
    cv.wait(lock, [this] {
      const bool lean = gate.load(std::memory_order_acquire) & kLean;  // cleared under `mu` (hand_over)
      const bool work = !queue.empty() || p2p_handed;
      return (work && !running && !lean) || (stopping && !work);
    });
    if (queue.empty() && !p2p_handed) return;
    running = true;
    if (p2p_handed || runs_with_point_to_point(queue.front().first, *queue.front().second)) {
      p2p_handed = false;
      run_point_to_point(lock);
    } else {
      auto [op, state] = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      execute(op, *state);
      lock.lock();
    }
    running = false;
    settle();
    cv.notify_all();
  }
}

// `inline_call`: run by enqueue in the caller's thread, which has just seen
// no failure under `mu` (none can come while it holds `running`) and has not
// handed `state` out yet, so neither needs a lock: small calls are latency.
void Communicator::Impl::execute(Op& op, WorkState& state, bool inline_call) {
  if (!inline_call && refuse_after_failure(op, state)) return;
  try {
    if (state.staged) state.staged->wait_inputs(Clock::now() + timeout);
    if (status) status->entered(op, &exchange.waiting_for);
    CallShape shape = shape_of(op);
    if (state.staged) shape.registered = state.staged->on_device();  // as when it was staged
    const Algorithm algorithm = select_algorithm(shape);
    // now: the calls before it have written what they write (StagedInput)
    state.input.fill(op, algorithm.scales_avg_inputs, algorithm.maps_inputs);
    note_choice(op.kind, algorithm);
    op.algorithm = algorithm.id;
    Exchange x(op, exchange, Clock::now() + timeout, peer_state);
    if (size > 1 && !algorithm.agrees) agree_signatures(x);
    exchange.call_ready = state.staged ? state.staged->ready_event() : DeviceEventRef{};
    exchange.call_waits.clear();
    exchange.call_flags = state.staged ? state.staged->flags(op.seq) : DeviceFlagsRef{};
    if (exchange.call_flags.set())
      exchange.wait_call_input = [&state](Clock::time_point deadline) { state.staged->wait_inputs_on_host(deadline); };
    algorithm.run(x);
    exchange.end_call();
    state.input.release();
    if (state.staged) {
      state.staged->wait_on_stream(std::move(exchange.call_waits));
      state.staged->open_gate();
    }
    if (status) status->left(op);
    if (inline_call) state.complete_unshared(nullptr);
    else state.complete(nullptr);
  } catch (...) {
    exchange.end_call();
    if (state.staged) state.staged->open_gate();  // the stream goes on; the Work carries the error
    auto error = fail(op, std::current_exception());
    if (inline_call) state.complete_unshared(error);
    else state.complete(error);
  }
}

// Completes `state` with an AbortedError, and returns true, where the
// communicator failed before `op` could run.
bool Communicator::Impl::refuse_after_failure(const Op& op, WorkState& state) {
  std::string earlier;
  {
    std::lock_guard lock(mu);
    if (!failure) return false;
    earlier = failure_text;
  }
  if (state.staged) state.staged->open_gate();
  state.complete(std::make_exception_ptr(AbortedError(
      "rank " + std::to_string(rank) + ", " + describe(op) +
      ": not run because the communicator was aborted by an earlier error: " + earlier)));
  return true;
}

// With `mu` held: the communicator's first error, kept (a later one is
// not), and no lean call from now on.
void Communicator::Impl::fail_with(std::exception_ptr error) {
  if (!failure) {
    failure_text = message_of(error);
    failure = std::move(error);
  }
  gate.fetch_or(kBusy, std::memory_order_relaxed);
}

// What a timed-out wait says of `peer`: its last call, and which rank
// holds this one up.
std::string Communicator::Impl::describe_wait(const Op& op, int peer) {
  if (!status) return "is unknown";
  // What the transports know of a silent rank (Transport::gone).
  auto gone = [this](int p) {
    Transport* t = exchange.routes.at(static_cast<std::size_t>(p));
    return t ? t->gone(p) : std::string();
  };
  std::string text = status->describe_peer(peer, op.seq), holder = status->holder(op, size, gone);
  if (!one_host) text = "runs on " + runtime::host_name(hosts[static_cast<std::size_t>(peer)]) + " and " + text;
  return holder.empty() ? text : text + "; holding this call up: " + holder;
}

std::exception_ptr Communicator::Impl::fail(const Op& op, std::exception_ptr raw) {
  if (status) status->left(op);
  auto error = with_context(op, rank, std::move(raw), status.get(), scope_note);
  abort(message_of(error));
  std::lock_guard lock(mu);
  deferred_abort.clear();  // an abort that waited for this call: done now
  fail_with(error);
  return error;
}

// What select.cc needs to know of `op` on this communicator. Whether
// device buffers are registered (shareable through CUDA IPC) is asked once,
// when the call is staged (enqueue), and kept by its StagedOp.
CallShape Communicator::Impl::shape_of(const Op& op) const {
  CallShape shape;
  shape.kind = op.kind;
  shape.bytes = op.count * dtype_bytes(op.dtype);
  shape.ranks = size;
  shape.one_host = one_host;
  shape.device = op.memory.kind == runtime::MemoryKind::device;
  const std::size_t send_bytes = send_elements(op, rank, size) * dtype_bytes(op.dtype);
  const std::size_t recv_bytes = recv_elements(op, rank, size) * dtype_bytes(op.dtype);
  auto* send = static_cast<const std::byte*>(op.send);
  auto* recv = static_cast<const std::byte*>(op.recv);
  if (op.recv_chunks) shape.in_place = send_bytes && op.send == op.recv_chunks[rank];
  else if (op.send_chunks) shape.in_place = recv_bytes && op.recv == op.send_chunks[rank];
  else shape.in_place = send_bytes && recv_bytes && send < recv + recv_bytes && recv < send + send_bytes;
  shape.transport = config.transport;
  shape.forced = forced_algo;
  shape.slot_bytes = slot_capacity(exchange);
  shape.registered = !shape.device && registration_matters(shape) && registered(op);
  return shape;
}

// Whether every buffer `op` uses on this rank lies in registered memory its
// peers can map: host memory through the transport to every peer, device
// memory through cuda_ipc. Of a broadcast and a reduce, the buffer a rank
// does not use is judged too where it was given (a non-root's send buffer of
// a broadcast, receive buffer of a reduce): judged by the ones used alone,
// ranks that pass the same kinds of buffers (a malloc'd send buffer, a
// registered receive buffer) differed, the root's answer against the
// others', and BRAID_ALGO=direct failed the call as mismatched.
bool Communicator::Impl::registered(const Op& op) const {
  if (op.recv_chunks || op.send_chunks) return false;  // the list forms: never the direct collective
  const std::size_t es = dtype_bytes(op.dtype);
  std::size_t send_bytes = send_elements(op, rank, size) * es, recv_bytes = recv_elements(op, rank, size) * es;
  if (op.kind == OpKind::broadcast && !send_bytes && op.send) send_bytes = op.count * es;
  if (op.kind == OpKind::reduce && !recv_bytes && op.recv) recv_bytes = op.count * es;
  RegionRef ref;
  return (send_bytes || recv_bytes) &&
         (!send_bytes || find_region(exchange, op.send, send_bytes, ref, op.memory.kind)) &&
         (!recv_bytes || find_region(exchange, op.recv, recv_bytes, ref, op.memory.kind));
}

namespace {

bool same_choice(const Algorithm& a, const Algorithm& b) {
  const Reason &x = a.reason, &y = b.reason;
  auto same = [](std::string_view p, std::string_view q) {  // select.cc's literals: the same pointer, mostly
    return (p.data() == q.data() && p.size() == q.size()) || p == q;
  };
  return a.run == b.run && same(a.name, b.name) && a.agrees == b.agrees && x.rule == y.rule && x.bytes == y.bytes &&
         x.limit == y.limit && x.ranks == y.ranks && same(x.forced, y.forced) && x.staged == y.staged;
}

}  // namespace

// Logs at info the first call of each kind that runs with each algorithm,
// with select.cc's reason, and keeps the choice for
// Communicator::last_algorithm.
// Runs on every call: plain values only; the sentence is built for the log
// line, once per (kind, algorithm), and when last_algorithm is asked.
void Communicator::Impl::note_choice(OpKind kind, const Algorithm& algorithm) {
  Choices& choices = choices_by_kind[static_cast<std::size_t>(kind)];
  // Only the thread running operations writes choices, so it may compare
  // without the lock; most calls repeat the last choice.
  if (same_choice(choices.last, algorithm)) return;
  std::lock_guard lock(choice_mu);
  choices.last = algorithm;
  lean_by_kind[static_cast<std::size_t>(kind)].noted_bytes = kNotNoted;  // the lean path notes its next call
  auto& logged = choices.logged;
  if (std::find(logged.begin(), logged.end(), algorithm.name) != logged.end()) return;
  auto free = std::find(logged.begin(), logged.end(), std::string_view());
  if (free != logged.end()) *free = algorithm.name;
  spdlog::info("comm {:08x}: {} uses the {} algorithm: {}", comm_id, name(kind), algorithm.name,
               describe(algorithm.reason));
}

// Logged at debug only: every path here hands the reason to a caller (the
// failed call's Work, the call that could not start its thread, the
// caller of Communicator::abort), and every later call is refused with it.
// At error level each rank printed it twice, once here and once where the
// tool or the program reported the exception (h46's F9).
void Communicator::Impl::abort(const std::string& reason) {
  spdlog::debug("comm {:08x}: closing its transports after a failure: {}", comm_id, reason);
  if (status) status->publish_abort(reason);
  for (auto& t : transports) t->farewell(reason);
  for (auto& t : transports) t->shutdown();
}

// Communicator::abort, from any thread. The failure is set at once, so
// that queued and later calls are refused; the transports close now where
// no call runs. A call that runs (in the worker, inline or lean in the
// caller's thread) still uses them: closing them under it would race with
// it, so its waits are cut short instead (the flag, the slots' cancel, a
// wake of a sleeping transport) and it fails and closes them itself
// (fail); one that ends without waiting again closes them in settle().
void Communicator::Impl::abort_by_caller(const std::string& reason) {
  std::string text = "rank " + std::to_string(rank) + " aborted the communicator (Communicator::abort)";
  if (!reason.empty()) text += ": " + reason;
  text += scope_note;
  std::unique_lock lock(mu);
  if (failure) return;  // failed or aborted already: nothing more to do
  failure_seen->store(true, std::memory_order_release);  // the caller's own
  fail_with(std::make_exception_ptr(AbortedError(text)));
  exchange.abort_reason = text;
  exchange.aborting.store(true, std::memory_order_release);
  // kQueued too: a lean call that ends must see the gate changed and hand
  // over (settle), not clear kBusy with its compare-exchange.
  gate.fetch_or(kBusy | kQueued, std::memory_order_acq_rel);
  const bool busy = running || p2p_handed || (gate.load(std::memory_order_acquire) & kLean);
  if (busy) {
    deferred_abort = text;
    // The slots exist once prepared, which the running call was, in
    // another thread: the flag's acquire makes them visible here.
    if (prepared.load(std::memory_order_acquire) && exchange.slots) exchange.slots->cancel();
    for (Transport* t : exchange.distinct) t->interrupt();
  }
  cv.notify_all();  // the worker refuses what is queued
  lock.unlock();
  // Nothing runs, and with the failure set nothing will (every call is
  // refused): the transports are this thread's to close, outside `mu`,
  // since telling the store may take up to its budget (2 s).
  if (!busy) abort(text);
}

namespace {

// A Work of a call issued before a fork(), waited for in the child: its
// wait() never returned (found by a review helper).
void refuse_forked_wait(const WorkState& state, const char* what) {
  if (!state.done.load(std::memory_order_acquire) && state.born_in != fork_generation())
    throw InvalidUsage(std::string(what) + " in a forked child on a call the parent process issued: the parent "
                       "runs it, and this process will never see it complete");
}

// A call's error, thrown to the caller: seen (Impl::failure_seen).
[[noreturn]] void rethrow_seen(const WorkState& state) {
  if (state.failure_seen) state.failure_seen->store(true, std::memory_order_release);
  std::rethrow_exception(state.error);
}

// now + timeout, where that is before the clock's end: milliseconds::max()
// overflowed to a time in the past, and the wait failed at once.
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  constexpr auto kCentury = std::chrono::hours(24 * 365 * 100);
  return timeout >= kCentury ? now + kCentury : now + timeout;
}

}  // namespace

void Work::wait() {
  if (!state_) throw InvalidUsage("wait() on an empty Work");
  refuse_forked_wait(*state_, "Work::wait");
  state_->wait_done();
  if (state_->error) rethrow_seen(*state_);
  if (state_->staged) state_->staged->wait_results(Clock::now() + state_->timeout);
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!state_) throw InvalidUsage("wait() on an empty Work");
  refuse_forked_wait(*state_, "Work::wait");
  const auto deadline = deadline_after(timeout);
  if (!state_->done.load(std::memory_order_acquire)) {
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_until(lock, deadline, [this] { return state_->done.load(); }))
      throw TimeoutError("Work::wait: the operation did not complete within " + std::to_string(timeout.count()) +
                         " ms (it is still queued or running)");
  }
  if (state_->error) rethrow_seen(*state_);
  if (state_->staged) state_->staged->wait_results(deadline);
}

bool Work::test() {
  if (!state_) throw InvalidUsage("test() on an empty Work");
  refuse_forked_wait(*state_, "Work::test");
  if (!state_->done.load(std::memory_order_acquire)) return false;
  if (state_->error) rethrow_seen(*state_);
  return !state_->staged || state_->staged->results_ready();
}

}  // namespace braid::comm
