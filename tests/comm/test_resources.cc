// Fault-and-abuse cases for exhausted resources (issue 13), on real forked
// ranks: a /dev/shm too small for the rings, the rings' bound as local
// ranks grow, and communicators created past the descriptor limit. Each
// ends in a named error on every rank, well within the timeout, never a
// SIGBUS or a hang.
//
// The /dev/shm cases run their ranks in a child process that has its own
// mount namespace with a small tmpfs on /dev/shm (so the ranks share that
// /dev/shm and nothing else sees it; it vanishes with the child). They are
// skipped, with the reason printed, where mount namespaces are not
// permitted.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/transport/shm/memory.h"
#include "comm/transport/shm/transport.h"
#include "tests/comm/failure_util.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using namespace braid::test::failures;
using braid::test::expect;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// Every rank's BRAID_TIMEOUT here. A failure must arrive well within it:
// a rank that learns of a peer's failure only by timing out fails the test.
constexpr seconds kTimeout{20};
constexpr milliseconds kWellWithinTimeout = kTimeout / 2;

// In the child: a mount namespace of its own, "/" private so nothing
// propagates out, and a tmpfs of `bytes` on /dev/shm. Returns why not, or "".
std::string enter_short_shm(std::size_t bytes) {
  if (unshare(CLONE_NEWNS) != 0)
    return std::string("unshare(CLONE_NEWNS) failed: ") + std::strerror(errno) + " (needs root or CAP_SYS_ADMIN)";
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("making / private failed: ") + std::strerror(errno);
  std::string options = "size=" + std::to_string(bytes);
  if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0)
    return std::string("mounting a tmpfs on /dev/shm failed: ") + std::strerror(errno);
  return "";
}

void write_result(const std::string& path, const test::RunResult& r) {
  std::ofstream out(path, std::ios::binary);
  out << "ran " << r.timed_out << ' ' << r.leftover_shm << ' ' << r.elapsed.count() << ' ' << r.ranks.size() << '\n';
  for (const auto& rank : r.ranks)
    out << rank.exit_code << ' ' << rank.signal << ' ' << rank.message.size() << '\n' << rank.message << '\n';
}

test::RunResult read_result(std::istream& in) {
  test::RunResult r;
  std::size_t ranks = 0;
  long elapsed = 0;
  in >> r.timed_out >> r.leftover_shm >> elapsed >> ranks;
  r.elapsed = std::chrono::milliseconds(elapsed);
  r.ranks.resize(ranks);
  for (auto& rank : r.ranks) {
    std::size_t bytes = 0;
    in >> rank.exit_code >> rank.signal >> bytes;
    in.get();
    rank.message.resize(bytes);
    in.read(rank.message.data(), static_cast<std::streamsize>(bytes));
  }
  return r;
}

struct ShortShmRun {
  std::string skipped;  // why the namespace could not be made, "" if it ran
  test::RunResult result;
};

// run_ranks() inside a child with a `shm_bytes` tmpfs on /dev/shm. The
// child is its own process group: past the deadline the whole group (the
// child and its ranks) is killed.
ShortShmRun run_with_short_shm(std::size_t shm_bytes, int size, const std::function<void(Communicator&)>& fn,
                               const test::RunOptions& options) {
  char path[] = "/tmp/braid-short-shm-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::fflush(nullptr);
  pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    std::string why = enter_short_shm(shm_bytes);
    if (!why.empty()) {
      std::ofstream(path) << "skip " << why;
      _exit(0);
    }
    write_result(path, test::run_ranks(size, fn, options));
    _exit(0);
  }
  setpgid(child, child);
  auto deadline = std::chrono::steady_clock::now() + options.deadline + std::chrono::seconds(30);
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-child, SIGKILL);
      waitpid(child, nullptr, 0);
      unlink(path);
      FAIL("the namespace child did not end by its deadline");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::ifstream in(path, std::ios::binary);
  std::string word;
  in >> word;
  ShortShmRun run;
  if (word == "skip") std::getline(in >> std::ws, run.skipped);
  else if (word == "ran") run.result = read_result(in);
  unlink(path);
  INFO("namespace child exit status " << status << ", result file began with '" << word << "'");
  REQUIRE((word == "skip" || word == "ran"));
  return run;
}

