// The two-rank set-up the RDMA test programs share: the store (served by
// rank 0 where the launcher says so) and an ibverbs transport between the
// two ranks, alive together (members go in reverse: the transport first).
// The device is the one BRAID_IB_HCA / BRAID_IB_GID_INDEX name, as a
// communicator's: in the VM each host has its own rxe device, and with the
// default choice both ranks would take the first device (rxe0) and their
// writes would loop back inside it instead of crossing the veth wire.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/transport/ibverbs/transport.h"
#include "comm/wire.h"
#include "braid/config.h"
#include "runtime/errors.h"
#include "runtime/rank_info.h"
#include "runtime/store.h"

namespace braid::comm::ibverbs {

struct Pair {
  std::unique_ptr<runtime::StoreServer> server;
  std::unique_ptr<runtime::Store> store;
  std::unique_ptr<IbTransport> transport;

  // `options` with rank, size, comm_id, job token and timeout filled in from
  // `info`; keys go under `prefix` in the store.
  Pair(const runtime::RankInfo& info, const std::string& prefix, std::uint32_t comm_id, IbOptions options = {}) {
    if (info.store_served_by_rank0 && info.rank == 0)
      server = std::make_unique<runtime::StoreServer>(info.store_host, info.store_port, info.job_token);
    store = std::make_unique<runtime::Store>(info.store_host, server ? server->port() : info.store_port,
                                             info.job_token, std::chrono::seconds(30));
    options.rank = info.rank;
    options.size = 2;
    options.comm_id = comm_id;
    options.job_token = info.job_token;
    options.timeout = std::chrono::seconds(20);
    options.device = {runtime::config().ib_hca, runtime::config().ib_gid_index};
    transport = connect_ibverbs(*store, prefix, options);
  }
};

// The header of the programs' one-double messages on communicator `comm_id`.
inline WireHeader double_message(std::uint32_t comm_id) {
  WireHeader h;
  h.kind = static_cast<std::uint8_t>(OpKind::send);
  h.comm_id = comm_id;
  h.count = 1;
  h.payload_bytes = sizeof(double);
  return h;
}

// Runs the transport, blocked in it, until `request` completes; a named
// error after 20 s without it.
inline void finish(Transport& t, RequestId request) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!t.is_done(request))
    if (!t.progress(deadline) && Clock::now() >= deadline) throw TimeoutError("no progress in 20 s");
  t.release(request);
}

}  // namespace braid::comm::ibverbs
