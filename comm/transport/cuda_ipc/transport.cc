#include "comm/transport/cuda_ipc/transport.h"

#include "comm/transport/cuda_ipc/memory.h"
#include "runtime/errors.h"

namespace braid::comm::cuda_ipc {

namespace {

std::vector<bool> local_mask(const CudaIpcOptions& options) {
  std::vector<bool> local(static_cast<std::size_t>(options.size), false);
  for (int r : options.local_ranks)
    if (r >= 0 && r < options.size) local[r] = true;
  return local;
}

}  // namespace

CudaIpcTransport::CudaIpcTransport(std::shared_ptr<runtime::Store> store, std::string key_prefix,
                                   const CudaIpcOptions& options)
    : rank_(options.rank), local_(local_mask(options)) {
  directory_ = std::make_unique<Directory>(std::move(store), std::move(key_prefix));
  exports_ = std::make_unique<Exports>(rank_, *directory_);
  peers_ = std::make_unique<PeerRegions>(*directory_, options.timeout);
}

CudaIpcTransport::~CudaIpcTransport() = default;

void CudaIpcTransport::no_messages() const {
  throw InvalidUsage("the cuda_ipc transport carries no messages: the ranks it serves reach each other "
                     "through shm, which carries a direct collective's references and barrier");
}

RequestId CudaIpcTransport::post_send(int, const WireHeader&, const void*) { no_messages(); }
RequestId CudaIpcTransport::post_recv(int, const WireHeader&, void*, Placement) { no_messages(); }
bool CudaIpcTransport::is_done(RequestId) { no_messages(); }
std::span<const std::byte> CudaIpcTransport::view(RequestId) { no_messages(); }
void CudaIpcTransport::release(RequestId) { no_messages(); }

bool CudaIpcTransport::find_region(const void* data, std::size_t bytes, RegionRef& ref) {
  return exports_->find(data, bytes, ref);
}

std::span<std::byte> CudaIpcTransport::map_region(int peer, const RegionRef& ref) {
  if (peer < 0 || peer >= static_cast<int>(local_.size()) || peer == rank_ || !local_[peer])
    throw InvalidUsage("rank " + std::to_string(rank_) + " cannot map the device memory of rank " +
                       std::to_string(peer) + " through CUDA IPC: it is not a peer on this host");
  const int device = exports_->device();
  if (device < 0)
    throw InvalidUsage("rank " + std::to_string(rank_) + " maps device memory of rank " + std::to_string(peer) +
                       " before sharing any of its own: a direct collective shares its buffers first");
  return peers_->map(peer, ref, device);
}

void CudaIpcTransport::regions_used(const Stream* queued_on) {
  cudaStream_t stream = queued_on ? static_cast<cudaStream_t>(queued_on->cuda) : nullptr;
  peers_->used(queued_on ? &stream : nullptr);
}

}  // namespace braid::comm::cuda_ipc
