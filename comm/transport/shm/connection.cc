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
//
// A rank that fails on the way (no room in /dev/shm, no descriptor left)
// writes "!<rank>!<reason>" into the keys its local peers wait on (its own
// name and the group's ready flag), so that every one of them fails at once
// with that reason instead of waiting for it until the timeout. One killed
// on the way writes nothing: the waits look at the pidfds of the peers
// mapped so far between slices (wait_watching), so that its peers name it
// at once rather than a store key at the timeout.
//
// Ring memory grows with the square of the local ranks (each ordered pair
// has a channel), so the ring size is bounded by the host's budget
// (ring_capacity()); every rank derives it from the same settings. When every
// rank of the communicator is on this host, each segment also holds its
// owner's shared slots (memory.h).
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>


#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "comm/resources.h"
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
  return runtime::shm_run_prefix(o.job_token, o.run_id) + text;
}

constexpr char kFailedMark = '!';

// One counter and ready flag per host: the group is named by its lowest rank.
std::string group_key(const std::string& key_prefix, const ShmOptions& o) {
  return key_prefix + "/shm_group" + std::to_string(o.local_ranks.front());
}

// This process's PID namespace (SegmentHeader::owner_pid_ns); 0 where
// /proc does not say.
std::uint64_t pid_namespace() {
  struct stat ns {};
  return ::stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<std::uint64_t>(ns.st_ino) : 0;
}

// A peer's failure, relayed: this rank reports it but does not publish it
// again as its own.
class PeerSetupFailed : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

// Throws when a value read from the store is a peer's failure mark.
void check_not_failed(const std::string& value, const ShmOptions& o) {
  if (value.empty() || value[0] != kFailedMark) return;
  auto end = value.find(kFailedMark, 1);
  int failed = std::atoi(value.c_str() + 1);
  throw PeerSetupFailed(rank_text(o.rank) + " cannot set up shared memory with its local peers because " +
                            rank_text(failed) + " failed: " + value.substr(end + 1),
                        failed);
}

// The mark names the rank at fault (`culprit`: this one, or a peer it saw
// die), so that a rank passing it on names that rank too, not the reporter.
void publish_failure(runtime::Store& store, const std::string& key_prefix, const std::string& group,
                     const ShmOptions& o, const std::string& why, int culprit) {
  std::string mark = kFailedMark + std::to_string(culprit) + kFailedMark + why;
  try {
    store.set(key_prefix + "/shm/" + std::to_string(o.rank), mark);
    store.set(group + "/ready", mark);
  } catch (const Error&) {
    // The store itself failed: the peers' waits time out naming it.
  }
}

void log_ring_size(const ShmOptions& o, std::size_t capacity) {
  const std::size_t local = o.local_ranks.size(), configured = round_up_pow2(o.ring_bytes);
  if (capacity == configured || o.rank != o.local_ranks.front()) return;
  const std::size_t total = local * (local - 1) * capacity;
  // At the floor the rings may take more than BRAID_SHM_HOST_BYTES; the log
  // said "within" it all the same.
  if (total > o.host_bytes) {
    spdlog::warn("shm: {} local ranks have {} rings of {} bytes, the least a ring may have: together {} bytes, "
                 "past BRAID_SHM_HOST_BYTES={}",
                 local, local * (local - 1), capacity, total, o.host_bytes);
    return;
  }
  spdlog::info("shm: {} local ranks have {} rings; each has {} bytes instead of BRAID_SHM_RING_BYTES={} so that "
               "together they take {} bytes, within BRAID_SHM_HOST_BYTES={} (rings never go below {} bytes)",
               local, local * (local - 1), capacity, configured, total, o.host_bytes, kMinRingBytes);
}

// Removes this rank's segment once it was made (armed): not a name that
// creating found taken (EEXIST), which may be another running job's.
struct UnlinkGuard {
  std::string name;
  bool armed = false;
  ~UnlinkGuard() {
    if (armed) shm_unlink(name.c_str());
  }
};

using Links = std::vector<std::unique_ptr<ShmTransport::Link>>;

