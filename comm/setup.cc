// Creating communicators: the world one from the launcher's environment, and
// split ones from a parent.
//
// Store keys of a communicator live under its key prefix ("braid/world",
// then "<parent>/split<k>/color<c>" for the k-th split of a parent), so
// communicators never read each other's addresses or status. The
// communicator id on the wire is a hash of the prefix.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "comm/communicator_impl.h"
#include "comm/transport/tcp/transport.h"
#include "runtime/config.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "runtime/store.h"

namespace braid::comm {
namespace {

std::uint32_t hash_prefix(const std::string& prefix) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : prefix) h = (h ^ c) * 16777619u;
  return h;
}

std::shared_ptr<Communicator::Impl> new_impl(const runtime::RankInfo& info, const runtime::Config& config,
                                             std::string prefix, int rank, int size) {
  auto impl = std::make_shared<Communicator::Impl>();
  impl->config = config;
  impl->info = info;
  impl->rank = rank;
  impl->size = size;
  impl->key_prefix = std::move(prefix);
  impl->comm_id = hash_prefix(impl->key_prefix);
  impl->tuning.segment_bytes = config.segment_bytes;
  impl->forced_algo = config.algo;
  impl->timeout = config.timeout;
  impl->inline_bytes = config.inline_bytes;
  return impl;
}

std::string ring_order(int size) {
  std::string order;
  for (int r = 0; r < size; ++r) order += (r ? " " : "") + std::to_string(r);
  return order;
}

}  // namespace

void connect_transports(Communicator::Impl& impl) {
  const auto& config = impl.config;
  impl.routes.assign(static_cast<std::size_t>(impl.size), nullptr);
  if (impl.size > 1) {
    if (config.transport == "shm")
      throw InvalidUsage("BRAID_TRANSPORT=shm: the shared-memory transport is not built yet; use tcp or auto");
    tcp::MeshOptions options;
    options.rank = impl.rank;
    options.size = impl.size;
    options.comm_id = impl.comm_id;
    options.nsocks = config.tcp_nsocks;
    options.buffer_bytes = config.socket_buffer_bytes;
    options.bind_addr = config.bind_addr;
    options.token = impl.info.job_token;
    options.timeout = config.timeout;
    auto fds = tcp::connect_mesh(*impl.store, impl.key_prefix, options);
    impl.transports.push_back(
        std::make_unique<tcp::TcpTransport>(impl.rank, std::move(fds), config.socket_buffer_bytes));
    for (int peer = 0; peer < impl.size; ++peer)
      if (peer != impl.rank) impl.routes[peer] = impl.transports.back().get();
  }
  impl.status = std::make_unique<StatusBoard>(impl.store, impl.key_prefix, impl.rank);
  spdlog::info("comm {:08x} ({}): rank {}/{}, transport tcp to all {} peers ({} socket(s) each; "
               "BRAID_TRANSPORT={}), ring order {}",
               impl.comm_id, impl.key_prefix, impl.rank, impl.size, impl.size - 1, config.tcp_nsocks,
               config.transport, ring_order(impl.size));
}

std::unique_ptr<Communicator> Communicator::create_world() {
  return create_world(runtime::rank_info_from_env());
}

std::unique_ptr<Communicator> Communicator::create_world(const runtime::RankInfo& info) {
  return create_world(info, runtime::config());
}

std::unique_ptr<Communicator> Communicator::create_world(const runtime::RankInfo& info,
                                                         const runtime::Config& config) {
  runtime::setup_logging(info.rank);
  auto impl = new_impl(info, config, "braid/world", info.rank, info.world_size);
  if (info.world_size > 1 || info.launcher != "none") {
    std::uint16_t port = info.store_port;
    if (info.store_served_by_rank0 && info.rank == 0) {
      impl->store_server = std::make_shared<runtime::StoreServer>(info.store_host, port, info.job_token);
      port = impl->store_server->port();
    }
    if (port == 0) throw InvalidUsage("no store address: set BRAID_STORE_ADDR or start with braid-launch");
    impl->store = std::make_shared<runtime::Store>(info.store_host, port, info.job_token, config.timeout);
  }
  spdlog::info("{}", runtime::describe(info));
  connect_transports(*impl);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  const int n = impl_->size;
  std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
  all_gather(mine, all.data(), 2, DataType::i64).wait();
  int split_index = impl_->split_count++;
  if (color < 0) return nullptr;
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  std::sort(members.begin(), members.end());
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), std::make_pair<std::int64_t, int>(key, rank())) -
                                  members.begin());
  auto prefix = impl_->key_prefix + "/split" + std::to_string(split_index) + "/color" + std::to_string(color);
  auto impl = new_impl(impl_->info, impl_->config, prefix, new_rank, static_cast<int>(members.size()));
  impl->store = impl_->store;
  connect_transports(*impl);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

}  // namespace braid::comm
