// Private to the cuda_ipc transport (transport.h describes it): the records
// a rank publishes for the device allocations it shares, this rank's
// exports, and the peers' allocations opened here.
#pragma once

#include "comm/transport/transport_only.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/types.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm::cuda_ipc {

inline constexpr std::uint64_t kRecordMagic = 0x3143504955434242ull;  // "BBCUIPC1"

// What a rank publishes for one allocation it shares: the IPC handle and
// the extent a peer's offsets are checked against.
struct Record {
  std::uint64_t magic = kRecordMagic;
  std::uint32_t owner = 0;  // the rank that registered it
  std::int32_t device = 0;
  std::uint64_t id = 0;     // RegionRef::key[0]; ids start at 1
  std::uint64_t bytes = 0;  // the allocation's extent
  cudaIpcMemHandle_t handle{};
};

// The records in the store, under <prefix>/cuda_ipc/<owner>/<id>
// (connection.cc).
class Directory {
 public:
  Directory(std::shared_ptr<runtime::Store> store, std::string key_prefix);
  void publish(const Record& record);
  // Best effort: the record of an allocation that is gone.
  void withdraw(int owner, std::uint64_t id);
  // The record `owner` published under `id`. It is in the store before the
  // owner sends a reference to it, so none (or a malformed one) means the
  // owner named memory it never registered: RemoteError naming it.
  Record lookup(int owner, std::uint64_t id);

 private:
  std::string key(int owner, std::uint64_t id) const;

  std::shared_ptr<runtime::Store> store_;
  std::string key_prefix_;
};

// This rank's device allocations shared so far, by base address. Used from
// the caller's thread (select.cc's question) and the engine's (the
// algorithm's), so it locks.
class Exports {
 public:
  Exports(int rank, Directory& directory) : rank_(rank), directory_(directory) {}
  // Whether [data, data + bytes) lies in a device allocation that IPC can
  // share, on the device of the first one shared (a communicator works on
  // one device); fills `ref` (publishing the allocation's record first if
  // it is new). False for host memory and for allocations IPC cannot share
  // (cudaMallocAsync pools, ...), whose calls are staged instead.
  bool find(const void* data, std::size_t bytes, RegionRef& ref);
  // The device of the allocations shared, -1 before the first.
  int device() const;

 private:
  struct Entry {
    std::uint64_t id = 0;
    std::size_t bytes = 0;
    cudaIpcMemHandle_t handle{};
  };
  bool export_entry(const void* base, std::size_t bytes, int device, Entry& entry);

  int rank_;
  Directory& directory_;
  mutable std::mutex mu_;
  std::map<const void*, Entry> by_base_;
  std::uint64_t last_id_ = 0;
  int device_ = -1;
};

// The peers' allocations opened in this process (the engine's thread
// only), by (peer, id). At most kMaxOpen stay open; past that the least
// recently used is closed, never one the current collective uses (it maps
// at most 2 x kMaxDirectRanks).
//
// A mapping is closed only once the kernels that use it are done. Under
// the gates that leave a direct collective's steps queued (event, flag:
// comm/device.h) the host runs ahead of the GPU, and a call many calls
// later may evict a mapping that an earlier call's kernels, still queued
// behind work on the caller's stream, have yet to read: CUDA's documentation
// does not say that cudaIpcCloseMemHandle waits for them. So after each
// direct collective (used) the mappings it touched get an event recorded
// on the stream its steps are queued on, and closing one waits for its
// event (bounded by the communicator's timeout; a TimeoutError leaves it
// open). One event per mapping is enough: its last record comes after
// every earlier use, since the steps of gate `event` all go on the
// Reducer's one stream, and each call of gate `flag`, whatever its stream,
// waits on the device for the end of the one before (device_reducer_cuda.cc).
// So the host runs at most about kMaxOpen of the peers' allocations ahead
// of the GPU. The destructor closes only the mappings whose event has
// completed and leaves the rest to the process's end.
class PeerRegions {
 public:
  static constexpr std::size_t kMaxOpen = 64;

  PeerRegions(Directory& directory, std::chrono::milliseconds timeout) : directory_(directory), timeout_(timeout) {}
  ~PeerRegions();
  PeerRegions(const PeerRegions&) = delete;
  PeerRegions& operator=(const PeerRegions&) = delete;

  // The bytes `ref` names in `peer`'s memory, opened on `device`;
  // RemoteError naming the peer when ref lies outside what it registered.
  std::span<std::byte> map(int peer, const RegionRef& ref, int device);
  // The mappings handed out since the last call are used by kernels queued
  // on `queued_on` (null: by none still queued).
  void used(cudaStream_t* queued_on);

 private:
  using Key = std::pair<int, std::uint64_t>;  // (peer, id)
  struct Open {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    int device = 0;
    std::uint64_t last_use = 0;
    cudaEvent_t used_until = nullptr;  // after the last kernels queued on it; null: none queued yet
  };
  Open& open(int peer, std::uint64_t id, int device);
  void close_least_recent();

  Directory& directory_;
  std::chrono::milliseconds timeout_;
  std::map<Key, Open> open_;
  std::vector<Key> unfenced_;             // mapped since the last used()
  std::vector<cudaEvent_t> spare_events_;  // of closed mappings, for the next
  std::uint64_t uses_ = 0;
};

}  // namespace braid::comm::cuda_ipc