// Why a child cannot have a mount namespace with its own /dev/shm, "" if it can.
std::string mount_namespace_refused() {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  std::fflush(nullptr);
  pid_t child = fork();
  if (child == 0) {
    std::string why = enter_short_shm(64 * KiB);
    ssize_t ignored = write(pipe_fds[1], why.data(), why.size());
    (void)ignored;
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string why;
  char buffer[256];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) why.append(buffer, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  waitpid(child, nullptr, 0);
  return why;
}

// What a rank's message must say when /dev/shm is short: the bytes its
// segment needs, what is free, and the remedies.
void check_names_bytes_and_remedy(const std::string& message, std::size_t needed) {
  CHECK(contains(message, " needs " + std::to_string(needed) + " bytes of shared memory"));
  CHECK(contains(message, "bytes free of"));
  CHECK(contains(message, "BRAID_SHM_RING_BYTES"));
  CHECK(contains(message, "BRAID_TRANSPORT=tcp"));
}

// Reached only if set-up succeeded: moves enough to touch every ring page.
void touch_rings(Communicator& comm) {
  std::vector<float> data(1u << 20, 1.0f);
  comm.all_reduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum).wait();
}

}  // namespace

TEST_CASE("a /dev/shm too small for the rings fails set-up on every rank, naming the bytes and the remedy",
          "[abuse][resources]") {
  // Three ranks need a segment of two 4 MiB rings each; /dev/shm has 1 MiB.
  constexpr int kRanks = 3;
  test::RunOptions options = options_with(kTimeout, seconds(60), "shm");
  options.config.shm_ring_bytes = 4 * MiB;
  auto run = run_with_short_shm(1 * MiB, kRanks, touch_rings, options);
  if (!run.skipped.empty()) {
    WARN("skipped: " << run.skipped);
    return;
  }
  const auto& result = run.result;
  INFO(result.summary());
  REQUIRE(!result.timed_out);
  CHECK(result.elapsed < kWellWithinTimeout);
  CHECK(result.leftover_shm == 0);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(result.ranks[r].signal == 0);  // never SIGBUS
    CHECK(result.ranks[r].exit_code == 1);
    const std::string own = "'s shared-memory segment (a ring of 4194304 bytes for each of its 2 local peer(s)";
    CHECK(contains(result.ranks[r].message, "rank " + std::to_string(r) + own));
    check_names_bytes_and_remedy(result.ranks[r].message,
                                 shm::segment_bytes(kRanks - 1, 4 * MiB, shm::slot_area_bytes(kRanks)));
  }
}

TEST_CASE("a rank whose /dev/shm is short fails its local peers at once with its reason", "[abuse][resources]") {
  // Rank 1 alone sees a 1 MiB /dev/shm (a mount namespace of its own); rank
  // 0 has the machine's. Rank 1 cannot reserve its segment; rank 0 could,
  // and must fail too, with rank 1's reason, rather than wait for it.
  const std::string why = mount_namespace_refused();
  if (!why.empty()) {
    WARN("skipped: " << why);
    return;
  }
  test::RunOptions options = options_with(kTimeout, seconds(60), "shm");
  options.config.shm_ring_bytes = 4 * MiB;
  // One host, as BRAID_HOST_ID says: a /dev/shm of its own would make rank
  // 1 another host (runtime::local_host_id).
  options.config.host_id = "one-host";
  options.enter_rank = [](int rank) {
    if (rank == 1) expect(enter_short_shm(1 * MiB).empty(), "rank 1 could not mount its small /dev/shm");
    return std::string("127.0.0.1");
  };
  auto result = test::run_ranks(2, touch_rings, options);
  INFO(result.summary());
  REQUIRE(!result.timed_out);
  CHECK(result.elapsed < kWellWithinTimeout);
  CHECK(result.leftover_shm == 0);               // rank 0 removed its segment
  for (const auto& rank : result.ranks) {
    CHECK(rank.signal == 0);
    CHECK(rank.exit_code == 1);
    check_names_bytes_and_remedy(rank.message, shm::segment_bytes(1, 4 * MiB, shm::slot_area_bytes(2)));
  }
  CHECK(contains(result.ranks[1].message, "rank 1's shared-memory segment"));
  CHECK(contains(result.ranks[0].message, "rank 0 cannot set up shared memory with its local peers because rank 1 "
                                          "failed: rank 1's shared-memory segment"));
}