// Waits for `key` as long as store.wait, in slices between which it looks
// whether a peer of `links` has exited: a rank killed during set-up (a
// SIGKILL, the OOM killer) left its peers waiting for the group's ready
// flag until BRAID_TIMEOUT, and then naming only the key.
// Past the timeout it says what it waited for, and for how long in all.
// A peer that exited after publishing its failure (it saw another die, and
// said so) is not the one to name: with rank 2 killed, rank 0 reported it
// and exited, and rank 1, looking at its peers in order, named rank 0.
// The first peer that exited without a word is named; where every one left
// its failure, the first of those is passed on.
void wait_watching(runtime::Store& store, const std::string& key_prefix, const std::string& key,
                   const ShmOptions& o, const Links& links, const std::string& what) {
  constexpr std::chrono::milliseconds kSlice{250};
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      return store.wait({key}, std::clamp(left, std::chrono::milliseconds(0), kSlice));
    } catch (const TimeoutError&) {
      if (left <= kSlice)
        throw TimeoutError(rank_text(o.rank) + " waited " + std::to_string(o.timeout.count()) +
                           " ms (BRAID_TIMEOUT) for " + what + " (key '" + key + "' in the store): a rank may have "
                           "failed, not started, or be stopped");
    }
    std::optional<std::string> relayed;  // the first failure an exited peer published
    for (const auto& link : links) {
      if (!has_exited(link->pidfd)) continue;
      if (store.try_get(key)) return;  // it finished set-up (and its work) in the meantime
      const std::optional<runtime::Bytes> said = store.try_get(key_prefix + "/shm/" + std::to_string(link->peer));
      if (said && !said->empty() && said->front() == kFailedMark) {
        if (!relayed) relayed.emplace(said->begin(), said->end());
        continue;
      }
      throw RemoteError(rank_text(o.rank) + " was setting up shared memory with its local peer " +
                            rank_text(link->peer) + " (pid " + std::to_string(link->mapping.header()->owner_pid) +
                            "), which exited or was killed before every local rank had mapped its peers",
                        link->peer);
    }
    if (relayed) check_not_failed(*relayed, o);
  }
}

std::unique_ptr<ShmTransport::Link> map_peer(runtime::Store& store, const std::string& key_prefix,
                                             const ShmOptions& o, const Mapping& mine, int peer,
                                             std::size_t bytes, const Links& mapped) {
  auto link = std::make_unique<ShmTransport::Link>();
  link->peer = peer;
  const std::string key = key_prefix + "/shm/" + std::to_string(peer);
  wait_watching(store, key_prefix, key, o, mapped, rank_text(peer) + " to publish its shared-memory segment");
  std::string name = store.get_string(key, o.timeout);
  check_not_failed(name, o);
  // A peer that failed meanwhile took its segment away with it: its
  // failure says more than the missing file. One that only passed on
  // another rank's failure marks nothing of its own, so the group's ready
  // key, where every failure is published, is looked at too.
  auto passed_on = [&] {
    for (const std::string& said : {key, group_key(key_prefix, o) + "/ready"})
      if (const std::optional<runtime::Bytes> now = store.try_get(said))
        check_not_failed({now->begin(), now->end()}, o);
  };
  try {
    link->mapping = Mapping::open(name, bytes);
  } catch (const Error&) {
    passed_on();
    throw;
  }
  SegmentHeader* h = link->mapping.header();
  if (h->magic != kSegmentMagic || h->owner_rank != static_cast<std::uint32_t>(peer))
    throw RemoteError("shared memory " + name + " of rank " + std::to_string(peer) + " is not a braid segment", peer);
  std::size_t out_index = channel_index(o.local_ranks, peer, o.rank);
  std::size_t in_index = channel_index(o.local_ranks, o.rank, peer);
  link->out = link->mapping.channel(out_index);
  link->out_ring = link->mapping.ring(out_index);
  link->in = mine.channel(in_index);
  link->in_ring = mine.ring(in_index);
  // A peer in another PID namespace (a container sharing /dev/shm) is not
  // watched: its pid names another process here, or none.
  const std::uint64_t here = pid_namespace();
  const bool same_namespace = h->owner_pid_ns != 0 && h->owner_pid_ns == here;
  int err = 0;
  if (h->owner_pid_ns == 0 || here == 0 || same_namespace) {
    link->pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(h->owner_pid), 0));
    if (link->pidfd < 0) err = errno;
  }
  // Without a pidfd (an old kernel) a dead peer is still noticed by its
  // closed flag or the timeout; without descriptors nothing more will work.
  if (err == EMFILE || err == ENFILE) {
    std::string what = rank_text(o.rank) + " opening a pidfd on its local peer " + rank_text(peer);
    throw SystemError(errno_message(what, err) + fd_limit_hint(err));
  }
  // Gone before this rank mapped it (killed after publishing its segment):
  // nothing would have noticed before BRAID_TIMEOUT. Unless it said why.
  if (err == ESRCH && same_namespace) {
    passed_on();
    throw RemoteError(rank_text(o.rank) + " was setting up shared memory with its local peer " + rank_text(peer) +
                          " (pid " + std::to_string(h->owner_pid) +
                          "), which exited or was killed before this rank had mapped its segment",
                      peer);
  }
  return link;
}

// Shared slots only where they cover the whole communicator.
std::size_t slot_area(const ShmOptions& o) {
  return static_cast<int>(o.local_ranks.size()) == o.size ? slot_area_bytes(static_cast<std::size_t>(o.size)) : 0;
}

