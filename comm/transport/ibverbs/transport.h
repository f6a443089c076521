// The RDMA transport over libibverbs: one reliable-connected queue pair to
// every peer, set up through the store by connect_ibverbs() (connection.cc),
// driven by the completion queue in the thread running the current operation.
//
// Wire protocol. Each rank registers, per peer, a receive ring of `slots`
// slots of `slot_bytes` each, and tells the peer its address and rkey at
// set-up. A message (WireHeader + payload, as on every transport) is cut
// into pieces of at most slot_bytes; piece n of a direction goes into slot
// n % slots with one RDMA write-with-immediate whose immediate is the
// piece's byte count. RC delivers writes in order, so the receiver knows
// which slot each completion names by counting. The receiver copies the
// header out of the first piece and checks it (header_mismatch) before any
// payload byte reaches the caller; a single-piece message received as a view
// is handed out straight from its slot until release().
//
// Credits: the sender may have at most `slots` pieces the receiver has not
// freed. The receiver frees slots in order and tells the sender how many it
// has freed so far by RDMA-writing that count into a word of the sender's
// control region, with an immediate of kCreditImm so the sender wakes up:
// once half the ring is freed, or at once when the sender has used up its
// credits. Every ring piece going the other way carries the count as well
// (its low 10 bits, in the immediate: ids.h), so traffic both ways needs no
// credit writes at all. A ring is never overrun, and a peer that writes
// beyond its credits is reported as sending garbage.
//
// A send that went whole through the ring is done once its last piece is
// posted (its bytes are in this rank's staging slots), not when the write is
// acknowledged: a small exchange costs half a round trip, not a round trip.
//
// Keepalive: RC reports a peer that stopped answering only through a write
// of this rank's own that runs out of retries, and soft-RoCE drops packets
// to a destroyed queue pair without a word. A rank blocked on a peer (a
// receive, or a send out of credits) with no write outstanding to it would
// therefore wait for a dead peer until BRAID_TIMEOUT. So once progress() has
// seen nothing posted to a peer or advance with it for kKeepaliveInterval
// (a clock per peer: data flowing to another, read from the clock now and
// then, held back the probe of a dead one until it stopped), it posts to
// each such peer it waits on and has no write outstanding to an 8-byte
// signaled RDMA write
// (no immediate) into the keepalive word of that peer's control block, at
// most once per interval. The peer's adapter acknowledges it without its
// process or a receive; nothing reads the word, so the ring and credit
// protocol never see it. A dead peer's write fails after the queue pair's
// retries (connection.cc: under 2 s) as "retries exhausted", a
// RemoteError naming the peer. Data that flows never triggers a keepalive.
//
// What the keepalive leans on, checked too, since either failing left a
// rank waiting until BRAID_TIMEOUT:
//  - a write's retries end: a peer waited on that has had a write
//    outstanding and nothing from it (no completion, a keepalive's
//    included, no data) and nothing posted to it for half of BRAID_TIMEOUT
//    (from 2 s on, at least twice the longest its retries can take,
//    connection.cc), plus the time its direct writes in flight take at
//    kSlowestLinkBytesPerSecond, is named as not answering (a retry count
//    the device does not keep, or a completion it never makes); a peer
//    that is only slow to post its receives answers every keepalive;
//  - the device reports a port that went down (an asynchronous event):
//    while a peer is due for a probe, the port's state is read as well, at
//    most once per kKeepaliveInterval, and a port no longer active fails
//    the transport as its event does.
//
// Farewell: a rank whose communicator fails writes why (its first
// kFarewellBytes - 1 bytes) into each peer's control block with an
// immediate of kFarewellImm before it shuts down (the drain lets the write
// land); a peer fails at once with that reason and the rank's name, even
// when the store, which carries the reason too, was served by that rank.
//
// Large messages (payload of at least kDirectMinBytes) are written straight
// from the sender's buffer into the receiver's when the receiver is ready
// (direct.cc):
//  - the receiver, as soon as it posts the receive, registers its buffer
//    (RegistrationCache, memory.h) and writes a clear-to-send (Cts) into the
//    sender's control block: the header it expects, the buffer's address
//    and rkey and the registration that covers it (or "no offer" when the
//    buffer cannot be registered); at most kCtsSlots are outstanding;
//  - when the sender starts the message and the Cts for it is already
//    there, offers a buffer and expects exactly this header, it checks that
//    the range lies in the advertised registration (a peer advertising more
//    is refused by name), writes the payload in stripes over the peer's
//    queue pairs (BRAID_IB_QPS_PER_PEER), the last write of each with an
//    immediate (kStripeImm), and puts the header alone in the ring, flagged
//    (kDirectHeader); RC delivers each queue pair's writes in order, so the
//    receiver, having taken the flagged header in ring order, has the
//    message once every stripe's immediate is in;
//  - otherwise (no Cts after a few round trips, no offer, another header, a
//    source that cannot be registered) the message goes through the ring
//    like a small one, and the receiver takes it as such. The sender waits
//    for a Cts only that long (cts_wait_, from the path proof's round trip,
//    20 us to 2 ms): a send completes without its receive being posted, as
//    on the ring, so schedules that wait for their sends before posting
//    receives cannot deadlock.
#pragma once