TEST_CASE("ring sizes shrink so that a host's rings stay within BRAID_SHM_HOST_BYTES", "[abuse][resources]") {
  const std::size_t budget = runtime::Config{}.shm_host_bytes, ring = runtime::Config{}.shm_ring_bytes;
  CHECK(budget == 1 * GiB);
  CHECK(shm::ring_capacity(2, ring, budget) == 4 * MiB);
  CHECK(shm::ring_capacity(8, ring, budget) == 4 * MiB);
  CHECK(shm::ring_capacity(16, ring, budget) == 4 * MiB);  // 240 rings of 4 MiB: 960 MiB
  CHECK(shm::ring_capacity(17, ring, budget) == 2 * MiB);
  // 64 local ranks: 4032 rings, 16 GiB at 4 MiB; 256 KiB each keeps them under 1 GiB.
  CHECK(shm::ring_capacity(64, ring, budget) == 256 * KiB);
  CHECK(64 * 63 * shm::ring_capacity(64, ring, budget) <= budget);
  CHECK(shm::ring_capacity(2, 3 * MiB, budget) == 4 * MiB);  // rounded up to a power of two
  CHECK(shm::ring_capacity(1000, ring, budget) == shm::kMinRingBytes);
  std::size_t previous = ring;
  for (std::size_t local = 2; local <= 256; ++local) {
    std::size_t capacity = shm::ring_capacity(local, ring, budget);
    INFO(local << " local ranks: rings of " << capacity << " bytes");
    CHECK((local * (local - 1) * capacity <= budget || capacity == shm::kMinRingBytes));
    CHECK(capacity <= previous);
    previous = capacity;
  }
}

TEST_CASE("8 local ranks with a small host budget run on rings that fit it", "[abuse][resources]") {
  // 56 rings of the configured 4 MiB would need 224 MiB; the 8 MiB budget
  // leaves 128 KiB each, and /dev/shm holds only the budget, each segment's
  // shared slots and 64 KiB more per rank (13.5 MiB).
  constexpr int kRanks = 8;
  test::RunOptions options = options_with(seconds(30), seconds(90), "shm");
  options.config.shm_ring_bytes = 4 * MiB;
  options.config.shm_host_bytes = 8 * MiB;
  const std::size_t capacity = shm::ring_capacity(kRanks, 4 * MiB, 8 * MiB);
  REQUIRE(capacity == 128 * KiB);
  auto run = run_with_short_shm(8 * MiB + kRanks * (shm::slot_area_bytes(kRanks) + 64 * KiB), kRanks, [&](Communicator& comm) {
    struct statvfs fs {};
    expect(statvfs("/dev/shm", &fs) == 0, "statvfs(/dev/shm) failed");
    const std::size_t used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize;
    const std::size_t rings = kRanks * (kRanks - 1) * capacity;
    // The budget governs the rings; each segment adds its header and shared slots.
    expect(used >= rings && used <= 8 * MiB + kRanks * (shm::slot_area_bytes(kRanks) + 64 * KiB),
           "/dev/shm holds " + std::to_string(used) + " bytes; the rings take " + std::to_string(rings));
    // More than a ring per message, so that it wraps and stages; exact in int32.
    std::vector<std::int32_t> data(300'000);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::int32_t>(i % 1000) + comm.rank();
    comm.all_reduce(data.data(), data.data(), data.size(), DataType::i32, ReduceOp::sum).wait();
    for (std::size_t i = 0; i < data.size(); ++i)
      expect(data[i] == static_cast<std::int32_t>(kRanks * (i % 1000) + kRanks * (kRanks - 1) / 2),
             "wrong sum at " + std::to_string(i));
  }, options);
  if (!run.skipped.empty()) {
    WARN("skipped: " << run.skipped);
    return;
  }
  INFO(run.result.summary());
  CHECK(run.result.all_ok());
}

TEST_CASE("communicators created past RLIMIT_NOFILE fail with a named error on every rank", "[abuse][resources]") {
  const std::string transport = GENERATE("shm", "tcp");
  test::RunOptions options = options_with(kTimeout, seconds(90), transport);
  options.config.shm_ring_bytes = 64 * KiB;
  auto result = test::run_ranks(2, [](Communicator& comm) {
    tagged([&] {
      if (comm.rank() == 0) {  // a few dozen descriptors more than it has open now
        long open_now = std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {});
        rlimit limit{};
        getrlimit(RLIMIT_NOFILE, &limit);
        limit.rlim_cur = static_cast<rlim_t>(open_now + 32);
        expect(setrlimit(RLIMIT_NOFILE, &limit) == 0, "setrlimit failed");
      }
      std::vector<std::unique_ptr<Communicator>> made;
      try {
        for (int i = 0; i < 200; ++i) made.push_back(comm.split(0, comm.rank()));
      } catch (const Error&) {
        // Nothing lost: the world and the communicators made before still work.
        expect(!made.empty(), "not even one communicator could be created");
        std::int32_t one = 1, sum = 0;
        comm.all_reduce(&one, &sum, 1, DataType::i32, ReduceOp::sum).wait();
        made.back()->all_reduce(&one, &sum, 1, DataType::i32, ReduceOp::sum).wait();
        expect(sum == 2, "all_reduce after the failure gave " + std::to_string(sum));
        throw;
      }
      throw std::runtime_error("200 communicators were created; the limit was never reached");
    });
  }, options);
  INFO(transport << "\n" << result.summary());
  REQUIRE(!result.timed_out);
  const Outcome limited = outcome_of(result.ranks[0]), peer = outcome_of(result.ranks[1]);
  CHECK(limited.type == "SystemError");
  CHECK(contains(limited.text, "rank 0 cannot create another communicator"));
  CHECK(contains(limited.text, "RLIMIT_NOFILE"));
  CHECK(contains(limited.text, "ulimit -n"));
  CHECK(peer.type == "RemoteError");
  CHECK(contains(peer.text, "because rank 0 could not"));
  CHECK(contains(peer.text, "RLIMIT_NOFILE"));
  CHECK(peer.ms < kWellWithinTimeout.count());
  for (const auto& rank : result.ranks) CHECK(rank.signal == 0);
}

