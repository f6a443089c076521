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
// control region, with an immediate of kCreditImm so the sender wakes up;
// a ring is never overrun, and a peer that writes beyond its credits is
// reported as sending garbage.
//
// Keepalive: RC reports a peer that stopped answering only through a write
// of this rank's own that runs out of retries, and soft-RoCE drops packets
// to a destroyed queue pair without a word. A rank blocked on a peer (a
// receive, or a send out of credits) with no write outstanding to it would
// therefore wait for a dead peer until BRAID_TIMEOUT. So once progress() has
// seen nothing advance for kKeepaliveInterval, it posts to each peer it
// waits on and has no write outstanding to an 8-byte signaled RDMA write
// (no immediate) into the keepalive word of that peer's control block, at
// most once per interval. The peer's adapter acknowledges it without its
// process or a receive; nothing reads the word, so the ring and credit
// protocol never see it. A dead peer's write fails after the queue pair's
// retries (connection.cc: under 2 s) as "retries exhausted", a
// RemoteError naming the peer. Data that flows never triggers a keepalive.
//
// Every sender first copies into a registered staging slot: registering
// caller buffers (a bounded registration cache), direct RDMA writes of large
// messages into the peer's registered buffer (find_region / map_region) and
// striping over BRAID_IB_QPS_PER_PEER queue pairs are not implemented yet.
#pragma once

#include "comm/transport/transport_only.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/ibverbs/connect.h"
#include "comm/transport/ibverbs/device.h"
#include "comm/transport/ibverbs/memory.h"
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

class IbTransport final : public Transport {
 public:
  // One peer's queue pair and both directions' counters. Counters count
  // pieces since set-up and never wrap in practice (64 bits).
  struct Peer {
    int rank = -1;
    ibv_qp* qp = nullptr;
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
  void shutdown() override;
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
  };

 private:
  struct Request {
    bool done = false, in_place = false;
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
  void keep_alive();
  void on_receive(Peer& peer, const ibv_wc& wc);
  void post_receive(Peer& peer);
  bool pump_sends(Peer& peer);
  void post_piece(Peer& peer, Request& r);
  bool pump_recvs(Peer& peer);
  void take_piece(Peer& peer, Request& r);
  void free_slots(Peer& peer);
  void send_credits(Peer& peer);
  void post_write(Peer& peer, std::uint64_t wr_id, const void* local, std::uint32_t lkey, std::uint32_t bytes,
                  std::uint64_t remote, std::uint32_t rkey, bool with_imm, std::uint32_t imm);
  void wait_events(Clock::time_point deadline);
  void drain_async_events();
  [[noreturn]] void fail_completion(Peer& peer, const ibv_wc& wc);

  int rank_;
  std::size_t slot_bytes_;
  std::uint64_t slots_;
  std::chrono::nanoseconds spin_;
  std::unique_ptr<Verbs> verbs_;
  Registered ring_, staging_, control_;
  std::vector<Peer> peers_;
  std::vector<int> index_by_rank_;  // -1 for ranks not connected
  RequestPool<Request> requests_;
  StagingPool staging_pool_;
  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0};
  bool shut_down_ = false;
  Clock::time_point next_keepalive_;  // nothing advanced since this minus kKeepaliveInterval
};

}  // namespace braid::comm::ibverbs