#include "comm/transport/transport_only.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/transport/ibverbs/connect.h"
#include "comm/transport/ibverbs/device.h"
#include "comm/transport/ibverbs/memory.h"
#include "comm/transport/poll_interrupt.h"
#include "comm/transport/pools.h"
#include "comm/transport/transport.h"

struct ibv_context;
struct ibv_pd;
struct ibv_comp_channel;
struct ibv_cq;
struct ibv_qp;
struct ibv_wc;

namespace braid::runtime {
class Store;
}

namespace braid::comm::ibverbs {

class IbTransport;

inline constexpr std::uint64_t kDirectMinBytes = 64u << 10;
inline constexpr int kCtsSlots = 8;
inline constexpr int kMaxQpsPerPeer = 8;
inline constexpr std::size_t kFarewellBytes = 512;

// A receiver's clear-to-send for one large message (direct.cc).
struct Cts {
  WireHeader expected;
  std::uint64_t seq = 0;           // counts this direction's large messages from 0
  std::uint64_t address = 0;       // where the payload goes
  std::uint64_t region_base = 0;   // the registration that covers it
  std::uint64_t region_bytes = 0;
  std::uint32_t rkey = 0;
  std::uint32_t offer = 0;  // 0: no direct write, send through the ring
};

// Why the sender of `payload_bytes` refuses `cts`, or "" (direct.cc).
std::string advertised_range_error(const Cts& cts, std::uint64_t payload_bytes, int rank, int peer);

// How many queue pairs carry a direct write of `payload_bytes`.
int stripes_of(std::uint64_t payload_bytes, int qps);

// Chooses the device, port and GID (device.h; logged at info), creates one
// RC queue pair per peer, exchanges the connection data through the store
// under <prefix>/ibverbs/<from>/<to> (bound to the job token, checked on
// arrival), brings the queue pairs up and proves each path with an RDMA write
// each way. A wrong GID index or an unroutable peer fails here with an error
// naming both ranks, the device, the GID index and the remedy.
std::unique_ptr<IbTransport> connect_ibverbs(runtime::Store& store, const std::string& key_prefix,
                                             const IbOptions& options);

// The verbs objects of one device, destroyed in the right order.
struct Verbs {
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  GidEntry gid;  // the device, port and GID in use
  Verbs() = default;
  Verbs(const Verbs&) = delete;
  Verbs& operator=(const Verbs&) = delete;
  ~Verbs();
};

// What a peer told this rank at set-up about its end of the pair.
struct RemoteEnd {
  std::uint64_t ring_address = 0;  // its ring for this rank's pieces
  std::uint32_t ring_rkey = 0;
  std::uint64_t credit_address = 0;  // the word in its control region this rank's credits go to
  std::uint32_t control_rkey = 0;
};

struct TestAccess;  // tests/rdma/programs/forge_cts.cc

class IbTransport final : public Transport {
 public:
  // One peer's queue pair and both directions' counters. Counters count
  // pieces since set-up and never wrap in practice (64 bits).
  struct Peer {
    int rank = -1;
    std::vector<ibv_qp*> qps;  // qps[0] carries the ring, credits and Cts; all carry stripes
    RemoteEnd remote;
    // sending
    std::uint64_t posted = 0, completed = 0;  // pieces written, and locally completed
    std::uint64_t credits = 0;                // pieces the peer has freed
    std::size_t front_posted = 0;             // header + payload bytes of sends.front() posted
    std::deque<RequestId> sends, sending;     // not yet fully posted; posted, not completed
    // receiving
    std::uint64_t arrived = 0, taken = 0, freed = 0, credits_sent = 0;
    int credit_writes = 0;  // credit writes not yet completed
    std::vector<std::uint32_t> piece_bytes;  // per slot, of the piece that arrived there
    std::vector<bool> held;                  // slots lent out as views
    int held_count = 0;
    std::deque<RequestId> recvs;
    bool proved = false;
    bool keepalive_pending = false;  // a keepalive write not yet completed
    // The keepalive's clock, per peer: something posted to or advanced
    // with this peer since probe_when_due last looked, and when it probes
    // this peer, if it waits on it, next.
    bool active = true;
    Clock::time_point next_keepalive{};
    // A write posted to this peer or a completion of any kind with it (a
    // keepalive's too) since probe_when_due last looked, and when it last
    // saw one or `active`.
    bool answered = false;
    Clock::time_point answered_at{};
    // large messages (direct.cc)
    std::uint64_t cts_sent = 0, large_done = 0;     // receiving: Cts written, large receives completed
    std::uint64_t cts_arrived = 0, large_sent = 0;  // sending: Cts received, large messages started
    int cts_writes = 0;                              // Cts writes not yet completed
    std::vector<std::uint64_t> stripes_arrived, stripes_taken;  // per queue pair
    std::vector<std::deque<RequestId>> direct_writes;  // per queue pair, in posting order
    std::string failure;  // a refused Cts: thrown once the request-to-send is out
  };

