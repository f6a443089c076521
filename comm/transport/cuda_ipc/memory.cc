#include "comm/transport/cuda_ipc/memory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "comm/device_cuda.h"
#include "runtime/device.h"
#include "runtime/errors.h"

namespace braid::comm::cuda_ipc {

bool Exports::find(const void* data, std::size_t bytes, RegionRef& ref) {
  if (data == nullptr) return false;
  const runtime::Location at = runtime::locate(data);
  if (at.kind != runtime::MemoryKind::device || at.base == nullptr) return false;
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(data) - static_cast<const std::byte*>(at.base));
  if (offset > at.size || bytes > at.size - offset) return false;
  std::lock_guard lock(mu_);
  if (device_ >= 0 && at.device != device_) return false;
  Entry& entry = by_base_[at.base];
  if (!export_entry(at.base, at.size, at.device, entry)) {
    by_base_.erase(at.base);
    return false;
  }
  device_ = at.device;
  ref = {{entry.id, 0}, offset, bytes};
  return true;
}

int Exports::device() const {
  std::lock_guard lock(mu_);
  return device_;
}

// Keeps `entry` (empty when the base is new) when the allocation at `base`
// still has its handle; else exports it afresh under a new id: publishes
// its record and withdraws the record of the allocation that was there.
// Called with mu_ held.
bool Exports::export_entry(const void* base, std::size_t bytes, int device, Entry& entry) {
  cudaIpcMemHandle_t handle{};
  {
    DeviceScope scope(device);
    if (cudaIpcGetMemHandle(&handle, const_cast<void*>(base)) != cudaSuccess) {
      cudaGetLastError();  // not shareable (cudaMallocAsync pools, ...): the call is staged instead
      return false;
    }
  }
  if (entry.id != 0 && entry.bytes == bytes && std::memcmp(&entry.handle, &handle, sizeof handle) == 0) return true;
  Record record;
  record.owner = static_cast<std::uint32_t>(rank_);
  record.device = device;
  record.id = last_id_ + 1;
  record.bytes = bytes;
  record.handle = handle;
  try {
    directory_.publish(record);
  } catch (const Error& e) {
    spdlog::warn("rank {}: cannot publish a CUDA IPC handle ({}); calls on this buffer are staged", rank_, e.what());
    return false;
  }
  if (entry.id != 0) directory_.withdraw(rank_, entry.id);
  entry = {record.id, bytes, handle};
  last_id_ = record.id;
  return true;
}

PeerRegions::~PeerRegions() {
  for (auto& [key, open] : open_) {
    if (open.used_until) {
      if (cudaEventQuery(open.used_until) != cudaSuccess) continue;  // still queued: left mapped (class comment)
      cudaEventDestroy(open.used_until);
    }
    cudaIpcCloseMemHandle(open.base);
  }
  for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
}

std::span<std::byte> PeerRegions::map(int peer, const RegionRef& ref, int device) {
  if (ref.key[1] != 0)
    throw RemoteError("rank " + std::to_string(peer) + " named a device memory region with an impossible key", peer);
  Open& region = open(peer, ref.key[0], device);
  region.last_use = ++uses_;
  const Key key{peer, ref.key[0]};
  if (std::find(unfenced_.begin(), unfenced_.end(), key) == unfenced_.end()) unfenced_.push_back(key);
  if (ref.offset > region.bytes || ref.bytes > region.bytes - ref.offset)
    throw RemoteError("rank " + std::to_string(peer) + " named bytes [" + std::to_string(ref.offset) + ", +" +
                          std::to_string(ref.bytes) + ") of a device allocation of " + std::to_string(region.bytes) +
                          " bytes; a peer's offsets are checked against what it registered",
                      peer);
  return {region.base + ref.offset, static_cast<std::size_t>(ref.bytes)};
}

void PeerRegions::used(cudaStream_t* queued_on) {
  const std::vector<Key> keys = std::exchange(unfenced_, {});
  if (!queued_on) return;
  for (const Key& key : keys) {
    auto it = open_.find(key);
    if (it == open_.end()) continue;  // mapped by a call that failed, and closed since
    Open& region = it->second;
    DeviceScope scope(region.device);
    if (!region.used_until) {
      if (!spare_events_.empty()) {
        region.used_until = spare_events_.back();
        spare_events_.pop_back();
      } else {
        check_cuda(cudaEventCreateWithFlags(&region.used_until, cudaEventDisableTiming),
                   "cudaEventCreate (the end of the kernels that use a peer's device memory)");
      }
    }
    check_cuda(cudaEventRecord(region.used_until, *queued_on),
               "cudaEventRecord (the end of the kernels that use a peer's device memory)");
  }
}

PeerRegions::Open& PeerRegions::open(int peer, std::uint64_t id, int device) {
  if (auto it = open_.find({peer, id}); it != open_.end()) return it->second;
  const Record record = directory_.lookup(peer, id);
  if (open_.size() >= kMaxOpen) close_least_recent();
  void* base = nullptr;
  DeviceScope scope(device);
  cudaError_t status = cudaIpcOpenMemHandle(&base, record.handle, cudaIpcMemLazyEnablePeerAccess);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw SystemError("CUDA: cudaIpcOpenMemHandle of rank " + std::to_string(peer) + "'s device memory (device " +
                      std::to_string(record.device) + ") on device " + std::to_string(device) + ": " +
                      cudaGetErrorString(status) + "; can this GPU reach the peer's (peer access, same host)?");
  }
  return open_[{peer, id}] = Open{static_cast<std::byte*>(base), static_cast<std::size_t>(record.bytes), device, 0};
}

// Waits for the kernels queued on the mapping before it unmaps it (class
// comment); at the timeout it stays open and the call fails.
void PeerRegions::close_least_recent() {
  auto oldest = open_.begin();
  for (auto it = open_.begin(); it != open_.end(); ++it)
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  Open& victim = oldest->second;
  if (victim.used_until) {
    const std::string what = "the kernels of an earlier collective that use rank " +
                             std::to_string(oldest->first.first) +
                             "'s device memory, which this rank must unmap to map another allocation, did not finish";
    DeviceScope scope(victim.device);
    wait_for_event(victim.used_until, Clock::now() + timeout_, what.c_str());
    spare_events_.push_back(victim.used_until);
  }
  cudaIpcCloseMemHandle(victim.base);
  open_.erase(oldest);
}

}  // namespace braid::comm::cuda_ipc
