#include "comm/status.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "runtime/errors.h"
#include "runtime/store.h"

namespace braid::comm {
namespace {

constexpr auto kPublishPeriod = std::chrono::milliseconds(100);
// How long a rank inside an operation may go without a new heartbeat before
// it is called silent: six periods, so a live rank on a loaded machine is not.
constexpr auto kSilence = std::chrono::milliseconds(600);
// The failure path's budget for one call on the store is a quarter of the
// store's request timeout, and never more than this.
constexpr auto kMaxBudget = std::chrono::milliseconds(2000);
// How long a receive's look at a peer's report (collective_reached) may
// wait for the store.
constexpr auto kLookBudget = std::chrono::milliseconds(500);
// How long a rank stays inside one call before its heartbeat answers probes.
constexpr auto kAnswerAfter = std::chrono::milliseconds(250);
// How long a rank beats between calls of a communicator before it reports
// the communicator idle and stops beating until its next call.
constexpr auto kBeatsBetweenCalls = std::chrono::seconds(10);
// How long the destructor waits for the heartbeat thread to end.
constexpr auto kJoinWait = std::chrono::milliseconds(200);

bool point_to_point(std::string_view kind) { return kind == "send" || kind == "recv"; }

std::string idle_time() {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kBeatsBetweenCalls).count()) + " s";
}

}  // namespace

StatusBoard::StatusBoard(std::shared_ptr<runtime::Store> store, std::string key_prefix, int rank, int size)
    : store_(std::move(store)), prefix_(std::move(key_prefix)), rank_(rank), sent_(static_cast<std::size_t>(size)) {
  if (store_) thread_ = std::thread(run, this, beat_, store_);
}

StatusBoard::~StatusBoard() {
  std::unique_lock lock(beat_->mu);
  beat_->stop = true;
  beat_->cv.notify_all();
  if (!thread_.joinable()) return;
  // A thread between beats ends at once; one inside a beat that the store
  // leaves unanswered ends at the store's request timeout, on its own.
  const bool ended = beat_->cv.wait_for(lock, kJoinWait, [&] { return beat_->exited; });
  lock.unlock();
  if (ended) thread_.join();
  else thread_.detach();
}

std::string StatusBoard::key(const char* what, int rank) const {
  return prefix_ + "/" + what + "/" + std::to_string(rank);
}

void StatusBoard::entered(const Op& op, const std::atomic<int>* waiting_for) {
  waiting_for_.store(waiting_for, std::memory_order_relaxed);
  left_seq_.store(0, std::memory_order_relaxed);
  state_.store(op.seq << 8 | static_cast<std::uint8_t>(op.kind), std::memory_order_release);
}

void StatusBoard::left(const Op& op) { left_seq_.store(op.seq, std::memory_order_release); }

// The call last entered as the heartbeat publishes it: "<kind> #<seq>
// <in|out> <peer waited for, or -1>"; empty before the first call.
std::string StatusBoard::current() const {
  const std::uint64_t state = state_.load(std::memory_order_acquire), seq = state >> 8;
  if (state == 0) return {};
  const bool inside = left_seq_.load(std::memory_order_acquire) != seq;
  const std::atomic<int>* waiting = waiting_for_.load(std::memory_order_relaxed);
  const int peer = inside && waiting ? waiting->load(std::memory_order_relaxed) : -1;
  return std::string(name(static_cast<OpKind>(state & 0xff))) + " #" + std::to_string(seq) +
         (inside ? " in " : " out ") + std::to_string(peer);
}

// ask_sent's answer: the probe number, the call as current() says it, and
// then the sends issued to each rank that has any, read after the call:
// "3 barrier #7 in 0 0:5 2:1".
std::string StatusBoard::answer(std::int64_t probe) const {
  std::string text = std::to_string(probe) + " " + current();
  for (std::size_t peer = 0; peer < sent_.size(); ++peer)
    if (const std::uint64_t n = sent_[peer].load(std::memory_order_acquire))
      text += " " + std::to_string(peer) + ":" + std::to_string(n);
  return text;
}