  IbTransport(const IbOptions& options, std::unique_ptr<Verbs> verbs, std::vector<Peer> peers,
              Registered ring, Registered staging, Registered control);
  ~IbTransport() override;

  std::string_view name() const override { return "ibverbs"; }
  RequestId post_send(int peer, const WireHeader& header, const void* data) override;
  RequestId post_recv(int peer, const WireHeader& expected, void* data, Placement placement) override;
  bool is_done(RequestId request) override;
  std::span<const std::byte> view(RequestId request) override;
  void release(RequestId request) override;
  bool progress(Clock::time_point deadline) override;
  void interrupt() override { interrupt_.raise(); }
  void shutdown() override;
  void farewell(const std::string& reason) override;
  std::uint64_t bytes_sent() const override { return bytes_sent_; }
  std::uint64_t bytes_received() const override { return bytes_received_; }

  // Set-up: an 8-byte RDMA write to every peer, waited for until `deadline`.
  void prove_paths(Clock::time_point deadline);

  // Layout of the control region: one block per peer index.
  struct ControlBlock {
    std::uint64_t credit_in;   // written by the peer: pieces it has freed of this rank's
    std::uint64_t credit_out;  // source of this rank's credit writes to the peer
    std::uint64_t proof_in;    // written by the peer's path proof
    std::uint64_t proof_out;   // source of this rank's path proof
    std::uint64_t keepalive_in;   // written by the peer's keepalives; never read
    std::uint64_t keepalive_out;  // source of this rank's keepalives
    std::uint64_t pad[2];
    Cts cts_in[kCtsSlots];   // written by the peer: its clear-to-sends for this rank's large messages
    Cts cts_out[kCtsSlots];  // sources of this rank's clear-to-sends
    char farewell_in[kFarewellBytes];   // written by the peer when it fails: why (farewell())
    char farewell_out[kFarewellBytes];  // source of this rank's farewell
  };

 private:
  friend struct TestAccess;
  enum class Mode : std::uint8_t { ring, large, direct };  // large: protocol not settled yet
  struct Request {
    bool done = false, in_place = false;
    Mode mode = Mode::ring;
    bool offered = false;             // receives: its Cts is out (an offer when `key` is set)
    std::optional<MemoryKey> key;     // the registration pinned for a direct write
    int writes_left = 0;              // sends: direct writes not yet completed
    Clock::time_point cts_wait_until{};  // sends: when it stops waiting for its Cts
    int peer = -1;
    WireHeader header, received;
    std::byte* data = nullptr;
    std::size_t moved = 0;       // receives: header + payload bytes taken
    std::uint64_t last_piece = 0;  // sends: the counter value of its last piece
    std::size_t held_slot = 0;
    Staging staging;
  };

