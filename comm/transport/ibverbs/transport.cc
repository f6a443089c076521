// The data path of the ibverbs transport (the protocol is in transport.h).
#include "comm/transport/ibverbs/transport.h"
#include "comm/transport/ibverbs/ids.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "runtime/errors.h"

namespace braid::comm::ibverbs {
namespace {

constexpr std::size_t kHeaderBytes = sizeof(WireHeader);
// Registration cache bounds (memory.h): enough for a few large buffers of a
// training job, far below what RLIMIT_MEMLOCK usually allows on RDMA hosts.
constexpr std::size_t kCacheBytes = std::size_t{1} << 30;
constexpr std::size_t kCacheEntries = 64;
constexpr int kMaxCreditWrites = 2;
// How long progress() waits with nothing advancing before it probes the
// peers it waits on (the keepalive of transport.h): well below any sensible
// BRAID_TIMEOUT, and long enough that a job whose data flows never probes.
constexpr std::chrono::milliseconds kKeepaliveInterval{200};
// How many progress() turns that moved something go by between two looks
// at the peers' keepalive clocks (a clock read each): a turn moves a piece
// or a completion, microseconds at least.
constexpr std::uint32_t kTurnsPerProbeLook = 64;
// How often a polled progress() reads the device's event queue (a port that
// went down): one system call per look.
constexpr std::chrono::milliseconds kEventLook{10};
constexpr int kPollsPerClockRead = 8;
// Bounds of how long a large send waits for its receiver's clear-to-send.
constexpr std::chrono::microseconds kMinCtsWait{20}, kMaxCtsWait{2000};
// How long shutdown() lets writes already posted reach their peers.
constexpr std::chrono::milliseconds kDrainTime{500};


std::uint64_t load_acquire(const std::uint64_t& word) {
  return std::atomic_ref<const std::uint64_t>(word).load(std::memory_order_acquire);
}

}  // namespace

Verbs::~Verbs() {
  if (cq) ibv_destroy_cq(cq);
  if (channel) ibv_destroy_comp_channel(channel);
  if (pd) ibv_dealloc_pd(pd);
  if (context) ibv_close_device(context);
}

IbTransport::IbTransport(const IbOptions& options, std::unique_ptr<Verbs> verbs, std::vector<Peer> peers,
                         Registered ring, Registered staging, Registered control)
    : rank_(options.rank),
      slot_bytes_(options.slot_bytes),
      slots_(static_cast<std::uint64_t>(options.slots)),
      spin_(options.spin),
      verbs_(std::move(verbs)),
      ring_(std::move(ring)),
      staging_(std::move(staging)),
      control_(std::move(control)),
      cache_(verbs_->pd, kCacheBytes, kCacheEntries),
      peers_(std::move(peers)),
      index_by_rank_(static_cast<std::size_t>(options.size), -1),
      next_keepalive_(Clock::now() + kKeepaliveInterval),
      write_stall_limit_(options.timeout / 2) {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    index_by_rank_[peers_[i].rank] = static_cast<int>(i);
    peers_[i].answered_at = Clock::now();
    peers_[i].piece_bytes.assign(slots_, 0);
    peers_[i].held.assign(slots_, false);
    peers_[i].stripes_arrived.assign(peers_[i].qps.size(), 0);
    peers_[i].stripes_taken.assign(peers_[i].qps.size(), 0);
    peers_[i].direct_writes.resize(peers_[i].qps.size());
  }
}

IbTransport::~IbTransport() { shutdown(); }

// First the writes already posted are given up to kDrainTime to complete:
// a failing rank's last messages often carry what tells its peers why (the
// header of a mismatched call, which each peer then names itself), and
// destroying a queue pair drops what is still in flight. Then destroying
// the queue pairs makes a peer's next write to this rank fail
// with retry exceeded, so peers blocked on this rank learn of it within the
// queue pairs' retry time (connection.cc) rather than waiting out the timeout.
void IbTransport::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  drain(Clock::now() + kDrainTime);
  std::uint64_t large = 0;
  for (const auto& peer : peers_) large += peer.large_sent;
  spdlog::debug("ibverbs: rank {} wrote {} large message(s) directly ({} bytes), sent {} through the ring; "
                "{} bytes registered in its cache",
                rank_, direct_sent_, direct_bytes_, large - direct_sent_, cache_.registered_bytes());
  for (auto& peer : peers_)
    for (ibv_qp*& qp : peer.qps)
      if (qp) {
        ibv_destroy_qp(qp);
        qp = nullptr;
      }
}