// Publishes on every change, and while inside an operation once per period
// with a new beat, so that silence means the process stopped running. Once
// inside one call for kAnswerAfter, each beat also looks for a probe
// (ask_sent) newer than the last answered, and answers it. The board is
// read only under beat->mu while beat->stop is false: once the destructor
// has set it the board may be gone.
void StatusBoard::run(StatusBoard* board, std::shared_ptr<Beat> beat, std::shared_ptr<runtime::Store> store) {
  const std::string key = board->key("status", board->rank_), probe_key = board->key("probe", board->rank_),
                    answer_key = board->key("answer", board->rank_);
  std::uint64_t count = 0;
  std::int64_t answered = 0;
  std::string published, last;
  auto since = Clock::now();      // when `published` (its call) began
  auto out_since = Clock::now();  // when `last`, between calls, was first read
  bool idle_told = false;
  std::unique_lock lock(beat->mu);
  while (!beat->cv.wait_for(lock, kPublishPeriod, [&] { return beat->stop; })) {
    const std::string state = board->current();
    if (state.empty()) continue;
    const bool inside = state.find(" in ") != std::string::npos;
    // The call: "<kind> #<seq>" (the peer it waits for may change within it).
    const auto call_of = [](const std::string& text) { return text.substr(0, text.find(' ', text.find('#'))); };
    if (call_of(state) != call_of(published)) since = Clock::now();
    const bool answers = inside && call_of(state) == call_of(published) && Clock::now() - since >= kAnswerAfter;
    // Between calls too: a rank stopped there (SIGSTOP between two calls)
    // was told from one computing only by the stale call its last report
    // named, hundreds of calls back among small ones (a review helper's
    // case). A communicator left unused (one of many torch groups) says so
    // once, "idle", and beats no more until its next call.
    if (state != last) {
      last = state;
      out_since = Clock::now();
      idle_told = false;
    }
    std::string record = state;
    const bool idle = !inside && Clock::now() - out_since >= kBeatsBetweenCalls;
    if (idle) {
      if (idle_told) continue;
      record.replace(record.find(" out "), 5, " idle ");
    }
    lock.unlock();
    try {
      store->set(key, record + " " + std::to_string(++count));
      // Only once it is published: a set that failed left the last beat
      // standing, read as a stopped rank (a review helper's case).
      idle_told = idle;
      published = state;
      std::optional<runtime::Bytes> probe = answers ? store->try_get(probe_key) : std::nullopt;
      const std::int64_t asked = probe ? std::atoll(std::string(probe->begin(), probe->end()).c_str()) : 0;
      if (asked > answered) {
        lock.lock();
        if (beat->stop) break;
        const std::string text = board->answer(asked);
        lock.unlock();
        store->set(answer_key, text);
        answered = asked;
      }
    } catch (const Error&) {
      // The store is gone (job ending); attribution is best effort.
    }
    if (!lock.owns_lock()) lock.lock();
  }
  if (!lock.owns_lock()) lock.lock();
  beat->exited = true;
  beat->cv.notify_all();
}

std::chrono::milliseconds StatusBoard::budget() const {
  return std::min(store_->request_timeout() / 4, kMaxBudget);
}

bool StatusBoard::ask(Clock::time_point deadline, const std::function<void(Clock::time_point)>& request) {
  {
    std::lock_guard lock(unanswered_mu_);
    if (!unanswered_.empty()) return false;
  }
  std::string why;
  try {
    request(deadline);
    return true;
  } catch (const InvalidUsage&) {
    return false;  // the store answered: a set past its byte limit
  } catch (const TimeoutError&) {
    why = "the store did not answer within " + std::to_string(budget().count()) +
          " ms, so the process that serves it (rank 0 or the launcher) may be stopped or overloaded too, or cut "
          "off from this rank (a network fault)";
  } catch (const Error& e) {
    why = std::string("the store did not answer: ") + e.what();
  }
  std::lock_guard lock(unanswered_mu_);
  if (unanswered_.empty()) unanswered_ = std::move(why);
  return false;
}

std::string StatusBoard::unanswered() {
  std::lock_guard lock(unanswered_mu_);
  return unanswered_;
}

std::optional<runtime::Bytes> StatusBoard::fetch(const std::string& key, Clock::time_point deadline) {
  std::optional<runtime::Bytes> value;
  if (!ask(deadline, [&](Clock::time_point d) { value = store_->try_get(key, d); })) throw TimeoutError(unanswered());
  return value;
}

std::optional<StatusBoard::Record> StatusBoard::read(int peer, Clock::time_point deadline) {
  auto value = fetch(key("status", peer), deadline);
  return value ? parse(*value) : std::nullopt;
}

std::optional<StatusBoard::Record> StatusBoard::parse(const std::vector<std::uint8_t>& value) {
  std::istringstream in(std::string(value.begin(), value.end()));
  Record r;
  std::string hash_seq, where;
  in >> r.kind >> hash_seq >> where >> r.waiting_for >> r.beat;
  if (!in || hash_seq.size() < 2) return std::nullopt;
  r.seq = std::stoull(hash_seq.substr(1));
  r.inside = where == "in";
  r.idle = where == "idle";
  return r;
}

