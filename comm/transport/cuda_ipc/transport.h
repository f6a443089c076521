// The CUDA IPC transport: registered regions of CUDA device memory for the
// ranks of one host (DESIGN.md "Registered regions").
//
// Design: cuda_ipc is a capability provider and carries no messages. The
// ranks it serves share a host, so the shm transport already reaches every
// one of them, and a direct collective only needs small messages (region
// references, a closing barrier) next to the mapped memory: those go
// through the shm transport like every other message (the Exchange routes
// by peer), and this transport's post_send / post_recv refuse by name.
// What it adds is the Transport interface's region half for device memory,
// which the Exchange asks for when a call's buffers are on a device:
//
//   find_region  this rank's device allocation holding the buffer
//                (runtime::locate), exported once with cudaIpcGetMemHandle
//                and published in the store as a record under
//                <prefix>/cuda_ipc/<rank>/<id>: the handle and the
//                allocation's extent. The RegionRef names (id, offset,
//                bytes); the handle never reaches an algorithm.
//   map_region   a peer's (id, offset, bytes): the record read from the
//                store, checked (its owner, its id), the handle opened
//                with cudaIpcOpenMemHandle (cached; past kMaxOpen the
//                least recently used is closed, once the kernels that use
//                it are done), and offset + bytes checked against the
//                extent the owner registered: a reference outside it,
//                or one naming an id the peer never published, is a
//                RemoteError naming the peer.
//
// Set-up goes through the store like the other transports', but lazily:
// the communicator connects it with its first call on device memory
// (DeviceStaging::connect_regions: it is built with the rest of the CUDA
// code), connect_cuda_ipc touches neither CUDA nor the store, and a rank
// publishes a record the first time it shares an allocation (before it
// sends the first reference to it, so a peer that has the reference finds
// the record). A communicator that never sees device memory pays nothing. An
// allocation is recognised by its base address and IPC handle; when the
// base comes back with another handle (freed and allocated again) it gets
// a new id and its old record is removed.
#pragma once

#include "comm/transport/transport_only.h"

#include <memory>
#include <string>
#include <vector>

#include "comm/transport/transport.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm::cuda_ipc {

struct CudaIpcOptions : ConnectOptions {
  std::vector<int> local_ranks;  // ranks of this host, this one included: the peers whose memory IPC reaches
};

// The transport for `options.local_ranks` (CUDA builds only).
std::unique_ptr<Transport> connect_cuda_ipc(std::shared_ptr<runtime::Store> store, const std::string& key_prefix,
                                            const CudaIpcOptions& options);

class Directory;    // the records in the store (memory.h)
class Exports;      // this rank's shared allocations
class PeerRegions;  // the peers' allocations opened here

class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(std::shared_ptr<runtime::Store> store, std::string key_prefix, const CudaIpcOptions& options);
  ~CudaIpcTransport() override;

  std::string_view name() const override { return "cuda_ipc"; }
  // No messages: the shm transport carries them (see above).
  RequestId post_send(int peer, const WireHeader& header, const void* data) override;
  RequestId post_recv(int peer, const WireHeader& expected, void* data, Placement placement) override;
  bool is_done(RequestId request) override;
  std::span<const std::byte> view(RequestId request) override;
  void release(RequestId request) override;
  bool progress(Clock::time_point deadline) override { return false; }
  void shutdown() override {}
  std::uint64_t bytes_sent() const override { return 0; }
  std::uint64_t bytes_received() const override { return 0; }

  bool find_region(const void* data, std::size_t bytes, RegionRef& ref) override;
  std::span<std::byte> map_region(int peer, const RegionRef& ref) override;
  // Mappings are closed only once the kernels that use them are done
  // (memory.h, PeerRegions).
  void regions_used(const Stream* queued_on) override;

 private:
  [[noreturn]] void no_messages() const;

  int rank_;
  std::vector<bool> local_;  // [rank] on this host
  std::unique_ptr<Directory> directory_;  // outlives the two below, which refer to it
  std::unique_ptr<Exports> exports_;
  std::unique_ptr<PeerRegions> peers_;
};

}  // namespace braid::comm::cuda_ipc
