// Connection set-up of the ibverbs transport.
//
// 1. Choose the device, port and GID (device.h) and open them: protection
//    domain, completion channel, one completion queue for every peer.
// 2. Register one receive ring, one send staging area and one control
//    region, each with a block per peer (memory.h, transport.h).
// 3. Per peer: create an RC queue pair, move it to INIT and post its
//    receives (before any peer can write with an immediate to it).
// 4. Publish a ConnectionData under <prefix>/ibverbs/<from>/<to>. It carries
//    the job token's digest besides the queue pair number, PSN, GID, LID,
//    MTU and the ring and control addresses and rkeys for that peer; the
//    store itself only serves clients that presented the job token, and the
//    reader refuses data whose magic, version, ranks, communicator, token
//    digest or ring shape differ from its own.
// 5. Move each queue pair to RTR and RTS, then prove the path with an RDMA
//    write each way (transport.cc): a wrong GID index or an unroutable peer
//    fails here, naming both ranks, the device, the GID index and the remedy.
//
// Retry settings: the local ACK timeout is 4.096 us x 2^t, retried 6 times,
// so a peer that stops answering fails a write after 7 x 4.096 us x 2^t;
// t is chosen so that this is at most a quarter of BRAID_TIMEOUT, between
// 67 ms and 268 ms per try (t 14..16): a dead peer is named within about
// 0.5-1.9 s of the first write it leaves unanswered (with the keepalive of
// transport.h, of blocking on it), whatever BRAID_TIMEOUT. A live peer's
// adapter answers in microseconds; only a link down or a fabric stalled for
// all 7 tries (nearly 2 s) would be taken for a dead peer. Not 7 retries:
// soft-RoCE (rdma_rxe) reads a retry count of 7 as "retry forever", so a
// write to a dead peer would never complete there.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"
#include "runtime/errors.h"
#include "runtime/hash.h"
#include "runtime/store.h"