// Not the failure path's: a receive asks this while it waits, on a store
// that may be slow or frozen, so a store that leaves it unanswered once is
// not asked again (the heartbeat thread holds the store's one connection
// while it waits for a set; a progress thread must not wait behind it on
// every look).
std::optional<StatusBoard::Reached> StatusBoard::collective_reached(int peer) {
  if (!store_ || looks_off_.load(std::memory_order_relaxed)) return std::nullopt;
  std::optional<runtime::Bytes> value;
  try {
    value = store_->try_get(key("status", peer), Clock::now() + kLookBudget);
  } catch (const Error&) {
    looks_off_.store(true, std::memory_order_relaxed);
    return std::nullopt;
  }
  auto r = value ? parse(*value) : std::nullopt;
  if (!r || point_to_point(r->kind)) return std::nullopt;
  return Reached{r->kind, r->seq};
}

StatusBoard::SendAnswer StatusBoard::ask_sent(int peer, std::uint64_t seq, std::uint64_t next_collective) {
  if (!store_ || looks_off_.load(std::memory_order_relaxed)) return {};
  const auto deadline = Clock::now() + kLookBudget;
  std::lock_guard lock(asked_mu_);
  try {
    const auto asked = asked_.find(peer);
    if (asked == asked_.end()) {
      asked_[peer] = store_->add(key("probe", peer), 1, deadline);
      return {};
    }
    const auto value = store_->try_get(key("answer", peer), deadline);
    if (!value) return {};
    std::istringstream in(std::string(value->begin(), value->end()));
    std::int64_t probe = 0;
    std::string kind, hash_seq, where;
    int waiting = -1;
    in >> probe >> kind >> hash_seq >> where >> waiting;
    if (!in || probe < asked->second || hash_seq.size() < 2) return {};
    asked_.erase(asked);  // answered: the next look asks again
    std::uint64_t sends = 0;
    for (std::string entry; in >> entry;)
      if (const auto colon = entry.find(':'); colon != std::string::npos && std::stoi(entry.substr(0, colon)) == rank_)
        sends = std::stoull(entry.substr(colon + 1));
    const std::uint64_t at = std::stoull(hash_seq.substr(1));
    if (point_to_point(kind) || where != "in" || at < next_collective || sends >= seq) return {SendAnswer::sent, {}};
    return {SendAnswer::unsent, kind + " #" + std::to_string(at)};
  } catch (const Error&) {
    looks_off_.store(true, std::memory_order_relaxed);
    return {};
  } catch (const std::exception&) {  // a malformed answer (stoi): no proof
    return {};
  }
}

std::vector<std::optional<StatusBoard::Record>> StatusBoard::read_all(int size, Clock::time_point deadline) {
  std::vector<std::optional<Record>> records(static_cast<std::size_t>(size));
  for (int peer = 0; peer < size; ++peer)
    if (peer != rank_) records[static_cast<std::size_t>(peer)] = read(peer, deadline);
  return records;
}

std::string StatusBoard::describe_peer(int peer, std::uint64_t seq) {
  if (!store_) return "is unknown";
  try {
    auto r = read(peer, Clock::now() + budget());
    // Reports start 100 ms after the communicator is made: a rank that
    // stopped sooner has none, however many calls it ran.
    if (!r) return "has reported no call on this communicator (reports start 100 ms after it is made)";
    std::string text = "last entered " + r->kind + " #" + std::to_string(r->seq);
    if (r->inside && r->waiting_for >= 0) text += " and waits there for rank " + std::to_string(r->waiting_for);
    if (r->idle) return text + ", and has called nothing on this communicator for more than " + idle_time();
    // This rank's calls before `seq` may have needed the peer in later ones
    // than its report, up to 100 ms of calls older.
    if (!r->inside && !point_to_point(r->kind) && r->seq + 1 < seq)
      text += " by its last report (one every 100 ms: it may have entered later calls, up to #" +
              std::to_string(seq) + ")";
    return text;
  } catch (const Error&) {
    return "could not be asked: " + unanswered();
  }
}

