#include "comm/transport/ibverbs/memory.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "comm/transport/shm/memory.h"
#include "runtime/errors.h"

namespace braid::comm::ibverbs {

Registered::Registered(ibv_pd* pd, std::size_t bytes, const char* what) : bytes_(bytes) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw SystemError(errno_message(std::string("allocating the RDMA ") + what, errno));
  data_ = static_cast<std::byte*>(memory);
  mr_ = ibv_reg_mr(pd, data_, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr_) {
    int error = errno;
    reset();
    throw SystemError(errno_message(std::string("registering the RDMA ") + what + " (" + std::to_string(bytes) +
                                        " bytes; is RLIMIT_MEMLOCK (ulimit -l) large enough?)",
                                    error));
  }
}

Registered::Registered(Registered&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mr_(std::exchange(other.mr_, nullptr)) {}

Registered& Registered::operator=(Registered&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mr_ = std::exchange(other.mr_, nullptr);
  }
  return *this;
}

Registered::~Registered() { reset(); }

void Registered::reset() {
  if (mr_) ibv_dereg_mr(mr_);
  if (data_) munmap(data_, bytes_);
  mr_ = nullptr;
  data_ = nullptr;
}

std::uint32_t Registered::lkey() const { return mr_->lkey; }
std::uint32_t Registered::rkey() const { return mr_->rkey; }

namespace {

constexpr std::uint64_t kFrameMask = (std::uint64_t{1} << 55) - 1;  // pagemap bits 0-54
constexpr std::uint64_t kPresent = std::uint64_t{1} << 63;

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

const std::byte* page_floor(const std::byte* p) {
  return reinterpret_cast<const std::byte*>(reinterpret_cast<std::uintptr_t>(p) / page_size() * page_size());
}

const std::byte* page_ceil(const std::byte* p) {
  return page_floor(p + page_size() - 1);
}

}  // namespace

RegistrationCache::RegistrationCache(ibv_pd* pd, std::size_t max_bytes, std::size_t max_entries)
    : pd_(pd), max_bytes_(max_bytes), max_entries_(max_entries) {
  pagemap_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  // Whether frame numbers can be read here: those of a page this process
  // just wrote are non-zero unless the kernel hides them.
  static thread_local std::uint64_t probe = 1;
  probe += 1;
  std::vector<std::uint64_t> frame;
  frames_readable_ = pagemap_ >= 0 && read_frames(page_floor(reinterpret_cast<const std::byte*>(&probe)), 1, frame) &&
                     (frame[0] & kFrameMask) != 0;
  spdlog::debug("ibverbs: registration cache of {} bytes, {} entries; user buffers {}", max_bytes_, max_entries_,
                frames_readable_ ? "registered (page frames checked on each use)"
                                 : "copied through the rings (page frames unreadable here)");
}

RegistrationCache::~RegistrationCache() {
  for (auto& e : entries_)
    if (e.mr) ibv_dereg_mr(e.mr);
  if (pagemap_ >= 0) close(pagemap_);
}

bool RegistrationCache::read_frames(const std::byte* page, std::size_t pages, std::vector<std::uint64_t>& frames) {
  frames.resize(pages);
  const off_t at = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(page) / page_size() * sizeof(std::uint64_t));
  const std::size_t want = pages * sizeof(std::uint64_t);
  std::size_t got = 0;
  while (got < want) {
    ssize_t n = pread(pagemap_, reinterpret_cast<char*>(frames.data()) + got, want - got, at + static_cast<off_t>(got));
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  for (auto& f : frames) f = (f & kPresent) ? (f & kFrameMask) : 0;  // 0: not present, never valid
  return true;
}

// Whether the pages under [data, data + bytes) are the ones `e` registered.
bool RegistrationCache::still_valid(const Entry& e, const std::byte* data, std::size_t bytes) {
  if (e.inode != 0) {
    shm::regions::Extent now;
    return shm::regions::extent(data, now) && now.base == e.base && now.inode == e.inode;
  }
  const std::byte* first = page_floor(data);
  const std::size_t pages = static_cast<std::size_t>(page_ceil(data + bytes) - first) / page_size();
  if (!read_frames(first, pages, frames_now_)) return false;
  const std::size_t skip = static_cast<std::size_t>(first - e.base) / page_size();
  return std::equal(frames_now_.begin(), frames_now_.end(), e.frames.begin() + static_cast<std::ptrdiff_t>(skip)) &&
         std::find(frames_now_.begin(), frames_now_.end(), 0) == frames_now_.end();
}

