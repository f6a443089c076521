// StatusBoard: publishes, for timeout attribution, where this rank is on a
// communicator, and reads its peers'.
//
// entered() and left() only store atomics (they run on every call); the
// operation's Exchange stores the peer it is blocked on. A background
// thread publishes a record to the store every 100 ms, with a new
// heartbeat, inside an operation and for 10 s between operations:
//   "<kind> #<seq> <in|out|idle> <peer waited for, or -1> <beat>"
// A frozen process (SIGSTOP, a debugger) stops beating, inside a call or
// between calls; one computing between calls (or in a livelock of user
// code) beats on, "out", until it reports the communicator "idle" once,
// 10 s after its last call, and pauses (a job's many rarely used torch
// groups do not each write to the store 10 times a second).
//
// A receive that waits for a peer which reports a collective after it
// (engine_p2p.cc: look_for_collectives_instead) asks that peer whether it
// issued the send: ask_sent() counts a probe up in the store, and the
// peer's heartbeat thread, once it has been inside one call for 250 ms,
// answers with that call and how many sends it has issued to each rank,
// read in that order (sent(), counted as each send is issued), so an
// answer inside a collective whose count for the asker is short of the
// receive proves the send comes, if ever, after that collective.
//
// When a wait times out, the waiting rank asks holder() which rank holds
// the call up: one that is silent (its beat did not move in 600 ms while it
// must every 100 ms), inside a call or between calls; one that has not
// entered it and beats ("last entered barrier #3, and running"); one still
// inside an earlier call and beating waits there for another, and is named
// only when no other rank stands out — not merely the neighbour it waits
// for, who may itself be waiting. The board also carries abort reasons: a
// rank that fails writes its error before closing its connections, so peers
// that see the connection drop can say why.
//
// Those reads and that write are the failure path's, after a wait has
// already timed out, and the store may not answer them: the process serving
// it (rank 0 under torchrun, srun and mpirun) may be the one that froze. The
// store's one connection is then held by a heartbeat that waits out a whole
// request timeout (BRAID_TIMEOUT), so each of these calls is bounded by a
// budget of its own instead: a quarter of that timeout, at most 2 s
// (holder() 600 ms more). Once the store has failed to answer one, the
// others do not ask it again (a board serves one failure: its communicator
// aborts on the first) and say that the store did not answer. Nor does the
// destructor wait out such a heartbeat: it leaves the thread to end on its
// own, so a process exits on time after its store froze.
//
// Departure from DESIGN.md's invariant 2 ("an error on every other rank
// within the configured timeout"): a timed-out collective's error comes
// after this diagnosis, 600 ms past BRAID_TIMEOUT (the heartbeats
// watched), plus up to the budget above where the store does not answer.
// The README's BRAID_TIMEOUT row says so.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/types.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm {

// Where a rank whose set-up of the communicator with `key_prefix` failed
// publishes "<rank>|<reason>" (setup.cc); the first failure stays.
std::string setup_failed_key(const std::string& key_prefix);

class StatusBoard {
 public:
  StatusBoard(std::shared_ptr<runtime::Store> store, std::string key_prefix, int rank, int size);
  ~StatusBoard();