void IbTransport::farewell(const std::string& reason) {
  if (shut_down_) return;
  for (auto& peer : peers_) {
    if (peer.qps.empty() || !peer.qps[0]) continue;
    char* out = control(peer).farewell_out;
    const std::size_t bytes = std::min(reason.size(), kFarewellBytes - 1);
    std::memcpy(out, reason.data(), bytes);
    out[bytes] = '\0';
    try {
      post_write(peer, wr_id(Work::farewell, index_of(peer)), out, control_.lkey(),
                 static_cast<std::uint32_t>(bytes + 1),
                 peer.remote.credit_address + offsetof(ControlBlock, farewell_in), peer.remote.control_rkey, true,
                 kFarewellImm);
    } catch (const Error&) {  // best effort: the queue pair may be gone already
    }
  }
}

IbTransport::Peer& IbTransport::peer_of(int rank) {
  int index = rank >= 0 && rank < static_cast<int>(index_by_rank_.size()) ? index_by_rank_[rank] : -1;
  if (index < 0)
    throw InvalidUsage("rank " + std::to_string(rank_) + " has no RDMA connection to rank " + std::to_string(rank));
  return peers_[static_cast<std::size_t>(index)];
}

std::byte* IbTransport::ring_slot(const Peer& peer, std::uint64_t piece) const {
  return ring_.data() + (index_of(peer) * slots_ + piece % slots_) * slot_bytes_;
}

std::byte* IbTransport::staging_slot(const Peer& peer, std::uint64_t piece) const {
  return staging_.data() + (index_of(peer) * slots_ + piece % slots_) * slot_bytes_;
}

IbTransport::ControlBlock& IbTransport::control(const Peer& peer) const {
  return reinterpret_cast<ControlBlock*>(control_.data())[index_of(peer)];
}

RequestId IbTransport::allocate(int peer, const WireHeader& header) {
  RequestId id = requests_.acquire();
  Request& r = requests_[id];
  r.peer = peer;
  r.header = header;
  return id;
}

// A ring message that is the only one queued to its peer goes on the wire
// at once, not at the next progress(): a small call's first message leaves
// before anything else of the call runs (on rxe the post is a system call in
// which the packet is sent). It carries the freshest credits: the slots
// released since the last progress() are counted first, with no credit
// write of their own.
RequestId IbTransport::post_send(int peer, const WireHeader& header, const void* data) {
  Peer& p = peer_of(peer);
  RequestId id = allocate(peer, header);
  requests_[id].data = static_cast<std::byte*>(const_cast<void*>(data));
  if (header.payload_bytes >= kDirectMinBytes) requests_[id].mode = Mode::large;
  p.sends.push_back(id);
  p.active = true;  // a new operation: not blocked yet
  if (p.sends.size() == 1 && requests_[id].mode != Mode::large && !shut_down_) {
    count_freed(p);
    pump_sends(p);
  }
  return id;
}

RequestId IbTransport::post_recv(int peer, const WireHeader& expected, void* data, Placement) {
  Peer& p = peer_of(peer);
  RequestId id = allocate(peer, expected);
  requests_[id].data = static_cast<std::byte*>(data);
  if (expected.payload_bytes >= kDirectMinBytes) requests_[id].mode = Mode::large;
  p.recvs.push_back(id);
  p.active = true;
  return id;
}

bool IbTransport::is_done(RequestId request) { return requests_.at(request).done; }

std::span<const std::byte> IbTransport::view(RequestId request) {
  const Request& r = requests_.at(request);
  return {r.data, static_cast<std::size_t>(r.header.payload_bytes)};
}

// A view lent from the ring gives its slot back; the credit goes out with
// the next progress().
void IbTransport::release(RequestId request) {
  Request& r = requests_.at(request);
  if (r.in_place) {
    Peer& p = peer_of(r.peer);
    p.held[r.held_slot] = false;
    --p.held_count;
  }
  unpin(r);
  staging_pool_.give_back(std::move(r.staging));
  requests_.release(request);
}

