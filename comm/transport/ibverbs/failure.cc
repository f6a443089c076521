// How the ibverbs transport fails, and finds that a peer did: error
// completions and asynchronous events become errors that name the
// operation, the peer, the device and the remedy; keepalives make a dead
// peer's silence one of them (the protocol is in transport.h).
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"
#include "runtime/errors.h"

namespace braid::comm::ibverbs {
namespace {

constexpr std::chrono::milliseconds kPortSettle{300};
// Slower than any RDMA link, soft-RoCE under emulation included (about
// 17 MB/s measured in the test VM): a direct write of N bytes (one work
// request, up to 1 GiB) may take N / this before the stall check names its
// peer.
constexpr double kSlowestLinkBytesPerSecond = 4e6;

std::string port_down(const std::string& what, ibv_port_state state) {
  return what + ": this rank's port is " + ibv_port_state_str(state) +
         ": its link went down; check the cable, switch port or netdev (ip link, ibv_devinfo), "
         "or choose another device with BRAID_IB_HCA, or use BRAID_TRANSPORT=tcp";
}

bool is_active(ibv_port_state state) { return state == IBV_PORT_ACTIVE || state == IBV_PORT_ACTIVE_DEFER; }

}  // namespace

// Port down, a fatal queue pair or device error fail the communicator with
// the event named; the others (port active, GID change, ...) are logged, as
// are the events of the device's other ports (a dual-port adapter whose
// other port went down).
void IbTransport::drain_async_events() {
  ibv_async_event event{};
  while (ibv_get_async_event(verbs_->context, &event) == 0) {
    const ibv_event_type type = event.event_type;
    const bool port_event = type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE ||
                            type == IBV_EVENT_LID_CHANGE || type == IBV_EVENT_PKEY_CHANGE ||
                            type == IBV_EVENT_SM_CHANGE || type == IBV_EVENT_CLIENT_REREGISTER ||
                            type == IBV_EVENT_GID_CHANGE;
    const int port = port_event ? event.element.port_num : verbs_->gid.port;
    const bool qp_event = type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR;
    const ibv_qp* qp = qp_event ? event.element.qp : nullptr;
    ibv_ack_async_event(&event);
    const std::string what = "rank " + std::to_string(rank_) + " got RDMA event '" + ibv_event_type_str(type) +
                             "' on " + verbs_->gid.device + " port " + std::to_string(port);
    if (port != verbs_->gid.port) {
      spdlog::info("{} (this rank uses port {})", what, verbs_->gid.port);
      continue;
    }
    switch (type) {
      case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR: {
        // Which peer's queue pair: named, and blamed as the error's peer.
        for (const auto& peer : peers_)
          if (std::find(peer.qps.begin(), peer.qps.end(), qp) != peer.qps.end())
            throw RemoteError(what + ": the queue pair to rank " + std::to_string(peer.rank) + " failed; rank " +
                                  std::to_string(peer.rank) + " died, or sent an invalid request",
                              peer.rank);
        throw RemoteError(what + ": a queue pair to a peer failed; the peer died, or sent an invalid request");
      }
      case IBV_EVENT_PORT_ERR: case IBV_EVENT_DEVICE_FATAL: case IBV_EVENT_CQ_ERR:
        throw SystemError(what + ": the link or device is down; check the cable/switch port or netdev "
                                 "(ip link, ibv_devinfo), or choose another with BRAID_IB_HCA");
      default: spdlog::info("{}", what);
    }
  }
}

void IbTransport::fail_completion(Peer& peer, const ibv_wc& wc) {
  const Work kind = kind_of(wc.wr_id);
  const std::string me = "rank " + std::to_string(rank_), them = "rank " + std::to_string(peer.rank);
  const GidEntry& gid = verbs_->gid;
  std::string what = me + ": " + operation(kind) + " with " + them + " failed: " + ibv_wc_status_str(wc.status) +
                     " (status " + std::to_string(wc.status) + ", vendor error " + std::to_string(wc.vendor_err) +
                     ") on " + gid.device + " port " + std::to_string(gid.port) + " GID index " +
                     std::to_string(gid.index);
  if (kind == Work::proof)
    throw RemoteError(what + ": " + them + " is not reachable over this path; set BRAID_IB_GID_INDEX (or "
                             "BRAID_IB_HCA) on both ranks to a GID whose network routes between them "
                             "(show_gids / ibv_devinfo -v list them), or use BRAID_TRANSPORT=tcp",
                      peer.rank);
  if (wc.status == IBV_WC_RETRY_EXC_ERR)
    throw RemoteError(what + ": " + them + " did not answer RDMA (retries exhausted): it exited, crashed or its "
                             "link is down; see " + them + "'s own output for why it stopped, and if it still runs "
                             "check the link between the two (ibv_devinfo port state, ip link), or use "
                             "BRAID_TRANSPORT=tcp",
                      peer.rank);
  if (wc.status == IBV_WC_REM_ACCESS_ERR && kind == Work::direct)
    throw RemoteError(what + ": " + them + " no longer holds the buffer it offered for this message: it exited "
                             "or crashed (its registrations went with it); see " + them + "'s own output for why "
                             "it stopped",
                      peer.rank);
  if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR || wc.status == IBV_WC_WR_FLUSH_ERR || wc.status == IBV_WC_REM_OP_ERR ||
      wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_INV_REQ_ERR)
    throw RemoteError(what + ": " + them + " exited, crashed, hung or became unreachable", peer.rank);
  // A local error: most often this rank's own link went down under the
  // write. The port's state can lag the failed write by a moment, so it is
  // looked at for up to kPortSettle before the port is called up.
  ibv_port_attr port{};
  const auto settled = Clock::now() + kPortSettle;
  bool down = false;
  for (;;) {
    down = ibv_query_port(verbs_->context, static_cast<std::uint8_t>(gid.port), &port) == 0 && !is_active(port.state);
    if (down || Clock::now() >= settled) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (down) throw SystemError(port_down(what, port.state));
  throw SystemError(what + ": a local RDMA failure with the port up; check the device (ibv_devinfo) and, for "
                           "registration failures, ulimit -l");
}

// The keepalive of transport.h: probe each peer this rank waits on (a receive
// posted, or a send not fully written for want of credits) unless a write to
// it is outstanding already, whose failure would name a dead peer as well;
// one outstanding with nothing heard from the peer for write_stall_limit_
// names it here (its retries should have ended long before).
void IbTransport::keep_alive(Peer& peer, Clock::time_point now) {
  const bool waiting = !peer.recvs.empty() || !peer.sends.empty() || !peer.sending.empty();
  const bool outstanding = peer.keepalive_pending || peer.posted != peer.completed || peer.credit_writes > 0 ||
                           peer.cts_writes > 0 ||
                           std::any_of(peer.direct_writes.begin(), peer.direct_writes.end(),
                                       [](const auto& q) { return !q.empty(); });
  if (!waiting) return;
  if (outstanding) {
    std::uint64_t direct_bytes = 0;
    for (RequestId id : peer.sending)
      if (requests_[id].mode == Mode::direct && requests_[id].writes_left > 0)
        direct_bytes += requests_[id].header.payload_bytes;
    const auto allowance = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(direct_bytes) / kSlowestLinkBytesPerSecond));
    if (now - peer.answered_at < write_stall_limit_ + allowance) return;
    const auto ms = [](Clock::duration d) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
    };
    const std::string them = "rank " + std::to_string(peer.rank);
    throw RemoteError("rank " + std::to_string(rank_) + ": " + them + " did not answer RDMA (a write to it " +
                          "outstanding, no completion or data from it for " + ms(now - peer.answered_at) +
                          ", well past the end of its retries) on " +
                          verbs_->gid.device + " port " + std::to_string(verbs_->gid.port) + ": it hung, or the " +
                          "link or device between the two stalled; see " + them + "'s own output, check the " +
                          "link (ibv_devinfo port state, ip link), or use BRAID_TRANSPORT=tcp",
                      peer.rank);
  }
  ControlBlock& block = control(peer);
  ++block.keepalive_out;
  post_write(peer, wr_id(Work::keepalive, index_of(peer)), &block.keepalive_out, control_.lkey(),
             sizeof(std::uint64_t), peer.remote.credit_address + offsetof(ControlBlock, keepalive_in),
             peer.remote.control_rkey, false, 0);
  peer.keepalive_pending = true;
}

// The port's state, read while a peer is due for a probe: a port that went
// down without its event reaching this rank fails it as the event would.
// The event queue is read first, so that an event that did come is named.
void IbTransport::check_port() {
  drain_async_events();
  ibv_port_attr port{};
  if (ibv_query_port(verbs_->context, static_cast<std::uint8_t>(verbs_->gid.port), &port) != 0 ||
      is_active(port.state))
    return;
  throw SystemError(port_down("rank " + std::to_string(rank_) + ": read the state of " + verbs_->gid.device +
                                  " port " + std::to_string(verbs_->gid.port) + " while waiting",
                              port.state));
}

}  // namespace braid::comm::ibverbs