  RequestId allocate(int peer, const WireHeader& header);
  Peer& peer_of(int rank);
  std::size_t index_of(const Peer& peer) const { return static_cast<std::size_t>(&peer - peers_.data()); }
  std::byte* ring_slot(const Peer& peer, std::uint64_t piece) const;
  std::byte* staging_slot(const Peer& peer, std::uint64_t piece) const;
  ControlBlock& control(const Peer& peer) const;

  bool pump_all();
  int poll_completions();
  bool on_completion(const ibv_wc& wc);
  // Probes `peer` (the keepalive), or, where a write to it is outstanding
  // already and nothing has completed for write_stall_limit_, fails.
  void keep_alive(Peer& peer, Clock::time_point now);
  // Throws the port-down error where the port's state is no longer active.
  void check_port();
  // The keepalive's clock: probes (keep_alive) each peer once
  // kKeepaliveInterval has passed with nothing posted to it or advanced
  // with it, whether progress() blocks, polls, or moves data for others.
  void probe_when_due(Clock::time_point now);
  // pump_all() for progress(): every kTurnsPerProbeLook turns that moved
  // something, the clock is read and the peers due are probed too.
  bool pump_and_probe();
  void on_receive(Peer& peer, const ibv_wc& wc);
  void post_receive(Peer& peer, int qp);
  bool pump_sends(Peer& peer);
  void post_piece(Peer& peer, Request& r, std::size_t limit = ~std::size_t{0}, std::uint32_t flags = 0);
  bool can_post_piece(const Peer& peer) const;
  void retire_sends(Peer& peer);
  // direct.cc
  bool start_large(Peer& peer, Request& r, bool& advanced);
  void write_direct(Peer& peer, Request& r, const Cts& cts);
  void offer_cts(Peer& peer);
  bool take_stripes(Peer& peer, Request& r);
  void unpin(Request& r);
  bool pump_recvs(Peer& peer);
  void take_piece(Peer& peer, Request& r);
  void count_freed(Peer& peer);
  void free_slots(Peer& peer);
  void send_credits(Peer& peer);
  void post_write(Peer& peer, std::uint64_t wr_id, const void* local, std::uint32_t lkey, std::uint32_t bytes,
                  std::uint64_t remote, std::uint32_t rkey, bool with_imm, std::uint32_t imm, int qp = 0);
  void wait_events(Clock::time_point deadline);
  void drain(Clock::time_point deadline);
  void drain_async_events();
  [[noreturn]] void fail_completion(Peer& peer, const ibv_wc& wc);

  int rank_;
  std::size_t slot_bytes_;
  std::uint64_t slots_;
  std::chrono::nanoseconds spin_;
  std::unique_ptr<Verbs> verbs_;
  Registered ring_, staging_, control_;
  RegistrationCache cache_;  // after verbs_: unregistered before the protection domain goes
  std::vector<Peer> peers_;
  std::vector<int> index_by_rank_;  // -1 for ranks not connected
  RequestPool<Request> requests_;
  StagingPool staging_pool_;
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0};
  std::uint64_t direct_sent_ = 0, direct_bytes_ = 0;  // logged at shutdown
  bool shut_down_ = false;
  std::int64_t writes_in_flight_ = 0;  // signaled writes posted and not yet completed (drain)
  Clock::time_point next_keepalive_;  // the earliest of the peers' next_keepalive (progress() wakes for it)
  Clock::time_point next_event_look_;  // when a polled progress() next reads the device's event queue
  Clock::time_point next_port_look_;   // when probe_when_due next reads the port's state
  std::chrono::nanoseconds write_stall_limit_;  // half of BRAID_TIMEOUT (the keepalive's note)
  std::uint32_t moving_turns_ = 0;     // pump_and_probe()'s count
  std::chrono::nanoseconds cts_wait_{};  // set by prove_paths
  Clock::time_point wake_by_ = Clock::time_point::max();  // a large send stops waiting for its Cts
  PollInterrupt interrupt_;  // wait_events watches it
};

}  // namespace braid::comm::ibverbs