void IbTransport::post_write(Peer& peer, std::uint64_t id, const void* local, std::uint32_t lkey,
                             std::uint32_t bytes, std::uint64_t remote, std::uint32_t rkey, bool with_imm,
                             std::uint32_t imm, int qp) {
  ibv_sge sge{reinterpret_cast<std::uint64_t>(local), bytes, lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  if (int error = ibv_post_send(peer.qps[qp], &wr, &bad))
    throw SystemError(errno_message("rank " + std::to_string(rank_) + " could not post " +
                                        operation(kind_of(id)) + " to rank " + std::to_string(peer.rank),
                                    error));
  ++writes_in_flight_;
  peer.answered = true;  // the stall check counts from the newest write too
}

// Polls the completion queue, taking no action on what completes, until no
// write of this rank's is in flight or `deadline` passes (sleeping 1 ms
// between polls: a failing rank must not spin).
void IbTransport::drain(Clock::time_point deadline) {
  ibv_wc wcs[32];
  while (writes_in_flight_ > 0 && Clock::now() < deadline) {
    int n = ibv_poll_cq(verbs_->cq, 32, wcs);
    if (n < 0) return;
    for (int i = 0; i < n; ++i)
      if (kind_of(wcs[i].wr_id) != Work::receive) --writes_in_flight_;
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void IbTransport::post_receive(Peer& peer, int qp) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wr_id(Work::receive, index_of(peer), qp);
  if (int error = ibv_post_recv(peer.qps[qp], &wr, &bad))
    throw SystemError(errno_message("rank " + std::to_string(rank_) + " could not post an RDMA receive for rank " +
                                        std::to_string(peer.rank),
                                    error));
}

// Sends: copy the next piece of the front message into its staging slot and
// write it into the peer's ring, as long as credits and staging slots last.
bool IbTransport::pump_sends(Peer& peer) {
  bool advanced = false;
  while (!peer.sends.empty() && peer.failure.empty()) {
    Request& r = requests_[peer.sends.front()];
    const std::size_t total = kHeaderBytes + r.header.payload_bytes;
    if (r.mode == Mode::large && peer.front_posted == 0) {
      if (!can_post_piece(peer)) break;
      if (!start_large(peer, r, advanced)) break;
    }
    while (peer.front_posted < total && can_post_piece(peer)) {
      post_piece(peer, r);
      advanced = true;
    }
    if (peer.front_posted < total) break;
    r.last_piece = peer.posted - 1;
    if (r.writes_left == 0 && !r.key) {
      // Every byte is in this rank's staging slots: the caller's buffer is
      // free now, as a TCP send is once the socket took it. Waiting for the
      // writes' acknowledgement would make every small exchange a round
      // trip; a write that fails later still fails the next progress().
      r.done = true;
      bytes_sent_.fetch_add(r.header.payload_bytes, std::memory_order_relaxed);
    } else {
      peer.sending.push_back(peer.sends.front());
    }
    peer.sends.pop_front();
    peer.front_posted = 0;
  }
  return advanced;
}

bool IbTransport::can_post_piece(const Peer& peer) const {
  return peer.posted - peer.credits < slots_ && peer.posted - peer.completed < slots_;
}

// The next piece of the front message: at most a slot, at most `limit`
// bytes (a request-to-send is the header alone); `flags` ride in the
// immediate beside the byte count.
void IbTransport::post_piece(Peer& peer, Request& r, std::size_t limit, std::uint32_t flags) {
  const std::size_t total = kHeaderBytes + r.header.payload_bytes;
  const std::size_t offset = peer.front_posted, bytes = std::min({slot_bytes_, total - offset, limit});
  std::byte* slot = staging_slot(peer, peer.posted);
  std::size_t filled = 0;
  if (offset < kHeaderBytes) {
    filled = kHeaderBytes - offset;
    std::memcpy(slot, reinterpret_cast<const std::byte*>(&r.header) + offset, filled);
  }
  const std::size_t payload_offset = offset + filled - kHeaderBytes;
  if (bytes > filled) std::memcpy(slot + filled, r.data + payload_offset, bytes - filled);
  const std::uint64_t remote = peer.remote.ring_address + (peer.posted % slots_) * slot_bytes_;
  post_write(peer, wr_id(Work::data, index_of(peer)), slot, staging_.lkey(), static_cast<std::uint32_t>(bytes),
             remote, peer.remote.ring_rkey, true, piece_imm(bytes, peer.freed, flags));
  peer.credits_sent = peer.freed;  // the piece carries them
  ++peer.posted;
  peer.front_posted += bytes;
}

// Receives: take arrived pieces into the front request, header first.
bool IbTransport::pump_recvs(Peer& peer) {
  offer_cts(peer);
  bool advanced = false;
  while (!peer.recvs.empty()) {
    Request& r = requests_[peer.recvs.front()];
    if (r.mode == Mode::direct) {
      if (!take_stripes(peer, r)) break;
    } else {
      if (peer.taken == peer.arrived) break;
      // A large receive about to be taken that offer_cts above skipped (its
      // window was full, and the receives ahead of it completed in this
      // loop) is offered now, though its message comes through the ring:
      // the sender numbered it among its large messages, and a Cts number
      // left out put every later Cts one behind the sender's count, so
      // that no large message to this rank was written directly again (a
      // review helper's case).
      if (r.mode == Mode::large && !r.offered) offer_cts(peer);
      take_piece(peer, r);
    }
    advanced = true;
    if (!r.done) continue;
    bytes_received_.fetch_add(r.header.payload_bytes, std::memory_order_relaxed);
    if (r.offered) ++peer.large_done;
    unpin(r);
    peer.recvs.pop_front();
  }
  free_slots(peer);
  return advanced;
}

// The first piece's header is checked before a payload byte is copied; every
// piece's length must be the one the header implies (else the peer sent garbage).
void IbTransport::take_piece(Peer& peer, Request& r) {
  const std::uint64_t piece = peer.taken++;
  const std::byte* slot = ring_slot(peer, piece);
  const std::size_t bytes = peer.piece_bytes[piece % slots_] & kPieceBytesMask;
  const bool direct = peer.piece_bytes[piece % slots_] & kDirectHeader;
  std::size_t payload_from = 0;
  if (r.moved == 0) {
    if (bytes < kHeaderBytes)
      throw RemoteError("rank " + std::to_string(rank_) + " received a " + std::to_string(bytes) +
                            "-byte RDMA piece without a message header from rank " + std::to_string(peer.rank) +
                            " (garbage on the wire)",
                        peer.rank);
    std::memcpy(&r.received, slot, kHeaderBytes);
    std::string mismatch = header_mismatch(r.header, r.received, rank_, peer.rank);
    if (!mismatch.empty()) throw RemoteError(mismatch, peer.rank);
    payload_from = kHeaderBytes;
    if (direct) {  // the header of a message written directly: the stripes follow
      if (!r.key || bytes != kHeaderBytes)
        throw RemoteError("rank " + std::to_string(rank_) + " received a direct-write header from rank " +
                              std::to_string(peer.rank) + " for a buffer it never offered (garbage on the wire)",
                          peer.rank);
      r.moved = kHeaderBytes;
      r.mode = Mode::direct;
      return;
    }
    unpin(r);  // offered or not, this one comes through the ring
    r.mode = Mode::ring;
  }
  const std::size_t total = kHeaderBytes + r.header.payload_bytes;
  if (bytes != std::min(slot_bytes_, total - r.moved))
    throw RemoteError("rank " + std::to_string(rank_) + " received an RDMA piece of " + std::to_string(bytes) +
                          " bytes from rank " + std::to_string(peer.rank) + " where its message header implies " +
                          std::to_string(std::min(slot_bytes_, total - r.moved)) + " (garbage on the wire)",
                      peer.rank);
  if (!r.data && r.moved == 0 && bytes == total && peer.held_count < static_cast<int>(slots_ / 2)) {
    // A single-piece view is lent straight from the ring until release().
    r.in_place = true;
    r.held_slot = piece % slots_;
    peer.held[r.held_slot] = true;
    ++peer.held_count;
    r.data = const_cast<std::byte*>(slot) + kHeaderBytes;
  } else {
    if (!r.data) {
      r.staging = staging_pool_.take(r.header.payload_bytes);
      r.data = r.staging->data();
    }
    const std::size_t payload_offset = r.moved + payload_from - kHeaderBytes;
    std::memcpy(r.data + payload_offset, slot + payload_from, bytes - payload_from);
  }
  r.moved += bytes;
  r.done = r.moved == total;
}

// Slots are freed in ring order: a slot lent as a view holds back the ones after it.
void IbTransport::count_freed(Peer& peer) {
  while (peer.freed < peer.taken && !peer.held[peer.freed % slots_]) ++peer.freed;
}

void IbTransport::free_slots(Peer& peer) {
  count_freed(peer);
  send_credits(peer);
}

// Credits ride on every ring piece this rank sends the peer (post_piece);
// a credit write of their own goes only once half the ring is freed with
// none carried (a credit write costs the peer a completion and this rank a
// write), and at once, however few, when the sender has used every credit
// it had (all of its window arrived): a sender never waits on a batch.
void IbTransport::send_credits(Peer& peer) {
  const std::uint64_t batch = std::max<std::uint64_t>(1, slots_ / 2), fresh = peer.freed - peer.credits_sent;
  const bool sender_stalled = peer.arrived - peer.credits_sent >= slots_;
  if (fresh == 0 || (fresh < batch && !sender_stalled) || peer.credit_writes >= kMaxCreditWrites) return;
  ControlBlock& block = control(peer);
  std::atomic_ref<std::uint64_t>(block.credit_out).store(peer.freed, std::memory_order_release);
  post_write(peer, wr_id(Work::credit, index_of(peer)), &block.credit_out, control_.lkey(), sizeof(std::uint64_t),
             peer.remote.credit_address, peer.remote.control_rkey, true, kCreditImm);
  peer.credits_sent = peer.freed;
  ++peer.credit_writes;
}

void IbTransport::on_receive(Peer& peer, const ibv_wc& wc) {
  const int qp = qp_of(wc.wr_id);
  post_receive(peer, qp);  // this receive is used up; the peer may need another at once
  const std::uint32_t imm = ntohl(wc.imm_data);
  if (!(wc.wc_flags & IBV_WC_WITH_IMM))
    throw RemoteError("rank " + std::to_string(rank_) + " received an RDMA message without an immediate from rank " +
                          std::to_string(peer.rank) + " (not a braid peer?)",
                      peer.rank);
  if (imm == kStripeImm) {
    ++peer.stripes_arrived[static_cast<std::size_t>(qp)];
    return;
  }
  if (qp != 0)
    throw RemoteError("rank " + std::to_string(rank_) + " received ring traffic on a striping queue pair from rank " +
                          std::to_string(peer.rank) + " (garbage on the wire)",
                      peer.rank);
  if (imm == kCreditImm) {
    peer.credits = std::max(peer.credits, load_acquire(control(peer).credit_in));
    return;
  }
  if (imm == kCtsImm) {
    ++peer.cts_arrived;
    return;
  }
  if (imm == kFarewellImm) {
    const char* why = control(peer).farewell_in;
    throw farewell_error(peer.rank, rank_, std::string_view(why, strnlen(why, kFarewellBytes - 1)));
  }
  peer.credits = credits_after(peer.credits, imm, slots_);
  if ((imm & kPieceBytesMask) > slot_bytes_ || peer.arrived - peer.freed >= slots_)
    throw RemoteError("rank " + std::to_string(rank_) + " received an RDMA piece from rank " +
                          std::to_string(peer.rank) + " beyond its ring credits or slot size (garbage on the wire)",
                      peer.rank);
  peer.piece_bytes[peer.arrived % slots_] = imm;
  ++peer.arrived;
}

// Returns whether the completion advanced the protocol (a keepalive's does not).
bool IbTransport::on_completion(const ibv_wc& wc) {
  Peer& peer = peers_.at(peer_index_of(wc.wr_id));
  if (kind_of(wc.wr_id) != Work::receive) --writes_in_flight_;
  if (wc.status != IBV_WC_SUCCESS) fail_completion(peer, wc);
  switch (kind_of(wc.wr_id)) {
    case Work::data:
      ++peer.completed;
      retire_sends(peer);
      break;
    case Work::direct: {
      auto& pending = peer.direct_writes[static_cast<std::size_t>(qp_of(wc.wr_id))];
      --requests_[pending.front()].writes_left;
      pending.pop_front();
      retire_sends(peer);
      break;
    }
    case Work::cts: --peer.cts_writes; break;
    case Work::credit: --peer.credit_writes; break;
    case Work::proof: peer.proved = true; break;
    case Work::farewell: break;
    case Work::receive: on_receive(peer, wc); break;
    case Work::keepalive:
      peer.keepalive_pending = false;
      peer.answered = true;
      return false;
  }
  peer.active = true;
  return true;
}

// Sends that pinned a buffer or wrote directly complete in posting order
// once their ring pieces and direct writes have (pump_sends completes the
// others as soon as they are posted).
void IbTransport::retire_sends(Peer& peer) {
  while (!peer.sending.empty()) {
    Request& r = requests_[peer.sending.front()];
    if (r.last_piece >= peer.completed || r.writes_left > 0) return;
    r.done = true;
    unpin(r);
    bytes_sent_.fetch_add(r.header.payload_bytes, std::memory_order_relaxed);
    peer.sending.pop_front();
  }
}

int IbTransport::poll_completions() {
  ibv_wc wcs[32];
  int total = 0;
  for (;;) {
    int n = ibv_poll_cq(verbs_->cq, 32, wcs);
    if (n < 0) throw SystemError("rank " + std::to_string(rank_) + " could not poll its RDMA completion queue");
    for (int i = 0; i < n; ++i) {
      try {
        total += on_completion(wcs[i]) ? 1 : 0;
      } catch (...) {
        // The rest of the batch left the queue too: uncounted, its writes
        // held shutdown's drain to its whole 500 ms (helper-133's F4).
        for (int j = i + 1; j < n; ++j)
          if (kind_of(wcs[j].wr_id) != Work::receive) --writes_in_flight_;
        throw;
      }
    }
    if (n < 32) return total;  // completions that advanced something
  }
}

bool IbTransport::pump_all() {
  if (shut_down_) throw AbortedError("rank " + std::to_string(rank_) + ": the RDMA transport was shut down");
  bool advanced = poll_completions() > 0;
  // Sends first: a rank that is about to find its peer's header mismatched
  // still puts its own on the wire, so the peer names the mismatch too
  // rather than learning only that this rank stopped answering.
  for (auto& peer : peers_) {
    bool moved = pump_sends(peer);
    moved |= pump_recvs(peer);
    peer.active |= moved;
    advanced |= moved;
    if (!peer.failure.empty() && peer.completed == peer.posted) throw RemoteError(peer.failure, peer.rank);
  }
  return advanced;
}

bool IbTransport::pump_and_probe() {
  if (!pump_all()) return false;
  if (++moving_turns_ % kTurnsPerProbeLook == 0) probe_when_due(Clock::now());
  return true;
}

bool IbTransport::progress(Clock::time_point deadline) {
  if (pump_and_probe()) return true;
  auto now = Clock::now();
  if (now >= deadline) {
    // Polled (the caller blocks on another transport): the peers waited on
    // here are probed all the same. They were only while the caller blocked
    // in this transport, so a rank blocked on a local peer over shared
    // memory did not probe its RDMA peer, and a dead one went unnamed until
    // a timeout (what a rare rdma_ibverbs_failures failure looks like: every
    // rank of the 2+2 all_gather ending 25-38 s after the break).
    probe_when_due(now);
    // The device's events were looked at only while blocked here too, so a
    // polled rank whose own port went down learned it only from a write of
    // its own failing, and with none to make (no receive waited on here, a
    // write outstanding) not before the timeout: the same failure again
    // (the 2+2 all_gather's ranks on the host whose port lost its carrier
    // ending 24 s after the break). The queue is non-blocking; it is read
    // at most once per kEventLook to keep the polled turn cheap.
    if (now >= next_event_look_) {
      next_event_look_ = now + kEventLook;
      drain_async_events();
    }
    return false;
  }
  // Spin, reading the clock once per kPollsPerClockRead polls: a small
  // exchange is a handful of polls, and where the clock is slow to read
  // (an emulated HPET) reading it per poll would cost more than the wait.
  for (const auto spin_end = std::min(deadline, now + spin_); now < spin_end; now = Clock::now())
    for (int i = 0; i < kPollsPerClockRead; ++i)
      if (pump_and_probe()) return true;
  // Arm the completion channel, then look once more: a completion that
  // arrived before arming raises no event.
  if (ibv_req_notify_cq(verbs_->cq, 0))
    throw SystemError("rank " + std::to_string(rank_) + " could not arm its RDMA completion channel");
  if (pump_all()) return true;
  // Blocked: probe the peers waited on once kKeepaliveInterval has passed
  // with nothing posted or advanced (counted from the first block after the
  // last activity), and wake for the next probe; a keepalive's completion
  // wakes the wait but counts as no progress, so probes never come faster
  // than the interval.
  probe_when_due(Clock::now());
  wait_events(std::min({deadline, next_keepalive_, wake_by_}));
  wake_by_ = Clock::time_point::max();
  return pump_all();
}

void IbTransport::probe_when_due(Clock::time_point now) {
  next_keepalive_ = Clock::time_point::max();
  bool due = false;
  for (auto& peer : peers_) {
    if (peer.active || peer.answered) {
      peer.answered = false;
      peer.answered_at = now;
    }
    if (peer.active) {
      peer.active = false;
      peer.next_keepalive = now + kKeepaliveInterval;
    } else if (now >= peer.next_keepalive) {
      due = true;
      keep_alive(peer, now);
      peer.next_keepalive = now + kKeepaliveInterval;
    }
    next_keepalive_ = std::min(next_keepalive_, peer.next_keepalive);
  }
  if (due && now >= next_port_look_) {
    next_port_look_ = now + kKeepaliveInterval;
    check_port();
  }
}

// Sleeps until the completion channel or the device's async event queue
// has something, interrupt() was called, or the deadline passes.
void IbTransport::wait_events(Clock::time_point deadline) {
  pollfd fds[3] = {{verbs_->channel->fd, POLLIN, 0}, {verbs_->context->async_fd, POLLIN, 0}, {interrupt_.fd(), POLLIN, 0}};
  auto wait = std::max(deadline - Clock::now(), Clock::duration::zero());
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  int ready = ppoll(fds, 3, &ts, nullptr);
  if (ready < 0 && errno != EINTR) throw SystemError(errno_message("ppoll on the RDMA completion channel", errno));
  if (fds[2].revents & POLLIN) interrupt_.clear();
  if (fds[0].revents & POLLIN) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(verbs_->channel, &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
  }
  if (fds[1].revents & POLLIN) drain_async_events();
}

void IbTransport::prove_paths(Clock::time_point deadline) {
  const auto start = Clock::now();
  for (auto& peer : peers_) {
    ControlBlock& block = control(peer);
    block.proof_out = static_cast<std::uint64_t>(rank_) + 1;
    post_write(peer, wr_id(Work::proof, index_of(peer)), &block.proof_out, control_.lkey(), sizeof(std::uint64_t),
               peer.remote.credit_address + offsetof(ControlBlock, proof_in), peer.remote.control_rkey, false, 0);
  }
  auto all_proved = [this] {
    return std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.proved; });
  };
  while (!all_proved()) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (const auto& p : peers_)
        if (!p.proved) missing += (missing.empty() ? "" : ", ") + std::to_string(p.rank);
      throw TimeoutError("rank " + std::to_string(rank_) + " timed out proving its RDMA path to rank(s) " + missing +
                         " on " + verbs_->gid.device + " GID index " + std::to_string(verbs_->gid.index) +
                         "; check BRAID_IB_GID_INDEX / BRAID_IB_HCA on both ranks");
    }
    progress(deadline);
  }
  // How long a large send waits for its receiver's clear-to-send (direct.cc):
  // a few round trips, as the path proof measured them.
  cts_wait_ = std::clamp<std::chrono::nanoseconds>(4 * (Clock::now() - start), kMinCtsWait, kMaxCtsWait);
  spdlog::debug("ibverbs: rank {} proved its paths in {} us; large sends wait up to {} us for a clear-to-send",
                rank_, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count(),
                std::chrono::duration_cast<std::chrono::microseconds>(cts_wait_).count());
}

}  // namespace braid::comm::ibverbs