namespace braid::comm::ibverbs {
namespace {

constexpr std::uint32_t kMagic = 0x42444942;  // "BIDB"
constexpr std::uint16_t kVersion = 2;

struct ConnectionData {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::uint16_t lid = 0;
  std::int32_t from = 0, to = 0;
  std::uint32_t comm_id = 0;
  std::uint32_t qps = 0;  // queue pairs per peer (BRAID_IB_QPS_PER_PEER), their numbers below
  std::uint32_t qp_nums[kMaxQpsPerPeer] = {};
  std::uint32_t mtu = 0;  // ibv_mtu
  std::uint64_t token_digest = 0;
  std::uint8_t gid[16] = {};
  std::uint64_t ring_address = 0;
  std::uint64_t slot_bytes = 0;
  std::uint32_t ring_rkey = 0;
  std::uint32_t slots = 0;
  std::uint64_t credit_address = 0;
  std::uint32_t control_rkey = 0;
  std::uint32_t gid_kind = 0;
};

std::string who(const IbOptions& o, int peer) {
  return "rank " + std::to_string(o.rank) + " could not set up RDMA with rank " + std::to_string(peer);
}

std::string where(const GidEntry& gid) {
  return gid.device + " port " + std::to_string(gid.port) + " GID index " + std::to_string(gid.index);
}

int ack_timeout_exponent(std::chrono::milliseconds timeout) {
  int t = 14;
  while (t < 16 && 7 * 4.096e-6 * static_cast<double>(1 << (t + 1)) <= timeout.count() / 4000.0) ++t;
  return t;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::unique_ptr<Verbs> open_verbs(const GidChoice& choice, int cq_entries, int rank) {
  auto verbs = std::make_unique<Verbs>();
  verbs->gid = choice.entry;
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  for (int i = 0; devices && i < count && !verbs->context; ++i)
    if (choice.entry.device == ibv_get_device_name(devices[i])) verbs->context = ibv_open_device(devices[i]);
  if (devices) ibv_free_device_list(devices);
  const std::string what = "rank " + std::to_string(rank) + " could not open RDMA device " + choice.entry.device;
  if (!verbs->context) throw SystemError(errno_message(what, errno));
  if (!(verbs->pd = ibv_alloc_pd(verbs->context))) throw SystemError(errno_message(what + " (protection domain)", errno));
  if (!(verbs->channel = ibv_create_comp_channel(verbs->context)))
    throw SystemError(errno_message(what + " (completion channel)", errno));
  if (!(verbs->cq = ibv_create_cq(verbs->context, cq_entries, nullptr, verbs->channel, 0)))
    throw SystemError(errno_message(what + " (completion queue of " + std::to_string(cq_entries) + ")", errno));
  set_nonblocking(verbs->channel->fd);
  set_nonblocking(verbs->context->async_fd);
  return verbs;
}

// Work requests a queue pair holds at most (transport.h): on the first, ring
// pieces, credits, Cts and stripes; on the others, stripes. Receives are
// reposted as they are used, so these bound what is in flight at once.
int send_depth(const IbOptions& o) { return o.slots + 3 * kCtsSlots + 8; }
int receive_depth(const IbOptions& o, int qp) { return qp == 0 ? 2 * o.slots + 2 * kCtsSlots + 8 : kCtsSlots + 8; }
std::uint32_t psn_of(std::uint32_t qp_num) { return (qp_num * 2654435761u) & 0xffffff; }

ibv_qp* create_qp(Verbs& verbs, const IbOptions& o, int peer, int index) {
  ibv_qp_init_attr init{};
  init.send_cq = verbs.cq;
  init.recv_cq = verbs.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = static_cast<std::uint32_t>(send_depth(o));
  init.cap.max_recv_wr = static_cast<std::uint32_t>(receive_depth(o, index));
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(verbs.pd, &init);
  if (!qp) throw SystemError(errno_message(who(o, peer) + ": creating a queue pair on " + verbs.gid.device, errno));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = static_cast<std::uint8_t>(verbs.gid.port);
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int error = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    throw SystemError(errno_message(who(o, peer) + ": moving its queue pair to INIT", error));
  }
  return qp;
}

ConnectionData local_data(const IbOptions& o, const IbTransport::Peer& peer, const Verbs& verbs,
                          const ibv_port_attr& port, std::uint64_t ring, std::uint32_t ring_rkey,
                          std::uint64_t credit, std::uint32_t control_rkey) {
  ConnectionData d;
  d.lid = port.lid;
  d.from = o.rank;
  d.to = peer.rank;
  d.comm_id = o.comm_id;
  d.qps = static_cast<std::uint32_t>(peer.qps.size());
  for (std::size_t q = 0; q < peer.qps.size(); ++q) d.qp_nums[q] = peer.qps[q]->qp_num;
  d.mtu = port.active_mtu;
  d.token_digest = runtime::fnv1a(o.job_token);
  std::memcpy(d.gid, verbs.gid.gid.data(), 16);
  d.ring_address = ring;
  d.slot_bytes = o.slot_bytes;
  d.ring_rkey = ring_rkey;
  d.slots = static_cast<std::uint32_t>(o.slots);
  d.credit_address = credit;
  d.control_rkey = control_rkey;
  d.gid_kind = static_cast<std::uint32_t>(verbs.gid.kind);
  return d;
}

// The value under `key`, waited for until `deadline` in slices between
// which a failure that a rank or its launcher published ends the wait
// (o.check_peers): a peer that failed before it wrote the key (no device,
// a wrong BRAID_IB_GID_INDEX on its host) would otherwise be waited for
// until the timeout. At the deadline, TimeoutError: `what` did not come
// from `peer`; or the store's own, naming it, where the store no longer
// answers (a slice that it left unanswered reads like a key not there yet,
// and the wait blamed `peer`; a review helper's case).
runtime::Bytes get_sliced(runtime::Store& store, const std::string& key, const IbOptions& o, int peer,
                          Clock::time_point deadline, const char* what) {
  using std::chrono::milliseconds;
  constexpr milliseconds kSlice{250}, kLastLook{2000};
  for (;;) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
    try {
      return store.get(key, std::clamp(left, milliseconds(1), kSlice));
    } catch (const TimeoutError&) {
      if (left <= kSlice) {
        if (std::optional<runtime::Bytes> value = store.try_get(key, Clock::now() + kLastLook)) return *value;
        throw TimeoutError("rank " + std::to_string(o.rank) + " waited " + std::to_string(o.timeout.count()) +
                           " ms for rank " + std::to_string(peer) + " " + what +
                           ": it may have failed, not started, or be stopped");
      }
    }
    if (o.check_peers) o.check_peers(deadline);
  }
}

const char* kind_name(std::uint32_t kind) {
  switch (static_cast<GidKind>(kind)) {
    case GidKind::ib: return "InfiniBand";
    case GidKind::roce_v1: return "RoCE v1";
    case GidKind::roce_v2: return "RoCE v2";
  }
  return "unknown";
}

ConnectionData read_remote(runtime::Store& store, const std::string& prefix, const IbOptions& o, int peer,
                           const ConnectionData& mine, Clock::time_point deadline) {
  runtime::Bytes bytes = get_sliced(store, prefix + "/ibverbs/" + std::to_string(peer) + "/" + std::to_string(o.rank),
                                    o, peer, deadline, "to publish its RDMA connection data");
  ConnectionData d;
  if (bytes.size() != sizeof d) throw RemoteError(who(o, peer) + ": it published malformed connection data", peer);
  std::memcpy(&d, bytes.data(), sizeof d);
  std::string why;
  if (d.magic != kMagic || d.version != kVersion) why = "it speaks another protocol version";
  else if (d.token_digest != runtime::fnv1a(o.job_token)) why = "it presented the wrong job token";
  else if (d.from != peer || d.to != o.rank || d.comm_id != o.comm_id) why = "it addressed another communicator or rank";
  else if (d.slots != static_cast<std::uint32_t>(o.slots) || d.slot_bytes != o.slot_bytes)
    why = "its receive ring has another shape (a different braid build?)";
  else if (d.qps != static_cast<std::uint32_t>(o.qps))
    why = "it uses " + std::to_string(d.qps) + " queue pairs per peer and this rank " + std::to_string(o.qps) +
          "; set the same BRAID_IB_QPS_PER_PEER on every rank";
  // Two kinds of GID never route to each other: the writes that prove the
  // path failed, and the error called the peer unroutable (helper-133's F6).
  else if (d.gid_kind != mine.gid_kind)
    why = std::string("its GID is ") + kind_name(d.gid_kind) + " and this rank's " + kind_name(mine.gid_kind) +
          "; set BRAID_IB_GID_INDEX on every rank to a GID of one kind (ibv_devinfo -v lists them)";
  if (!why.empty()) {
    spdlog::warn("{}: refused its connection data: {}", who(o, peer), why);
    throw RemoteError(who(o, peer) + ": refused its connection data: " + why, peer);
  }
  return d;
}

// A peer's "up" key that says it failed, followed by why.
constexpr char kFailedUp = '!';

// Waits for every peer's "up" key (connect_ibverbs), in slices
// (get_sliced): a peer that failed before bringing its queue pairs up
// would otherwise be waited for until the timeout.
void wait_until_up(runtime::Store& store, const std::string& key_prefix, const IbOptions& o,
                   const std::vector<int>& ranks, Clock::time_point deadline) {
  for (int peer : ranks) {
    const runtime::Bytes value = get_sliced(store, key_prefix + "/ibverbs/up/" + std::to_string(peer), o, peer,
                                            deadline, "to bring its RDMA queue pairs up");
    if (!value.empty() && value.front() == static_cast<std::uint8_t>(kFailedUp))
      throw RemoteError(who(o, peer) + ": it could not bring its queue pairs up: " +
                            std::string(value.begin() + 1, value.end()),
                        peer);
  }
}

// RTR then RTS, with the retry settings of the header comment.
void bring_up(ibv_qp* qp, const Verbs& verbs, const ConnectionData& mine, const ConnectionData& theirs,
              const IbOptions& o, int q) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min(mine.mtu, theirs.mtu));
  attr.dest_qp_num = theirs.qp_nums[q];
  attr.rq_psn = psn_of(theirs.qp_nums[q]);
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = static_cast<std::uint8_t>(verbs.gid.port);
  attr.ah_attr.dlid = theirs.lid;
  attr.ah_attr.is_global = 1;
  std::memcpy(attr.ah_attr.grh.dgid.raw, theirs.gid, 16);
  attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(verbs.gid.index);
  attr.ah_attr.grh.hop_limit = 64;
  const std::string at = " (" + where(verbs.gid) + ", this rank's GID " + gid_text(verbs.gid.gid) + ")";
  const std::string remedy = ": set BRAID_IB_GID_INDEX / BRAID_IB_HCA on both ranks to a GID that routes between "
                             "them (ibv_devinfo -v lists them), or use BRAID_TRANSPORT=tcp";
  if (int error = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    throw RemoteError(errno_message(who(o, theirs.from) + ": its queue pair could not reach RTR towards the peer's GID " +
                                        gid_text(*reinterpret_cast<const std::array<std::uint8_t, 16>*>(theirs.gid)) + at,
                                    error) + remedy,
                      theirs.from);
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = static_cast<std::uint8_t>(ack_timeout_exponent(o.timeout));
  attr.retry_cnt = 6;  // 7 tries; not 7: rxe retries forever (header comment)
  attr.rnr_retry = 7;  // receives are reposted as they are used; RNR is never expected
  attr.sq_psn = psn_of(mine.qp_nums[q]);
  attr.max_rd_atomic = 1;
  if (int error = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    throw SystemError(errno_message(who(o, theirs.from) + ": moving its queue pair to RTS" + at, error) + remedy);
}

std::vector<int> peer_ranks(const IbOptions& o) {
  std::vector<int> ranks;
  for (int r = 0; r < o.size; ++r)
    if (r != o.rank && (o.peers.empty() || o.peers[r])) ranks.push_back(r);
  return ranks;
}

}  // namespace

