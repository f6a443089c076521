// Private to the shm transport: what a rank holds for one local peer.
#pragma once

#include "comm/transport/transport_only.h"

#include <unistd.h>

#include <deque>

#include "comm/transport/shm/transport.h"

namespace braid::comm::shm {

struct ShmTransport::Link {
  int peer = -1;
  int pidfd = -1;          // readable once the peer's process has exited
  Mapping mapping;         // the peer's segment, holding this rank's outbound channel
  ChannelControl* out = nullptr;
  std::byte* out_ring = nullptr;
  ChannelControl* in = nullptr;  // the peer's channel in this rank's own segment
  std::byte* in_ring = nullptr;
  std::deque<RequestId> sends, recvs;
  std::deque<RequestId> views;   // in-place views handed out, in ring order
  std::uint64_t cursor = 0;      // inbound bytes parsed so far (tail trails it while views are held)
  regions::PeerRegions regions;  // the peer's registered memory mapped here

  Link() = default;
  Link(const Link&) = delete;
  ~Link() {
    if (pidfd >= 0) close(pidfd);
  }
};

}  // namespace braid::comm::shm
