// The engine's point-to-point calls: sends and receives queued back to back
// run together.
//
// The engine runs one call at a time in issue order (engine.cc), and a large
// send completes only once its peer receives it. One at a time, the two
// halves of an exchange would wait for each other: each of two ranks that
// sends to the other and then receives from it (torch's batch_isend_irecv,
// the ring shift of a pipeline) would sit in its send until BRAID_TIMEOUT.
// So a send or receive on host memory does not block the ones queued right
// behind it: the worker posts the messages of every send and receive at the
// head of the queue, drives them together, and takes in the sends and
// receives queued meanwhile (enqueue interrupts its sleep in the transports
// for them: Transport::interrupt). A
// call's Work completes once its messages are done and every call before it
// completed: calls on one communicator still complete in issue order. Messages to or from one peer
// keep issue order (the transports complete them in posting order per peer
// and direction, and the sequence numbers in their headers are per peer and
// direction). A call of any other kind still waits for every call before it.
// Calls that share bytes of a buffer, where one of them receives, keep
// issue order (must_wait, blockers): a send or a receive waits, unposted,
// for the receives into its bytes to land, and a receive into bytes that
// sends still read lands in staging memory, copied into the caller's
// buffer once they have landed. A call behind a held one of the same peer
// and direction is held too, so that their messages keep issue order.
//
// A small send or receive issued while the engine is idle runs in the
// caller's thread, as small collectives do, but for kInlineWait at most:
// one still waiting for its peer then goes to the worker, and the caller
// goes on to the other half of its exchange. Calls on device memory are
// staged on the caller's stream and keep running one at a time.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator_impl.h"
#include "comm/transport/transport.h"

