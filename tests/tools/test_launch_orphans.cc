// braid-launch killed with SIGKILL (the OOM killer, `kill -9`, a CI
// timeout) must not leave its ranks' descendants running: the ranks die of
// PR_SET_PDEATHSIG, and what they started is stopped by the launcher's
// guardian (tools/launcher/guardian.h). The end-to-end cases belong to the
// fault-and-abuse suite (tag [abuse]); their ranks are shell scripts whose
// background `sleep` is the worker that would otherwise run on, reparented
// to init.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch_harness.h"
#include "tools/launcher/guardian.h"

using namespace braid::test;

namespace {

// Records the rank's pid, starts a worker in the background, records the
// worker's pid in $0/child_<rank> (whole, through a rename) and waits.
std::string rank_with_worker(const std::string& worker_setup) {
  return "echo $$ > \"$0/pid_$BRAID_RANK\"; " + worker_setup +
         "sleep 1000 & echo $! > \"$0/child_$BRAID_RANK.tmp\"; "
         "mv \"$0/child_$BRAID_RANK.tmp\" \"$0/child_$BRAID_RANK\"; wait";
}

// Only processes started by braid-launch carry a job token; a pid reused by
// something else since the rank recorded it is left alone.
bool carries_job_token(pid_t pid) {
  std::ifstream environ_file("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(environ_file)), std::istreambuf_iterator<char>());
  return text.find("BRAID_JOB_TOKEN=") != std::string::npos;
}

// The workers the ranks recorded, by rank. On destruction it SIGKILLs those
// still alive, so that a failing test (the launcher left them running) does
// not leave them behind; JobDir does the same for the ranks' pid_* files.
class Workers {
 public:
  explicit Workers(const JobDir& dir) : dir_(dir) {}
  ~Workers() {
    for (const auto& [rank, pid] : pids_)
      if (process_exists(pid) && carries_job_token(pid)) ::kill(pid, SIGKILL);
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  void wait_for(int ranks) {
    for (int rank = 0; rank < ranks; ++rank) {
      auto path = dir_.path() / ("child_" + std::to_string(rank));
      wait_for_file(path);
      pids_[rank] = static_cast<pid_t>(std::stol(read_file(path)));
    }
  }
  // Waits up to the limit for every worker to be gone; returns those left.
  std::map<int, pid_t> still_running(std::chrono::milliseconds limit) const {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      std::map<int, pid_t> running;
      for (const auto& [rank, pid] : pids_)
        if (process_exists(pid)) running[rank] = pid;
      if (running.empty() || std::chrono::steady_clock::now() >= deadline) return running;
      std::this_thread::sleep_for(20ms);
    }
  }

 private:
  const JobDir& dir_;
  std::map<int, pid_t> pids_;
};

// The fields of /proc/<pid>/stat that tell a guardian apart.
struct ProcStat {
  std::string comm;
  pid_t ppid = 0;
  pid_t pgrp = 0;
};

std::optional<ProcStat> proc_stat(pid_t pid) {
  std::string text = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto open_paren = text.find('(');
  auto close_paren = text.rfind(')');
  if (open_paren == std::string::npos || close_paren == std::string::npos) return std::nullopt;
  ProcStat stat;
  stat.comm = text.substr(open_paren + 1, close_paren - open_paren - 1);
  std::istringstream rest(text.substr(close_paren + 2));
  char state = 0;
  rest >> state >> stat.ppid >> stat.pgrp;
  return stat;
}

// The launcher's guardian: its child named braid-guardian.
// Looks for up to 5 s: the guardian takes its name after the fork, and the
// launcher does not wait for that (under load a single look missed it).
std::optional<pid_t> find_guardian(pid_t launcher) {
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  do {
    std::unique_ptr<DIR, int (*)(DIR*)> proc(opendir("/proc"), closedir);
    if (!proc) return std::nullopt;
    while (dirent* entry = readdir(proc.get())) {
      char* end = nullptr;
      long pid = std::strtol(entry->d_name, &end, 10);
      if (*end != '\0' || pid <= 0) continue;
      auto stat = proc_stat(static_cast<pid_t>(pid));
      if (stat && stat->ppid == launcher && stat->comm == "braid-guardian") return static_cast<pid_t>(pid);
    }
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < give_up);
  return std::nullopt;
}

// Waits up to the limit for the process to be gone (a zombie counts).
bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (process_exists(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// Waits up to the limit for the launcher's stderr (which the guardian
// shares) to contain the text.
bool eventually_contains(const LaunchedJob& job, const std::string& text, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (job.err().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::unique_ptr<LaunchedJob> launch(const JobDir& dir, bool own_session, const std::string& script,
                                    const std::vector<std::string>& options = {}) {
  const char* launcher = std::getenv("BRAID_LAUNCH");
  REQUIRE(launcher);
  std::vector<std::string> argv{launcher};
  // setsid(1) execs braid-launch without a fork (the test's child leads no
  // group), so the job's pid is still the launcher's, now leading a group.
  if (own_session) argv.insert(argv.begin(), "/usr/bin/setsid");
  argv.insert(argv.end(), {"-n", "2"});
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "/bin/sh", "-c", script, dir.str()});
  return LaunchedJob::program(dir, "launcher", argv);
}

// Reaps a child of the test within the limit and returns its wait status;
// past the limit, kills and reaps it and returns nothing.
std::optional<int> wait_child(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(10ms);
  }
  return status;
}

}  // namespace

TEST_CASE("launch abuse: a launcher killed with SIGKILL leaves none of its ranks' descendants running",
          "[abuse][launch]") {
  JobDir dir;
  Workers workers(dir);
  std::string worker_setup;
  bool whole_group = false;
  // Where init does not reap orphans (a container's may not), a rank left
  // a zombie keeps its group from emptying, and the note then also reports
  // a SIGKILL after the grace period: only the first part is certain.
  std::string expected_note = "its guardian sent SIGTERM to 2 process group(s)";
  SECTION("workers that end on SIGTERM") {}
  SECTION("workers that ignore SIGTERM get SIGKILL after the grace period") {
    // An ignored signal stays ignored across fork and exec: `sleep` inherits it.
    worker_setup = "trap '' TERM; ";
    expected_note = "its guardian sent SIGTERM to 2 process group(s), then SIGKILL to the 2 still not empty after 1000 ms";
  }
  SECTION("SIGKILL to the launcher's whole process group, as a CI runner sends it") {
    whole_group = true;
  }
  auto job = launch(dir, whole_group, rank_with_worker(worker_setup), {"--grace-period", "1"});
  workers.wait_for(2);
  std::optional<pid_t> guardian = find_guardian(job->pid());
  CHECK(guardian);
  REQUIRE(::kill(whole_group ? -job->pid() : job->pid(), SIGKILL) == 0);
  CHECK(job->wait() == 128 + SIGKILL);
  for (const auto& [rank, pid] : workers.still_running(10s))
    FAIL_CHECK("the worker of rank " << rank << " (pid " << pid << ") still runs");
  CHECK(eventually_contains(*job, expected_note, 10s));
  if (guardian) CHECK(gone_within(*guardian, 10s));
  for (const auto& [rank, pid] : dir.recorded_pids()) {
    INFO("rank " << rank << " pid " << pid);
    CHECK_FALSE(process_exists(pid));
  }
}

TEST_CASE("launch abuse: the guardian stays out of the job's process group and exits with the launcher",
          "[abuse][launch]") {
  JobDir dir;
  auto job = launch(dir, false,
                    "echo > \"$0/ready_$BRAID_RANK\"; while [ ! -e \"$0/go\" ]; do sleep 0.02; done");
  for (int rank = 0; rank < 2; ++rank) wait_for_file(dir.path() / ("ready_" + std::to_string(rank)));
  std::optional<pid_t> guardian = find_guardian(job->pid());
  REQUIRE(guardian);
  auto stat = proc_stat(*guardian);
  REQUIRE(stat);
  // Its own group: a Ctrl-C or a CI runner's signal to the job's group
  // does not reach it.
  CHECK(stat->pgrp == *guardian);
  std::ofstream(dir.path() / "go").close();
  CHECK(job->wait() == 0);
  // Reaped by the launcher, not left to init: not even a zombie remains.
  CHECK_FALSE(std::filesystem::exists("/proc/" + std::to_string(*guardian)));
  CHECK(job->err().find("guardian") == std::string::npos);
}

namespace {

// A child sleeping 60 s in a process group of its own (the id returned);
// -1 when fork failed.
pid_t sleeping_group() {
  const pid_t group = fork();
  if (group == 0) {
    setpgid(0, 0);
    execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  if (group > 0) setpgid(group, group);
  return group;
}

}  // namespace

TEST_CASE("Guardian: stops the groups left to it and no others", "[launcher]") {
  const pid_t group = sleeping_group();
  REQUIRE(group > 0);
  SECTION("a goodbye leaves the groups alone, and the guardian is reaped") {
    pid_t guardian_pid = -1;
    {
      braid::launcher::Guardian guardian(4, 1000ms);
      guardian_pid = guardian.pid();
      guardian.watch(group);
      guardian.forget(group);
    }
    CHECK(waitpid(guardian_pid, nullptr, WNOHANG) < 0);  // no longer our child
    CHECK(process_exists(group));
    ::kill(group, SIGKILL);
    waitpid(group, nullptr, 0);
  }
  SECTION("a group still watched when the launcher's side goes gets SIGTERM") {
    pid_t guardian_pid = -1;
    {
      braid::launcher::Guardian guardian(4, 100ms);
      guardian_pid = guardian.pid();
      guardian.watch(group);
    }
    std::optional<int> status = wait_child(group, 10s);
    REQUIRE(status);
    CHECK(WIFSIGNALED(*status));
    CHECK(WTERMSIG(*status) == SIGTERM);
    // The guardian ends on its own, our child until reaped.
    CHECK(wait_child(guardian_pid, 10s));
  }
}

// A launcher killed while its ranks set up shared memory left their
// segments in /dev/shm (about 12 MiB a rank), since only the launcher
// removed what dead ranks left: the guardian now removes the names of the
// attempt it was told, once it has stopped the groups, and no others.
TEST_CASE("Guardian: removes the job's shared-memory names once it has stopped the groups", "[launcher]") {
  const pid_t group = sleeping_group();
  REQUIRE(group > 0);
  const std::string tag = std::to_string(::getpid());
  const std::string ours = "braid-guardian-test-" + tag + "-", theirs = "braid-guardian-other-" + tag + "-";
  std::vector<std::filesystem::path> made;
  for (const std::string& prefix : {ours, theirs})
    for (int i = 0; i < 40; ++i) {  // more than one getdents64 listing holds
      made.push_back(std::filesystem::path("/dev/shm") / (prefix + std::to_string(i)));
      std::ofstream(made.back()) << "x";
    }
  struct Remove {
    std::vector<std::filesystem::path>& made;
    ~Remove() {
      std::error_code ignored;
      for (const auto& path : made) std::filesystem::remove(path, ignored);
    }
  } remove{made};
  pid_t guardian_pid = -1;
  {
    braid::launcher::Guardian guardian(4, 100ms);
    guardian_pid = guardian.pid();
    guardian.watch(group);
    guardian.watch_segments(ours);
  }  // the launcher's side goes without a goodbye
  CHECK(wait_child(group, 10s));
  CHECK(wait_child(guardian_pid, 10s));
  int left_ours = 0, left_theirs = 0;
  for (const auto& path : made)
    if (std::filesystem::exists(path)) ++(path.filename().string().rfind(ours, 0) == 0 ? left_ours : left_theirs);
  CHECK(left_ours == 0);
  CHECK(left_theirs == 40);
}
