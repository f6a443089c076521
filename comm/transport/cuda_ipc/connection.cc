// Set-up of the cuda_ipc transport and its records in the store.
//
// A record is published with Store::set, which returns once the store holds
// it, before the owner sends any reference to the allocation; a peer that
// has received a reference therefore finds the record with try_get, and
// one it does not find was never published: the reference is forged or
// stale, refused by name rather than waited for.
#include <cstring>

#include "comm/transport/cuda_ipc/memory.h"
#include "comm/transport/cuda_ipc/transport.h"
#include "runtime/errors.h"
#include "runtime/store.h"

namespace braid::comm::cuda_ipc {

Directory::Directory(std::shared_ptr<runtime::Store> store, std::string key_prefix)
    : store_(std::move(store)), key_prefix_(std::move(key_prefix)) {}

std::string Directory::key(int owner, std::uint64_t id) const {
  return key_prefix_ + "/cuda_ipc/" + std::to_string(owner) + "/" + std::to_string(id);
}

void Directory::publish(const Record& record) {
  if (!store_) return;  // a communicator of one rank: nobody reads it
  runtime::Bytes value(sizeof(Record));
  std::memcpy(value.data(), &record, sizeof(Record));
  store_->set(key(static_cast<int>(record.owner), record.id), value);
}

void Directory::withdraw(int owner, std::uint64_t id) {
  if (!store_) return;
  try {
    store_->remove(key(owner, id));
  } catch (const Error&) {
    // The store is gone; so is everyone who could read the record.
  }
}

Record Directory::lookup(int owner, std::uint64_t id) {
  const std::string who = "rank " + std::to_string(owner);
  std::optional<runtime::Bytes> value = store_ ? store_->try_get(key(owner, id)) : std::nullopt;
  if (!value)
    throw RemoteError(who + " named device memory it has not registered (region " + std::to_string(id) +
                          " was never published under " + key(owner, id) + ")",
                      owner);
  Record record;
  if (value->size() == sizeof(Record)) std::memcpy(&record, value->data(), sizeof(Record));
  if (value->size() != sizeof(Record) || record.magic != kRecordMagic || record.owner != static_cast<std::uint32_t>(owner) ||
      record.id != id || record.bytes == 0)
    throw RemoteError(who + " published a malformed CUDA IPC record under " + key(owner, id) +
                          " (another braid version, or not braid)",
                      owner);
  return record;
}

std::unique_ptr<Transport> connect_cuda_ipc(std::shared_ptr<runtime::Store> store, const std::string& key_prefix,
                                            const CudaIpcOptions& options) {
  return std::make_unique<CudaIpcTransport>(std::move(store), key_prefix, options);
}

}  // namespace braid::comm::cuda_ipc
