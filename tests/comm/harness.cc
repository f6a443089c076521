#include "tests/comm/harness.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/shm_names.h"
#include "runtime/store.h"

namespace braid::test {
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("braid-test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

[[noreturn]] void rank_main(int rank, int size, std::uint16_t port, const std::string& token,
                            const RunOptions& options, const fs::path& result_file,
                            const std::function<void(comm::Communicator&)>& fn) {
  int code = 0;
  std::string message;
  try {
    runtime::RankInfo info;
    info.rank = rank;
    info.world_size = size;
    info.local_rank = rank;
    info.local_world_size = size;
    info.store_host = options.store_host;
    info.store_port = port;
    info.store_served_by_rank0 = options.store_by_rank0;
    info.job_token = token;
    info.launcher = "test";
    runtime::Config config = options.config;
    if (options.host_of) config.host_id = options.host_of(rank);
    if (options.enter_rank) config.bind_addr = options.enter_rank(rank);
    if (options.configure) options.configure(rank, config);
    auto comm = comm::Communicator::create_world(info, config);
    if (options.own_world) options.own_world(std::move(comm), info, config);
    else fn(*comm);
  } catch (const std::exception& e) {
    code = 1;
    message = e.what();
  }
  std::ofstream(result_file) << message;
  std::fflush(nullptr);
  _exit(code);
}

}  // namespace

runtime::Config test_config(std::chrono::milliseconds timeout) {
  runtime::Config config;
  config.timeout = timeout;
  config.segment_bytes = 4096;
  config.chunk_bytes = 16u << 10;  // several all-reduce rounds from a few thousand elements on
  config.stream_bytes = 4096;       // out-of-place all-reduces from 4 KiB stage and stream their output
  config.log_level = "off";
  return config;
}

bool RunResult::all_ok() const {
  if (timed_out) return false;
  for (const auto& r : ranks)
    if (!r.ok()) return false;
  return true;
}

std::string RunResult::summary() const {
  std::ostringstream out;
  if (timed_out) out << "DEADLINE PASSED: ranks were killed\n";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    out << "rank " << i << ": exit " << ranks[i].exit_code << " signal " << ranks[i].signal << " "
        << ranks[i].message << "\n";
  return out.str();
}

RunResult run_ranks(int size, const std::function<void(comm::Communicator&)>& fn, RunOptions options) {
  TempDir dir;
  std::string token = "test-token-" + std::to_string(getpid());
  std::optional<runtime::StoreServer> server;
  {
    // A socket belongs to the namespace it was created in, so the server can
    // serve another namespace while this thread returns to its own.
    int home = options.store_netns >= 0 ? open("/proc/self/ns/net", O_RDONLY) : -1;
    if (home >= 0) setns(options.store_netns, CLONE_NEWNET);
    server.emplace(options.store_host, 0, token);
    if (home >= 0) {
      setns(home, CLONE_NEWNET);
      close(home);
    }
  }
  std::uint16_t port = server->port();
  if (options.store_by_rank0) server.reset();  // its port, free again, starts the job's sequence
  std::vector<pid_t> pids;
  auto start = std::chrono::steady_clock::now();
  std::fflush(nullptr);  // or every child flushes the parent's buffered output again
  for (int rank = 0; rank < size; ++rank) {
    pid_t pid = fork();
    if (pid == 0)
      rank_main(rank, size, port, token, options, dir.path / ("rank" + std::to_string(rank)), fn);
    pids.push_back(pid);
  }
  RunResult result;
  result.ranks.resize(static_cast<std::size_t>(size));
  auto deadline = start + options.deadline;
  std::size_t running = pids.size();
  while (running > 0) {
    bool reaped = false;
    for (int rank = 0; rank < size; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      auto& r = result.ranks[rank];
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[rank] = 0;
      --running;
      reaped = true;
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      for (pid_t pid : pids)
        if (pid > 0) kill(pid, SIGKILL);
      for (pid_t pid : pids)
        if (pid > 0) waitpid(pid, nullptr, 0);
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  result.leftover_shm = runtime::remove_job_segments(token);
  for (int rank = 0; rank < size; ++rank) {
    std::ifstream in(dir.path / ("rank" + std::to_string(rank)));
    std::stringstream text;
    text << in.rdbuf();
    result.ranks[rank].message = text.str();
  }
  return result;
}

}  // namespace braid::test
