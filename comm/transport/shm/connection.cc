// Set-up of the shm transport through the store.
//
// 1. Each local rank creates its segment "<job prefix><comm id>-<rank>"
//    (runtime/shm_names.h) holding one inbound channel per local peer, fills
//    in the header, and publishes the name under <prefix>/shm/<rank>.
// 2. It maps every local peer's segment and opens a pidfd on the peer.
// 3. A counter in the store tells when every local rank has mapped every
//    segment; then each rank unlinks its own name. From then on nothing of
//    the job is visible in /dev/shm, whatever happens to the processes; a
//    rank that dies before step 3 leaves its name behind, and braid-launch
//    removes every name with the job's prefix when the job ends.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "comm/transport/shm/link.h"
#include "runtime/errors.h"
#include "runtime/shm_names.h"
#include "runtime/store.h"

namespace braid::comm::shm {
namespace {

std::size_t round_up_pow2(std::size_t bytes) {
  std::size_t p = 4096;
  while (p < bytes) p <<= 1;
  return p;
}

// Position of `rank` among `local` without `owner`: the channel index of
// rank's inbound channel in owner's segment.
std::size_t channel_index(const std::vector<int>& local, int owner, int rank) {
  std::size_t index = 0;
  for (int r : local) {
    if (r == owner) continue;
    if (r == rank) return index;
    ++index;
  }
  throw InvalidUsage("rank " + std::to_string(rank) + " is not local to rank " + std::to_string(owner));
}

std::string segment_name(const ShmOptions& o, int rank) {
  char text[32];
  std::snprintf(text, sizeof text, "%08x-%d", o.comm_id, rank);
  return runtime::shm_job_prefix(o.job_token) + text;
}

struct UnlinkGuard {
  std::string name;
  ~UnlinkGuard() { shm_unlink(name.c_str()); }
};

std::unique_ptr<ShmTransport::Link> map_peer(runtime::Store& store, const std::string& key_prefix,
                                             const ShmOptions& o, const Mapping& mine, int peer,
                                             std::size_t bytes) {
  auto link = std::make_unique<ShmTransport::Link>();
  link->peer = peer;
  std::string name = store.get_string(key_prefix + "/shm/" + std::to_string(peer), o.timeout);
  link->mapping = Mapping::open(name, bytes);
  SegmentHeader* h = link->mapping.header();
  if (h->magic != kSegmentMagic || h->owner_rank != static_cast<std::uint32_t>(peer))
    throw RemoteError("shared memory " + name + " of rank " + std::to_string(peer) + " is not a braid segment", peer);
  std::size_t out_index = channel_index(o.local_ranks, peer, o.rank);
  std::size_t in_index = channel_index(o.local_ranks, o.rank, peer);
  link->out = link->mapping.channel(out_index);
  link->out_ring = link->mapping.ring(out_index);
  link->in = mine.channel(in_index);
  link->in_ring = mine.ring(in_index);
  link->pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(h->owner_pid), 0));
  return link;
}

}  // namespace

std::unique_ptr<ShmTransport> connect_shm(runtime::Store& store, const std::string& key_prefix,
                                          const ShmOptions& o) {
  const std::size_t channels = o.local_ranks.size() - 1, capacity = round_up_pow2(o.ring_bytes);
  const std::size_t bytes = segment_bytes(channels, capacity);
  UnlinkGuard guard{segment_name(o, o.rank)};
  Mapping mine = Mapping::create(guard.name, bytes);
  SegmentHeader* h = mine.header();
  h->owner_rank = static_cast<std::uint32_t>(o.rank);
  h->channels = static_cast<std::uint32_t>(channels);
  h->capacity = capacity;
  h->owner_pid = getpid();
  h->magic = kSegmentMagic;
  store.set(key_prefix + "/shm/" + std::to_string(o.rank), guard.name);
  std::vector<std::unique_ptr<ShmTransport::Link>> links;
  for (int peer : o.local_ranks)
    if (peer != o.rank) links.push_back(map_peer(store, key_prefix, o, mine, peer, bytes));
  // One counter per host: the group is named by its lowest rank.
  std::string group = key_prefix + "/shm_group" + std::to_string(o.local_ranks.front());
  if (store.add(group + "/mapped", 1) == static_cast<std::int64_t>(o.local_ranks.size()))
    store.set(group + "/ready", "1");
  store.wait({group + "/ready"}, o.timeout);
  return std::make_unique<ShmTransport>(o, std::move(mine), std::move(links));
}

}  // namespace braid::comm::shm