namespace {

// The process's virtual memory size now, from /proc/self/status.
std::size_t vm_size_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  return 0;
}

// An address-space limit just above what the process maps now: no room
// for another thread's stack (root ignores RLIMIT_NPROC, not RLIMIT_AS).
void leave_no_room_for_threads() {
  rlimit limit{vm_size_bytes() + (1u << 20), RLIM_INFINITY};
  expect(setrlimit(RLIMIT_AS, &limit) == 0, "setrlimit(RLIMIT_AS) failed");
}

}  // namespace

TEST_CASE("abuse: a rank that cannot start its progress thread fails with a named error, and its peers too",
          "[resources][abuse]") {
  // Rank 0 leaves no room for a thread; its first call too large to run
  // inline needs the progress thread.
  const std::string transport = GENERATE("shm", "tcp");
  INFO(transport);
  auto options = options_with(seconds(20), seconds(60), transport);
  auto result = test::run_ranks(
      2,
      [&](Communicator& comm) {
        const std::size_t count = (1u << 20) / sizeof(float);  // above BRAID_INLINE_BYTES
        std::vector<float> data(count, 1.0f);
        comm.barrier().wait();
        if (comm.rank() == 0) leave_no_room_for_threads();
        tagged([&] { comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait(); });
        throw std::runtime_error("the all_reduce completed although rank 0 could not start a thread");
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  Outcome first = outcome_of(result.ranks[0]), peer = outcome_of(result.ranks[1]);
  CHECK(first.type == "SystemError");
  CHECK(contains(first.text, "cannot start the communicator's progress thread"));
  CHECK(peer.type == "RemoteError");
  CHECK(contains(peer.text, "cannot start the communicator's progress thread"));
  CHECK(peer.ms < 10000);
}

// The same failure while another thread's small call runs inline and
// waits for its peer: the abort waits for that call, which completes with
// the right sum, instead of closing the transports under it.
TEST_CASE("abuse: a progress thread that cannot start leaves a small call running in another thread to finish",
          "[resources][abuse]") {
  const std::string transport = GENERATE("shm", "tcp");
  INFO(transport);
  auto options = options_with(seconds(20), seconds(60), transport);
  auto result = test::run_ranks(
      2,
      [&](Communicator& comm) {
        const std::size_t count = (1u << 20) / sizeof(float);  // above BRAID_INLINE_BYTES
        std::vector<float> data(count, 1.0f);
        std::int64_t small = comm.rank() + 1;
        comm.barrier().wait();
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(500));  // rank 0's small call waits for this one
          comm.all_reduce(&small, &small, 1, DataType::i64, ReduceOp::sum).wait();
          expect(small == 3, "the small sum is " + std::to_string(small) + ", not 3");
          tagged([&] { comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait(); });
          throw std::runtime_error("the large all_reduce completed although rank 0 could not start a thread");
        }
        std::string small_error;
        std::thread waiter([&] {  // started before the limit: its stack is mapped
          try {
            comm.all_reduce(&small, &small, 1, DataType::i64, ReduceOp::sum).wait();
          } catch (const std::exception& e) {
            small_error = e.what();
          }
        });
        std::this_thread::sleep_for(milliseconds(200));  // the small call waits for rank 1
        leave_no_room_for_threads();
        std::string large_error;
        try {
          comm.all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait();
        } catch (const std::exception& e) {
          large_error = e.what();
        }
        waiter.join();
        expect(small_error.empty(), "the small all_reduce failed: " + small_error);
        expect(small == 3, "the small sum is " + std::to_string(small) + ", not 3");
        expect(contains(large_error, "cannot start the communicator's progress thread"),
               "the large all_reduce: " + (large_error.empty() ? std::string("completed") : large_error));
      },
      options);
  INFO(result.summary());
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.ranks[0].ok());
  const Outcome peer = outcome_of(result.ranks[1]);
  CHECK(peer.type == "RemoteError");
  CHECK(contains(peer.text, "cannot start the communicator's progress thread"));
  CHECK(peer.ms < 10000);
}