std::unique_ptr<IbTransport> connect_ibverbs(runtime::Store& store, const std::string& key_prefix,
                                             const IbOptions& o) {
  // A piece's byte count and the credit count it carries share its immediate (ids.h).
  if (o.slot_bytes > kPieceBytesMask || o.slots < 1 || o.slots > 256)
    throw InvalidUsage("ibverbs: ring slots of " + std::to_string(o.slot_bytes) + " bytes x " +
                       std::to_string(o.slots) + " are outside what the wire protocol encodes (under 1 MiB, 1 to 256)");
  GidChoice choice = choose_gid(probe_gid_table(), o.device, o.rank);
  spdlog::info("ibverbs: {}", choice.reason);
  const std::vector<int> ranks = peer_ranks(o);
  const std::size_t n = std::max<std::size_t>(ranks.size(), 1);
  int cq_entries = 0;
  for (int q = 0; q < o.qps; ++q) cq_entries += send_depth(o) + receive_depth(o, q);
  auto verbs = open_verbs(choice, static_cast<int>(n) * cq_entries, o.rank);
  const std::size_t ring_bytes = n * static_cast<std::size_t>(o.slots) * o.slot_bytes;
  Registered ring(verbs->pd, ring_bytes, "receive ring"), staging(verbs->pd, ring_bytes, "send staging");
  Registered control(verbs->pd, n * sizeof(IbTransport::ControlBlock), "control region");
  ibv_port_attr port{};
  if (int error = ibv_query_port(verbs->context, static_cast<std::uint8_t>(verbs->gid.port), &port))
    throw SystemError(errno_message("rank " + std::to_string(o.rank) + " could not query " + where(verbs->gid), error));

  std::vector<IbTransport::Peer> peers(ranks.size());
  std::vector<ConnectionData> mine(ranks.size());
  // Until the transport owns them, a throw destroys the queue pairs here,
  // also one while they are made (a device out of queue pairs): those made
  // before it kept the protection domain and completion queue busy, and
  // the device's descriptor leaked.
  std::vector<ibv_qp*> qps;
  struct QpGuard {
    std::vector<ibv_qp*>* qps;
    ~QpGuard() {
      if (qps)
        for (ibv_qp* qp : *qps) ibv_destroy_qp(qp);
    }
  } guard{&qps};
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    peers[i].rank = ranks[i];
    for (int q = 0; q < o.qps; ++q) {
      peers[i].qps.push_back(create_qp(*verbs, o, ranks[i], q));
      qps.push_back(peers[i].qps.back());
    }
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    for (int q = 0; q < o.qps; ++q)
      for (int k = 0; k < receive_depth(o, q); ++k) {
        ibv_recv_wr wr{}, *bad = nullptr;
        wr.wr_id = wr_id(Work::receive, i, q);
        if (int error = ibv_post_recv(peers[i].qps[q], &wr, &bad))
          throw SystemError(errno_message(who(o, ranks[i]) + ": posting receives", error));
      }
    mine[i] = local_data(o, peers[i], *verbs, port, ring.address() + i * o.slots * o.slot_bytes, ring.rkey(),
                         control.address() + i * sizeof(IbTransport::ControlBlock), control.rkey());
    runtime::Bytes bytes(sizeof(ConnectionData));
    std::memcpy(bytes.data(), &mine[i], sizeof(ConnectionData));
    store.set(key_prefix + "/ibverbs/" + std::to_string(o.rank) + "/" + std::to_string(ranks[i]), bytes);
  }
  // The path proof (prove_paths) waits until every peer's queue pairs are
  // up: a write reaching one still in INIT is dropped, and a peer that
  // brought its queue pair to this rank up after others (it reads their
  // data in rank order) or started late failed the proof, named as a GID
  // that does not route. A rank that cannot bring its own up says so in
  // its key, so that its peers do not wait for it.
  const std::string up = key_prefix + "/ibverbs/up/" + std::to_string(o.rank);
  const auto deadline = Clock::now() + o.timeout;
  try {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      ConnectionData theirs = read_remote(store, key_prefix, o, ranks[i], mine[i], deadline);
      for (int q = 0; q < o.qps; ++q) bring_up(peers[i].qps[q], *verbs, mine[i], theirs, o, q);
      peers[i].remote = {theirs.ring_address, theirs.ring_rkey, theirs.credit_address, theirs.control_rkey};
    }
  } catch (const std::exception& e) {
    try {
      store.set(up, std::string(1, kFailedUp) + e.what());
    } catch (const std::exception&) {
      // Best effort: its peers then find its published failure, or time out.
    }
    throw;
  }
  store.set(up, std::string("1"));
  wait_until_up(store, key_prefix, o, ranks, deadline);
  guard.qps = nullptr;
  auto result = std::make_unique<IbTransport>(o, std::move(verbs), std::move(peers), std::move(ring),
                                              std::move(staging), std::move(control));
  result->prove_paths(Clock::now() + o.timeout);
  return result;
}

}  // namespace braid::comm::ibverbs
