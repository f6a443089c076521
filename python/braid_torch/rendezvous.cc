// braid's store address and token, passed through torch's store (rendezvous.h).
#include "rendezvous.h"

#include <random>
#include <sstream>
#include <string>

#include "braid/errors.h"

namespace braid::torch_backend {

namespace {

const std::string kStoreKey = "braid/store";

std::string random_token() {
  std::random_device urandom;  // libstdc++ reads the kernel's CSPRNG
  std::ostringstream token;
  token << std::hex;
  for (int i = 0; i < 4; ++i) token << urandom();
  return token.str();
}

// The launcher's view of this process (local ranks, the store host it would
// route to), where the environment has one; torch's rank and size win.
runtime::RankInfo base_info(int rank, int size) {
  runtime::RankInfo info;
  try {
    info = runtime::rank_info_from_env();
  } catch (const InvalidUsage&) {
    // torch alone knows the group: nothing from a launcher is needed.
  }
  info.rank = rank;
  info.world_size = size;
  if (info.local_world_size > size) info.local_world_size = size;
  info.store_served_by_rank0 = false;
  info.launcher = "torch.distributed (" + info.launcher + ")";
  return info;
}

}  // namespace

Rendezvous rendezvous(c10d::Store& store, int rank, int size, const runtime::Config& config) {
  Rendezvous result;
  result.info = base_info(rank, size);
  runtime::RankInfo& info = result.info;
  if (rank == 0) {
    std::string host = runtime::peer_bind_address(info, config);
    info.job_token = random_token();
    result.server = std::make_unique<runtime::StoreServer>(host, 0, info.job_token);
    info.store_host = host;
    info.store_port = result.server->port();
    std::string value = host + " " + std::to_string(info.store_port) + " " + info.job_token;
    store.set(kStoreKey, std::vector<std::uint8_t>(value.begin(), value.end()));
    return result;
  }
  try {
    store.wait({kStoreKey}, config.timeout);
  } catch (const std::exception& error) {
    throw TimeoutError("braid: rank " + std::to_string(rank) + " waited " +
                       std::to_string(config.timeout.count()) + " ms for group rank 0 to publish braid's store (" +
                       error.what() + "); did rank 0 start with backend 'braid' too?");
  }
  auto bytes = store.get(kStoreKey);
  std::istringstream value(std::string(bytes.begin(), bytes.end()));
  int port = 0;
  if (!(value >> info.store_host >> port >> info.job_token) || port <= 0 || port > 65535)
    throw RemoteError("braid: the store address group rank 0 published is malformed", 0);
  info.store_port = static_cast<std::uint16_t>(port);
  return result;
}

}  // namespace braid::torch_backend