TEST_CASE("abuse: a peer's reference to registered memory is checked against what it registered",
          "[resources][abuse]") {
  // The peer is this process (a pidfd on itself), so the check is the only
  // thing between a forged reference and a wild read or write.
  const int self = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  REQUIRE(self >= 0);
  auto* base = static_cast<std::byte*>(shm::regions::allocate(1u << 20));
  for (std::size_t i = 0; i < (1u << 20); ++i) base[i] = static_cast<std::byte>(i % 251);
  RegionRef ref;
  REQUIRE(shm::regions::find(base + 100, 1000, ref));
  CHECK_FALSE(shm::regions::find(base + 100, 4u << 20, ref = {}));  // runs past the allocation
  REQUIRE(shm::regions::find(base + 100, 1000, ref));
  {
    shm::regions::PeerRegions peer;
    auto span = peer.map(self, 1, ref);
    REQUIRE(span.size() == 1000);
    CHECK(std::memcmp(span.data(), base + 100, 1000) == 0);
    auto refused = [&](RegionRef bad, const std::string& words) {
      try {
        peer.map(self, 1, bad);
        FAIL("a forged reference was mapped");
      } catch (const RemoteError& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
        CHECK(std::string(e.what()).find(words) != std::string::npos);
      }
    };
    RegionRef past = ref;
    past.offset = 3u << 20;  // the memfd holds 2 MiB
    refused(past, "checked against what it registered");
    RegionRef huge = ref;
    huge.bytes = ~std::uint64_t{0} - 50;
    refused(huge, "checked against what it registered");
    RegionRef other = ref;
    other.key[1] ^= 1;  // another inode: not the allocation it names
    refused(other, "does not hold");
    RegionRef not_memory = ref;
    not_memory.key[0] = static_cast<std::uint64_t>(self);  // an open fd, but no registered memory
    refused(not_memory, "does not hold");
  }
  shm::regions::release(base);
  close(self);
}

// A rank killed between creating its segment and removing it, with no
// launcher to clean up, left the segment in /dev/shm: every later run of
// the job on the same store address (the same derived token and run id,
// so the same names) failed at once with "File exists", until someone
// removed it by hand (a review helper's find). Set-up now removes a
// segment of its name whose owner is a process that no longer exists, and
// leaves one whose owner runs, or whose header is not written.
TEST_CASE("shm: a segment whose owner is gone is removed; one whose owner runs is left", "[shm]") {
  const std::string name = "/braid-stale-test-" + std::to_string(getpid());
  const pid_t gone = fork();  // a pid that no longer exists: a child's, reaped
  if (gone == 0) _exit(0);
  REQUIRE(waitpid(gone, nullptr, 0) == gone);
  struct stat ns {};
  REQUIRE(::stat("/proc/self/ns/pid", &ns) == 0);
  auto make = [&](std::uint64_t magic, pid_t owner) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 1 << 16) == 0);
    auto* header = static_cast<shm::SegmentHeader*>(
        mmap(nullptr, sizeof(shm::SegmentHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    REQUIRE(header != MAP_FAILED);
    header->magic = magic;
    header->owner_rank = 1;
    header->owner_pid = owner;
    header->owner_pid_ns = static_cast<std::uint64_t>(ns.st_ino);
    munmap(header, sizeof(shm::SegmentHeader));
    close(fd);
  };
  auto exists = [&] { return std::filesystem::exists("/dev/shm" + name); };
  make(shm::kSegmentMagic, gone);
  shm::remove_stale_segment(name);
  CHECK_FALSE(exists());
  shm_unlink(name.c_str());
  make(shm::kSegmentMagic, getpid());  // its owner runs: another job given this token
  shm::remove_stale_segment(name);
  CHECK(exists());
  shm_unlink(name.c_str());
  make(0, gone);  // not yet written: nothing says whose it is
  shm::remove_stale_segment(name);
  CHECK(exists());
  shm_unlink(name.c_str());
}