namespace braid::comm {
namespace {

// enqueue interrupts the transports' sleep for a call to take in; this
// bounds the wait should a transport not implement interrupt().
constexpr auto kAdoptEvery = std::chrono::milliseconds(50);
constexpr auto kInlineWait = std::chrono::microseconds(100);
// look_for_collectives_instead: how long a receive waits before its peer's
// status report is read, and how often it is read (or the peer asked).
constexpr auto kLookAfter = std::chrono::milliseconds(250);
constexpr auto kLookEvery = std::chrono::milliseconds(250);

}  // namespace

bool Communicator::Impl::runs_with_point_to_point(const Op& op, const WorkState& state) const {
  return (op.kind == OpKind::send || op.kind == OpKind::recv) && !state.staged;
}

// With `mu` held and `running` taken, and returns so: runs the calls in
// `p2p` and the sends and receives queued behind them until none is left.
void Communicator::Impl::run_point_to_point(std::unique_lock<std::mutex>& lock) {
  std::vector<std::pair<Op, std::shared_ptr<WorkState>>> adopted;
  p2p_running = true;
  for (;;) {
    while (!queue.empty() && runs_with_point_to_point(queue.front().first, *queue.front().second)) {
      adopted.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    if (adopted.empty() && p2p.empty()) break;
    lock.unlock();
    try {
      for (auto& [op, state] : adopted)
        if (!refuse_after_failure(op, *state)) start_point_to_point(op, std::move(state));
      adopted.clear();
      if (!finish_point_to_point(false)) drive_point_to_point(Clock::now() + kAdoptEvery);
    } catch (...) {
      adopted.clear();
      fail_point_to_point(std::current_exception(), false);
    }
    lock.lock();
  }
  p2p_running = false;
}

// In the caller's thread, `running` taken: true once the call completed
// (or failed), false when it was left in `p2p` for the worker.
bool Communicator::Impl::run_point_to_point_inline(const Op& op, const std::shared_ptr<WorkState>& state) {
  const auto until = Clock::now() + kInlineWait;
  try {
    start_point_to_point(op, state);
    while (!finish_point_to_point(true)) {
      if (Clock::now() >= until) return false;
      drive_point_to_point(until);
    }
  } catch (...) {
    fail_point_to_point(std::current_exception(), true);
  }
  return true;
}

namespace {

// The caller's bytes the call reads (a send) or writes (a receive).
std::pair<const std::byte*, const std::byte*> span_of(const Op& op, const void* caller_buffer) {
  const auto* begin = static_cast<const std::byte*>(op.kind == OpKind::send ? op.send : caller_buffer);
  return {begin, begin == nullptr ? nullptr : begin + op.count * dtype_bytes(op.dtype)};
}

bool overlap(const PointToPoint& earlier, const Op& later, const void* later_buffer) {
  const auto [a, a_end] = span_of(earlier.op, earlier.caller_buffer);
  const auto [b, b_end] = span_of(later, later_buffer);
  return a != a_end && b != b_end && a < b_end && b < a_end;
}

bool covers(const PointToPoint& earlier, const Op& later, const void* later_buffer) {
  const auto [a, a_end] = span_of(earlier.op, earlier.caller_buffer);
  const auto [b, b_end] = span_of(later, later_buffer);
  return a != a_end && b != b_end && a <= b && b_end <= a_end;
}

// Whether `later` must wait for `earlier`: their buffers overlap and one of
// them writes. (Posted together, a receive then a send of one buffer, a
// relay, sent what the buffer held before the receive; a send then a
// receive into it, an in-place ring shift, sent bytes the receive had
// overwritten. Issue order says otherwise.)
bool must_wait(const PointToPoint& earlier, const Op& later, const void* later_buffer) {
  if (earlier.op.kind == OpKind::send && later.kind == OpKind::send) return false;
  return overlap(earlier, later, later_buffer);
}

}  // namespace

// The earlier calls in flight that `op` must wait for: those it must_wait
// for, found from the latest back, up to one whose own waits include the
// rest (a receive covering op's bytes; for a send, a send covering them
// too, whose waits are op's): K calls on one buffer cost K steps, not K^2.
// And the latest earlier call with the same peer and direction, where that
// one is held unposted: messages between two ranks keep issue order.
std::vector<const PointToPoint*> Communicator::Impl::blockers(const Op& op) const {
  std::vector<const PointToPoint*> waits;
  bool covered = false, same_peer_seen = false;
  for (auto it = p2p.rbegin(); it != p2p.rend() && !(covered && same_peer_seen); ++it) {
    const PointToPoint& earlier = **it;
    if (!same_peer_seen && earlier.op.kind == op.kind && earlier.op.root == op.root) {
      same_peer_seen = true;
      if (!earlier.posted) waits.push_back(&earlier);
    }
    if (covered) continue;
    if (must_wait(earlier, op, op.recv)) waits.push_back(&earlier);
    if (covers(earlier, op, op.recv)) {
      if (earlier.op.kind == OpKind::recv) {
        covered = true;
      } else if (op.kind == OpKind::send) {
        // Of the covering send's waits, the receives into op's bytes:
        // not those into its other bytes, nor the send it is held behind
        // (a send to another peer), which op's bytes never meet (they
        // held a correct program until BRAID_TIMEOUT; found by a review
        // helper).
        for (const PointToPoint* w : earlier.waits_for)
          if (w->op.kind == OpKind::recv && overlap(*w, op, op.recv)) waits.push_back(w);
        covered = true;
      }
    }
  }
  std::sort(waits.begin(), waits.end());
  waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
  return waits;
}

// Posts every message of the call; `p2p` holds it from the start, so that
// a failure while posting fails it too. A call that must wait for an
// earlier one in flight (blockers) is held unposted, a receive only while
// it waits for an earlier receive (finish_point_to_point posts it): a
// receive that waits only for sends (an in-place ring shift, which would
// wait for itself held) lands in memory of its own.
void Communicator::Impl::start_point_to_point(const Op& op, std::shared_ptr<WorkState> state) {
  std::vector<const PointToPoint*> waits_for = blockers(op);
  PointToPoint& call = *p2p.emplace_back(std::make_unique<PointToPoint>(op, std::move(state)));
  call.deadline = Clock::now() + timeout;
  call.caller_buffer = op.recv;
  call.waits_for = std::move(waits_for);
  if (status) status->entered(call.op, &exchange.waiting_for);
  p2p_entered = call.op;
  note_choice(op.kind, select_algorithm(shape_of(op)));
  if (may_post(call)) post(call);
}

// A send once every call it waits for has landed; a receive once every
// receive from the same peer it waits for has. Meanwhile the calls it waits
// for still read or fill its bytes, so it lands in staging memory. (A
// receive held behind one from another peer waited on that peer, whose
// send might wait on the second receive's message: a deadlock on shared
// memory, found by a review helper. Behind one from the same peer, whose
// messages arrive in order, it waits for nothing and stages nothing: a
// benchmark's receives into one buffer took a full copy each.)
bool Communicator::Impl::may_post(const PointToPoint& call) const {
  if (call.op.kind == OpKind::send) return call.waits_for.empty();
  return std::none_of(call.waits_for.begin(), call.waits_for.end(), [&](const PointToPoint* earlier) {
    return earlier->op.kind == OpKind::recv && earlier->op.root == call.op.root;
  });
}

void Communicator::Impl::post(PointToPoint& call) {
  if (call.op.kind == OpKind::recv && !call.waits_for.empty()) {
    call.staging.resize(call.op.count * dtype_bytes(call.op.dtype));
    call.op.recv = call.staging.data();
  }
  call.x.emplace(call.op, exchange, call.deadline, peer_state);
  call.requests = post_point_to_point(*call.x);
  call.posted = true;
  exchange.sends.clear();  // the call's own list waits for them
}

// Whether the call has landed (see PointToPoint), after posting it or
// copying it out where the calls it waits for have landed.
bool Communicator::Impl::land(PointToPoint& call) {
  if (call.landed) return true;
  std::erase_if(call.waits_for, [](const PointToPoint* earlier) { return earlier->landed; });
  if (!call.posted) {
    if (!may_post(call)) return false;
    post(call);
  }
  for (; call.done < call.requests.size(); ++call.done) {
    const Request& request = call.requests[call.done];
    if (!request.transport->is_done(request.id)) return false;
    request.transport->release(request.id);
  }
  if (!call.waits_for.empty()) return false;
  if (!call.staging.empty()) std::memcpy(call.caller_buffer, call.staging.data(), call.staging.size());
  call.landed = true;
  return true;
}

// Completes, in issue order, the calls whose messages are all done, as are
// those of every call before them; whether none is left.
bool Communicator::Impl::finish_point_to_point(bool inline_call) {
  if (p2p.empty()) return true;
  std::size_t finished = 0;  // p2p[0, finished): done
  // In issue order, so that a call sees those it waits for land first, and
  // no call keeps a pointer to one removed below (land drops the landed).
  for (const auto& call : p2p) {  // may throw (a failed transport): nothing is removed before it does
    if (land(*call) && finished == static_cast<std::size_t>(&call - p2p.data())) ++finished;
  }
  if (finished == 0) return false;
  if (finished == p2p.size()) {
    if (status) status->left(p2p_entered);
    exchange.waiting_for.store(-1, std::memory_order_relaxed);
  }
  for (std::size_t i = 0; i < finished; ++i) {
    if (inline_call) p2p[i]->state->complete_unshared(nullptr);
    else p2p[i]->state->complete(nullptr);
  }
  p2p.erase(p2p.begin(), p2p.begin() + static_cast<std::ptrdiff_t>(finished));
  return p2p.empty();
}

// Moves the messages until one is done or `until`; throws the
// TimeoutError of a call past its deadline, naming the peer it waits for,
// or the AbortedError of Communicator::abort.
void Communicator::Impl::drive_point_to_point(Clock::time_point until) {
  throw_if_aborted(exchange, p2p.front()->op);  // Communicator::abort from another thread
  const auto now = Clock::now();
  for (const auto& call : p2p) {
    if (!call->x) continue;  // held unposted: it waits for a receive, which has a deadline
    if (now >= call->x->deadline()) call->x->timed_out(call->op.root);
    until = std::min(until, call->x->deadline());
  }
  const PointToPoint& first = *p2p.front();
  exchange.waiting_for.store(first.op.root, std::memory_order_relaxed);
  if (exchange.distinct.size() == 1) {
    if (!exchange.distinct.front()->progress(until)) look_for_collectives_instead();
    return;
  }
  bool advanced = false;  // several transports: turns, so that none starves (ExchangeContext::quiet_slice)
  for (Transport* each : exchange.distinct) advanced |= each->progress(now);
  if (!advanced) {
    Transport* waited = exchange.routes.at(static_cast<std::size_t>(first.op.root));
    advanced = waited->progress(std::min(until, now + exchange.quiet_slice));
    if (!advanced) look_for_collectives_instead();
  }
  exchange.after_turn(advanced);
}

// Nothing moved: a peer that a receive waits for may have gone into a
// collective instead. Most collectives send this rank a message whose
// header says so, but not all: over the shared slots they agree through
// the slots, and over TCP or RDMA a dissemination barrier of 3 ranks, or a
// ring of 4, may send this rank nothing from that peer, so the receive
// waited out BRAID_TIMEOUT. Only a receive whose message has not all
// arrived waits for its peer: one that has (held in staging behind an
// earlier call) lets its peer go on to the next collective, rightly (found
// by a review helper).
//
// Over the slots, check_receive reads the peer's slot. Elsewhere the peer's
// status report (StatusBoard) says which collective it entered: once a
// receive has waited kLookAfter, every kLookEvery at most. A report of a
// collective at or past the receive's next_collective is only a hint: a
// send the peer issued before it may still be on the wire, for seconds on
// a lossy link (TCP retransmits), and a report may lag the call. So the
// receive then asks the peer itself (StatusBoard::ask_sent), which answers
// with the call it is in and the sends it has issued to this rank: inside
// that collective with fewer, it will not send the message before it
// (check_receive says why), and the receive fails. (It waited 200 ms for
// the wire instead, and killed correct jobs on a slow, lossy link: found
// by a review helper.)
void Communicator::Impl::look_for_collectives_instead() {
  const auto arrived = [](const PointToPoint& call) {
    for (std::size_t i = call.done; i < call.requests.size(); ++i)
      if (!call.requests[i].transport->is_done(call.requests[i].id)) return false;
    return true;
  };
  const auto now = Clock::now();
  const bool board_looks = status && now >= next_look;
  if (board_looks) next_look = now + kLookEvery;
  for (const auto& call : p2p) {
    if (!call->posted || call->landed || call->op.kind != OpKind::recv || arrived(*call)) continue;
    const int peer = call->op.root;
    Transport* route = exchange.routes.at(static_cast<std::size_t>(peer));
    if (exchange.slots && exchange.distinct.size() == 1) {
      check_receive(exchange, call->op);
      continue;
    }
    if (!board_looks || route->shared_slots() || call->op.next_collective == 0 ||
        now < call->deadline - timeout + kLookAfter)
      continue;
    const auto reached = status->collective_reached(peer);
    if (!reached || reached->seq < call->op.next_collective) continue;
    const auto answer = status->ask_sent(peer, call->op.seq, call->op.next_collective);
    if (answer.state != StatusBoard::SendAnswer::unsent) continue;
    throw RemoteError(receive_without_send(rank, call->op, answer.inside + " (as it answers)"), peer);
  }
}

// Every call in flight fails with the error, named after the first of them.
void Communicator::Impl::fail_point_to_point(std::exception_ptr raw, bool inline_call) {
  auto error = fail(p2p.empty() ? p2p_entered : p2p.front()->op, std::move(raw));
  for (const auto& call : p2p) {
    if (inline_call) call->state->complete_unshared(error);
    else call->state->complete(error);
  }
  p2p.clear();
  exchange.waiting_for.store(-1, std::memory_order_relaxed);
}

}  // namespace braid::comm