Mapping create_segment(const ShmOptions& o, const std::string& name, std::size_t channels, std::size_t capacity) {
  remove_stale_segment(name);
  const std::size_t local = o.local_ranks.size(), bytes = segment_bytes(channels, capacity, slot_area(o));
  std::string purpose = rank_text(o.rank) + "'s shared-memory segment (a ring of " + std::to_string(capacity) +
                        " bytes for each of its " + std::to_string(channels) + " local peer(s); this host's " +
                        std::to_string(local) + " local ranks need " + std::to_string(local * bytes) +
                        " bytes in all)";
  Mapping mine = Mapping::create(name, bytes, purpose);
  SegmentHeader* h = mine.header();
  h->owner_rank = static_cast<std::uint32_t>(o.rank);
  h->channels = static_cast<std::uint32_t>(channels);
  h->capacity = capacity;
  h->owner_pid = getpid();
  h->owner_pid_ns = pid_namespace();
  h->slot_area = slot_area(o);
  h->magic = kSegmentMagic;
  return mine;
}

// Steps 1 to 3 of the set-up (see the top of this file), with this rank's
// segment under guard.name (armed once made; the caller's guard unlinks it).
std::unique_ptr<ShmTransport> connect_segments(runtime::Store& store, const std::string& key_prefix,
                                               const std::string& group, const ShmOptions& o, UnlinkGuard& guard) {
  const std::size_t channels = o.local_ranks.size() - 1;
  const std::size_t capacity = ring_capacity(o.local_ranks.size(), o.ring_bytes, o.host_bytes);
  log_ring_size(o, capacity);
  Mapping mine = create_segment(o, guard.name, channels, capacity);
  guard.armed = true;
  store.set(key_prefix + "/shm/" + std::to_string(o.rank), guard.name);
  Links links;
  for (int peer : o.local_ranks)
    if (peer != o.rank)
      links.push_back(
          map_peer(store, key_prefix, o, mine, peer, segment_bytes(channels, capacity, slot_area(o)), links));
  if (store.add(group + "/mapped", 1) == static_cast<std::int64_t>(o.local_ranks.size()))
    store.set(group + "/ready", "1");
  wait_watching(store, key_prefix, group + "/ready", o, links,
                "every local rank to map the others' shared-memory segments (" +
                    std::to_string(o.local_ranks.size()) + " local ranks)");
  check_not_failed(store.get_string(group + "/ready", o.timeout), o);
  return std::make_unique<ShmTransport>(o, std::move(mine), std::move(links));
}

}  // namespace

// A segment of this name left by an earlier run of the job (the same
// token and run id: rerun on the same MASTER_ADDR:MASTER_PORT without a
// launcher) whose owner was killed before it could remove it: it made
// every rerun fail at once ("File exists"), naming a process that no
// longer ran, until someone deleted it by hand. Removed here where its
// header names an owner of this PID namespace that is gone; one of an
// owner still running, or not yet written, is left (creating fails, as it
// should, for two jobs given one token).
void remove_stale_segment(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return;
  // SegmentHeader's first words, as plain fields (it holds atomics).
  struct Prefix {
    std::uint64_t magic;
    std::uint32_t owner_rank, channels;
    std::uint64_t capacity;
    std::int64_t owner_pid;
    std::uint64_t owner_pid_ns;
  } header{};
  static_assert(offsetof(SegmentHeader, owner_pid) == offsetof(Prefix, owner_pid) &&
                offsetof(SegmentHeader, owner_pid_ns) == offsetof(Prefix, owner_pid_ns));
  struct stat st {};
  const bool readable = fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(SegmentHeader) &&
                        ::pread(fd, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  ::close(fd);
  if (!readable || header.magic != kSegmentMagic || header.owner_pid <= 0) return;
  if (header.owner_pid_ns == 0 || header.owner_pid_ns != pid_namespace()) return;
  if (::kill(static_cast<pid_t>(header.owner_pid), 0) == 0 || errno != ESRCH) return;
  if (shm_unlink(name.c_str()) == 0)
    spdlog::warn("removed the shared-memory segment {} (rank {} of an earlier run of this job, pid {}, which was "
                 "killed before it could remove it)",
                 name, header.owner_rank, header.owner_pid);
}

std::size_t ring_capacity(std::size_t local_ranks, std::size_t ring_bytes, std::size_t host_bytes) {
  const std::size_t rings = local_ranks * (local_ranks > 0 ? local_ranks - 1 : 0);
  std::size_t capacity = round_up_pow2(ring_bytes);
  while (capacity > kMinRingBytes && rings * capacity > host_bytes) capacity /= 2;
  return capacity;
}

std::unique_ptr<ShmTransport> connect_shm(runtime::Store& store, const std::string& key_prefix,
                                          const ShmOptions& o) {
  const std::string group = group_key(key_prefix, o);
  // This rank's segment goes only after a failure is published: a peer
  // that found it gone between the two (ENOENT) had no failure to name and
  // said only "No such file or directory" (a review helper's case).
  UnlinkGuard guard{segment_name(o, o.rank)};
  try {
    return connect_segments(store, key_prefix, group, o, guard);
  } catch (const PeerSetupFailed&) {
    throw;
  } catch (const std::exception& e) {
    const auto* remote = dynamic_cast<const RemoteError*>(&e);
    publish_failure(store, key_prefix, group, o, e.what(), remote && remote->peer() >= 0 ? remote->peer() : o.rank);
    throw;
  }
}

}  // namespace braid::comm::shm