// The ranks whose heartbeat stood still while watched first (stopped inside
// a call or between calls), with those that have not reached `op` and still
// beat; if there are none, the ones inside an earlier call and beating.
std::string StatusBoard::holder(const Op& op, int size, const std::function<std::string(int peer)>& gone) {
  if (!store_ || op.kind == OpKind::send || op.kind == OpKind::recv) return {};
  if (!unanswered().empty()) return {};  // describe_peer said so
  const auto deadline = Clock::now() + budget() + kSilence;
  try {
    const auto before = read_all(size, deadline);
    std::this_thread::sleep_for(kSilence);
    const auto after = read_all(size, deadline);
    std::string stopped, absent, behind;
    auto add = [&](std::string& to, int peer, const std::string& why) {
      const std::string host = hosts_.empty() ? "" : "on " + hosts_[static_cast<std::size_t>(peer)] + ", ";
      to += (to.empty() ? "rank " : ", rank ") + std::to_string(peer) + " (" + host + why + ")";
    };
    const std::string silent = " its heartbeat stood still for the " + std::to_string(kSilence.count()) +
                               " ms watched, where a running rank beats every 100: stopped (SIGSTOP, a debugger), "
                               "frozen, starved of CPU, or cut off from the store (a network fault)";
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank_) continue;
      const auto &r0 = before[static_cast<std::size_t>(peer)], &r1 = after[static_cast<std::size_t>(peer)];
      const auto& r = r1 ? r1 : r0;
      if (r && point_to_point(r->kind)) continue;
      // Its report may be up to a period older than the stop, and a rank
      // making small calls makes thousands in a period: it stopped in the
      // reported call or a later one, up to this one.
      const std::string range = r && r->seq < op.seq ? " #" + std::to_string(r->seq) +
                                                           " (its last report) or a later call up to #" +
                                                           std::to_string(op.seq)
                                                     : r ? " #" + std::to_string(r->seq) : std::string();
      // A rank that died or closed stops beating too: named for that, not
      // as stopped (helper-132's F2: a rank killed while its peers waited
      // for another, late one was called "stopped (SIGSTOP ...)").
      const std::string why_gone = gone ? gone(peer) : std::string();
      if (r0 && r1 && r1->beat == r0->beat && !r1->idle && (r1->inside || r1->seq < op.seq))
        add(stopped, peer,
            (r1->inside ? "inside " : "after ") + r1->kind + range + (r1->inside ? " but" : ", and") +
                (why_gone.empty() ? silent : " its heartbeat stood still: " + why_gone));
      else if (!r)
        add(absent, peer, "no call reported yet");
      else if (r->seq < op.seq && r->idle)
        add(absent, peer, "last entered " + r->kind + " #" + std::to_string(r->seq) +
                              ", and has called nothing on this communicator for more than " + idle_time() +
                              ", when its heartbeat pauses: running or stopped, it is not known");
      else if (r->seq < op.seq && !r->inside)
        add(absent, peer, "last entered " + r->kind + " #" + std::to_string(r->seq) +
                              ", and running: its heartbeat went on, outside any call of this communicator");
      // A peer inside an earlier call and beating waits there for another
      // (a rank that finished a ring all_reduce early and went on waits for
      // peers still inside it, who wait for the frozen one): named only
      // when no other rank stands out.
      else if (r->seq < op.seq)
        add(behind, peer, "last entered " + r->kind + " #" + std::to_string(r->seq));
    }
    if (!stopped.empty() && !absent.empty()) return stopped + ", " + absent;
    if (!stopped.empty() || !absent.empty()) return stopped + absent;
    return behind;
  } catch (const Error& e) {
    // The store stopped answering while the heartbeats were watched: the
    // diagnosis lost its last clause without a word (a review helper's case).
    return std::string("not known: ") + e.what();
  }
}

void StatusBoard::publish_abort(const std::string& reason) {
  if (!store_) return;
  ask(Clock::now() + budget(), [&](Clock::time_point deadline) { store_->set(key("abort", rank_), reason, deadline); });
}

std::string setup_failed_key(const std::string& key_prefix) { return key_prefix + "/setup/failed"; }

std::string StatusBoard::abort_reason(int peer) {
  if (!store_) return {};
  try {
    const auto deadline = Clock::now() + budget();
    if (auto value = fetch(key("abort", peer), deadline)) return std::string(value->begin(), value->end());
    auto value = fetch(setup_failed_key(prefix_), deadline);
    if (!value) return {};
    const std::string text(value->begin(), value->end());
    const auto bar = text.find('|');
    if (bar == std::string::npos) return text;
    const std::string who = "rank " + text.substr(0, bar), reason = text.substr(bar + 1);
    // The set-up failure of another rank, which this peer's may echo.
    if (std::atoi(text.c_str()) == peer || reason.starts_with(who + " ")) return reason;
    return who + " could not set up this communicator: " + reason;
  } catch (const Error&) {
    return {};
  }
}

}  // namespace braid::comm
