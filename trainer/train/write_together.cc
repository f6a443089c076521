#include "trainer/train/write_together.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/errors.h"

namespace braid::trainer {

namespace {

using Clock = std::chrono::steady_clock;

// What each rank tells the others every tick.
enum : std::uint64_t { kWriting = 0, kEnded = 1, kFailed = 2 };
struct Report {
  std::uint64_t state = kWriting;
  std::uint64_t bytes = 0;    // on disk so far (WriteProgress)
  std::uint64_t stalled = 0;  // this rank's clock: nothing moved for the timeout
  // 0 until the rank's writing is published (WriteProgress::published),
  // then 1 + the files and directories it has removed since.
  std::uint64_t tidied = 0;
};
constexpr std::size_t kReportWords = 4;
static_assert(sizeof(Report) == kReportWords * sizeof(std::uint64_t));

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void write_together(comm::Communicator& comm, const std::string& what,
                    const std::function<void(WriteProgress&)>& write) {
  const std::chrono::milliseconds stall = comm.timeout();
  const std::chrono::milliseconds tick = std::clamp(stall / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(1000));

  WriteProgress progress;
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  std::exception_ptr error;
  std::thread writer([&] {
    std::exception_ptr e;
    try {
      write(progress);
    } catch (...) {
      e = std::current_exception();
    }
    {
      std::lock_guard lock(mu);
      ended = true;
      error = e;
    }
    cv.notify_all();
  });
  // However the wait ends, the writer gives up at its next chunk and is
  // joined (it reads buffers this thread's caller owns).
  struct Join {
    WriteProgress& progress;
    std::thread& writer;
    ~Join() {
      progress.cancel.store(true, std::memory_order_relaxed);
      writer.join();
    }
  } join{progress, writer};

  const int n = comm.size();
  std::vector<Report> all(static_cast<std::size_t>(n));
  std::vector<std::uint64_t> seen;  // every rank's state and bytes when they last moved
  Clock::time_point moved = Clock::now();
  for (;;) {
    Report mine;
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, tick, [&] { return ended; });
      if (ended) mine.state = error ? kFailed : kEnded;
    }
    mine.bytes = progress.bytes.load(std::memory_order_relaxed);
    if (progress.published.load(std::memory_order_relaxed))
      mine.tidied = 1 + progress.removed.load(std::memory_order_relaxed);
    mine.stalled = Clock::now() - moved >= stall;
    comm.all_gather(&mine, all.data(), kReportWords, DataType::i64).wait();

    // Every rank sees the same reports, so every rank decides alike.
    std::vector<int> failed, writing;
    std::vector<std::uint64_t> now;
    bool stalled = false;
    for (int r = 0; r < n; ++r) {
      const Report& report = all[static_cast<std::size_t>(r)];
      if (report.state == kFailed) failed.push_back(r);
      if (report.state == kWriting) writing.push_back(r);
      now.push_back(report.state);
      now.push_back(report.bytes);
      now.push_back(report.tidied);
      stalled = stalled || report.stalled != 0;
    }
    if (!failed.empty()) {
      if (mine.state == kFailed) std::rethrow_exception(error);
      throw SystemError(what + ": " + rank_list(failed) + " could not write " + (failed.size() == 1 ? "its" : "their") +
                        " part (" + (failed.size() == 1 ? "its" : "their") + " own error says why)" +
                        (failed.front() == 0 ? "" : "; nothing was published"));
    }
    if (writing.empty()) return;
    if (now != seen) {
      seen = std::move(now);
      moved = Clock::now();
    } else if (stalled) {
      // A rank past publishing was removing what its files replace: the
      // write stands, whatever is left of that stays for the next one.
      std::string who;
      bool published = false;
      for (int r : writing) {
        const Report& report = all[static_cast<std::size_t>(r)];
        who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (";
        if (report.tidied > 0) {
          published = true;
          who += "published it, then removed " + std::to_string(report.tidied - 1) +
                 " files and directories of what it replaces)";
        } else {
          who += std::to_string(report.bytes) + " bytes on disk)";
        }
      }
      throw TimeoutError(what + ": no progress for " + std::to_string(stall.count()) + " ms (BRAID_TIMEOUT) from " +
                         who + "; a disk that is stuck or far too slow; " +
                         (published ? "it was published, and what it replaces is left for the next save to remove"
                                    : "nothing was published"));
    }
  }
}

}  // namespace braid::trainer