int RegistrationCache::find(const std::byte* data, std::size_t bytes) {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (!e.mr || data < e.base || data + bytes > e.base + e.bytes) continue;
    if (still_valid(e, data, bytes)) return static_cast<int>(i);
    if (e.pins == 0) drop(i);  // stale: the memory under it changed
  }
  return -1;
}

// Entries keep their index while pinned (MemoryKey::entry), so a dropped
// one leaves a free slot (mr null) for the next registration.
void RegistrationCache::drop(std::size_t index) {
  Entry& e = entries_[index];
  bytes_ -= e.bytes;
  ibv_dereg_mr(e.mr);
  e = Entry{};
  --live_;
}

// Unregisters least recently used entries no request holds until `bytes`
// more fit; false when they cannot be made to.
bool RegistrationCache::make_room(std::size_t bytes) {
  while (live_ > 0 && (bytes_ + bytes > max_bytes_ || live_ >= max_entries_)) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->mr && it->pins == 0 && (victim == entries_.end() || it->last_use < victim->last_use)) victim = it;
    if (victim == entries_.end()) return false;
    drop(static_cast<std::size_t>(victim - entries_.begin()));
  }
  return bytes_ + bytes <= max_bytes_;
}

int RegistrationCache::add(const std::byte* base, std::size_t bytes, std::uint64_t inode) {
  if (!make_room(bytes)) return -1;
  Entry e;
  e.base = base;
  e.bytes = bytes;
  e.inode = inode;
  // Writable access makes the kernel fault every page in for writing before
  // it pins it: a read-only pin of never-written memory would pin the shared
  // zero page, and the program's first write would move the buffer away.
  e.mr = ibv_reg_mr(pd_, const_cast<std::byte*>(base), bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!e.mr) {
    // Logged once per cause: a read-only buffer (EFAULT, EACCES) says
    // nothing of the locked-memory limit, which a later failure may.
    const int error = errno;
    const bool limit = error == ENOMEM || error == EPERM || error == EAGAIN;
    bool& logged = limit ? refused_logged_ : other_refusal_logged_;
    if (!logged)
      spdlog::info("ibverbs: registering {} bytes failed ({}); such buffers are copied through the rings{}", bytes,
                   std::strerror(error),
                   limit ? " (raise ulimit -l for direct writes)" : " (a buffer the process may not write: read-only memory?)");
    logged = true;
    return -1;
  }
  if (inode == 0 && !read_frames(base, bytes / page_size(), e.frames)) {
    ibv_dereg_mr(e.mr);
    return -1;
  }
  bytes_ += bytes;
  ++live_;
  auto slot = std::find_if(entries_.begin(), entries_.end(), [](const Entry& x) { return !x.mr; });
  if (slot == entries_.end()) slot = entries_.insert(slot, Entry{});
  *slot = std::move(e);
  return static_cast<int>(slot - entries_.begin());
}

std::optional<MemoryKey> RegistrationCache::pin(const void* pointer, std::size_t bytes) {
  const auto* data = static_cast<const std::byte*>(pointer);
  if (data == nullptr || bytes == 0) return std::nullopt;
  int index = find(data, bytes);
  if (index < 0) {
    shm::regions::Extent region;
    if (shm::regions::extent(data, region) && data + bytes <= region.base + region.bytes)
      index = add(region.base, region.bytes, region.inode);
    else if (frames_readable_)
      index = add(page_floor(data), static_cast<std::size_t>(page_ceil(data + bytes) - page_floor(data)), 0);
    if (index < 0) return std::nullopt;
  }
  Entry& e = entries_[static_cast<std::size_t>(index)];
  ++e.pins;
  e.last_use = ++clock_;
  return MemoryKey{reinterpret_cast<std::uint64_t>(e.base), e.bytes, e.mr->lkey, e.mr->rkey, index};
}

void RegistrationCache::unpin(const MemoryKey& key) {
  if (key.entry >= 0 && static_cast<std::size_t>(key.entry) < entries_.size()) --entries_[key.entry].pins;
}

}  // namespace braid::comm::ibverbs