  // `waiting_for` holds the peer the operation is blocked on (-1: none); the
  // board reads it until the next entered().
  void entered(const Op& op, const std::atomic<int>* waiting_for = nullptr);
  void left(const Op& op);
  // A send to `peer` was issued: its number `seq` is how many so far.
  void sent(int peer, std::uint64_t seq) { sent_[static_cast<std::size_t>(peer)].store(seq, std::memory_order_release); }
  // "last entered all_gather #811", "last entered all_reduce #5 and waits
  // there for rank 3", "has reported no call ...", "could not be
  // asked: the store did not answer within 1000 ms ..."; where this rank
  // waits in call `seq` and the peer's report, between calls, is more than
  // one call behind, it says that the report may be stale.
  std::string describe_peer(int peer, std::uint64_t seq);
  // Which rank holds up `op` for a rank that timed out in it, e.g.
  // "rank 2 (inside all_reduce #5 but its heartbeat stood still ...)",
  // "rank 2 (after all_reduce #503 (its last report) or a later call up
  // to #589, and its heartbeat stood still ...)" or "rank 2
  // (last entered barrier #3, and running: ...)". Takes 600 ms (it watches
  // the heartbeats) plus the budget. Empty when no rank stands out, the
  // store had already failed to answer (describe_peer says so), or `op` is
  // point-to-point; "not known: <why>" when the store stops answering
  // while it watches.
  // `gone(peer)`, where given, says why a rank whose heartbeat stood
  // still will not answer (Transport::gone): it is then named for that,
  // not as stopped or frozen.
  std::string holder(const Op& op, int size, const std::function<std::string(int peer)>& gone = {});
  // The host names of a communicator across hosts, by rank: holder() then
  // names each rank's ("rank 2 (on node1, inside ...)").
  void set_hosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }
  // The collective `peer` last reported entering (its kind and number), or
  // none: no report yet, its last report a send or a receive, or the store
  // did not answer within 500 ms (once: it is not asked again). For a
  // receive that waits over a transport without shared slots (engine_p2p.cc).
  struct Reached {
    std::string kind;
    std::uint64_t seq = 0;
  };
  std::optional<Reached> collective_reached(int peer);
  // Whether `peer` issued its send #`seq` to this rank, in its own answer
  // (above): `pending` until it answers (the first call asks); `unsent`
  // where it answered from inside a collective at or past `next_collective`
  // (named in `inside`) with fewer sends to this rank, which proves the
  // receive will not get it; `sent` otherwise. A store that leaves one
  // request unanswered for 500 ms turns these looks off (pending).
  struct SendAnswer {
    enum State { pending, sent, unsent } state = pending;
    std::string inside;
  };
  SendAnswer ask_sent(int peer, std::uint64_t seq, std::uint64_t next_collective);
  void publish_abort(const std::string& reason);
  // The reason a peer published when it aborted, or, where it published
  // none, why this communicator's set-up failed (setup_failed_key): a peer
  // whose set-up failed after others had finished theirs closes
  // connections they already use, and they knew only that it had closed or
  // exited (helper-133's F2). Empty where neither is published.
  std::string abort_reason(int peer);

 private:
  struct Record {
    std::string kind;
    std::uint64_t seq = 0;
    bool inside = false;
    bool idle = false;  // between calls for 10 s or more: its heartbeat pauses
    int waiting_for = -1;
    std::uint64_t beat = 0;
  };
  using Clock = std::chrono::steady_clock;
  struct Beat;
  static void run(StatusBoard* board, std::shared_ptr<Beat> beat, std::shared_ptr<runtime::Store> store);
  std::string key(const char* what, int rank) const;
  // The failure path's calls on the store, bounded by `deadline`, once the
  // store has answered every earlier one in time. ask() runs `request`
  // (given the deadline) and says whether it did; fetch() throws
  // TimeoutError saying what unanswered() says where it did not.
  bool ask(Clock::time_point deadline, const std::function<void(Clock::time_point)>& request);
  std::optional<std::vector<std::uint8_t>> fetch(const std::string& key, Clock::time_point deadline);
  std::string unanswered();
  std::chrono::milliseconds budget() const;
  std::optional<Record> read(int peer, Clock::time_point deadline);
  std::string current() const;
  std::string answer(std::int64_t probe) const;
  static std::optional<Record> parse(const std::vector<std::uint8_t>& value);
  std::vector<std::optional<Record>> read_all(int size, Clock::time_point deadline);

  std::shared_ptr<runtime::Store> store_;
  std::string prefix_;
  int rank_;
  std::vector<std::string> hosts_;  // set_hosts; empty on one host
  // The call last entered: its number << 8 | its OpKind, in one word so that
  // the heartbeat never pairs one call's kind with another's number.
  std::atomic<std::uint64_t> state_{0};
  std::atomic<std::uint64_t> left_seq_{0};
  std::vector<std::atomic<std::uint64_t>> sent_;  // sends issued, by peer
  std::mutex asked_mu_;
  std::map<int, std::int64_t> asked_;  // ask_sent: the probe number each peer's answer must reach
  std::atomic<const std::atomic<int>*> waiting_for_{nullptr};
  // What the heartbeat thread shares with the board. The thread may outlive
  // it: a beat the store leaves unanswered holds the thread for the store's
  // request timeout, and the destructor does not wait that long (it leaves
  // the thread to end on its own, holding only this and the store).
  struct Beat {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;    // set by the destructor: the thread no longer touches the board
    bool exited = false;  // set by the thread as it ends
  };
  std::shared_ptr<Beat> beat_ = std::make_shared<Beat>();
  std::thread thread_;
  std::mutex unanswered_mu_;
  std::string unanswered_;  // why the failure path no longer asks the store; empty while it does
  std::atomic<bool> looks_off_{false};  // collective_reached or ask_sent found the store slow once
};

}  // namespace braid::comm
