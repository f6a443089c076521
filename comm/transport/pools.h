// Bookkeeping shared by the transports: a pool of request slots addressed by
// RequestId (ids are reused after release, so a transport never allocates on
// the data path once warm), and a pool of staging buffers for payloads that
// are received into transport memory.
#pragma once

#include "comm/transport/transport_only.h"

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/transport/transport.h"

namespace braid::comm {

template <class Request>
class RequestPool {
 public:
  // A fresh (value-initialised) slot.
  RequestId acquire() {
    RequestId id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      slots_[id] = Request{};
    } else {
      id = static_cast<RequestId>(slots_.size());
      slots_.emplace_back();
    }
    return id;
  }
  void release(RequestId id) { free_.push_back(id); }
  Request& operator[](RequestId id) { return slots_[id]; }
  Request& at(RequestId id) { return slots_.at(id); }

 private:
  std::vector<Request> slots_;
  std::vector<RequestId> free_;
};

using Staging = std::unique_ptr<std::vector<std::byte>>;

class StagingPool {
 public:
  // A buffer of at least `bytes`.
  Staging take(std::size_t bytes) {
    Staging buffer;
    if (!free_.empty()) {
      buffer = std::move(free_.back());
      free_.pop_back();
    } else {
      buffer = std::make_unique<std::vector<std::byte>>();
    }
    if (buffer->size() < bytes) buffer->resize(bytes);
    return buffer;
  }
  void give_back(Staging buffer) {
    if (buffer) free_.push_back(std::move(buffer));
  }

 private:
  std::vector<Staging> free_;
};

}  // namespace braid::comm
