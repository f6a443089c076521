// Runs the real braid-launch binary (path in $BRAID_LAUNCH, set by meson)
// as a child of the test, always under a deadline, with shell scripts as
// its ranks.
//
// Rank scripts get the job directory as $0 (`sh -c SCRIPT DIR`) and leave
// their traces there: pid_<rank> files (so a test can check that no rank
// survives the launcher, and so the cleanup can find strays), markers and
// environment dumps.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace braid::test {

using namespace std::chrono_literals;

// A fresh directory under /tmp. On destruction it SIGKILLs any process
// still alive whose pid a rank recorded in a pid_* file (and that carries a
// braid job token, so a reused pid is left alone), then removes the tree.
class JobDir {
 public:
  JobDir();
  ~JobDir();
  JobDir(const JobDir&) = delete;
  JobDir& operator=(const JobDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // The pids recorded in pid_<rank> files, by rank.
  std::map<int, pid_t> recorded_pids() const;

 private:
  std::filesystem::path path_;
};

// Environment changes for the launcher: a value sets, nullopt unsets.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

// What the launcher's process gets before it execs: resource limits and
// its stdin.
struct ChildSetup {
  std::optional<rlimit> nofile;  // RLIMIT_NOFILE: {soft, hard}
  int stdin_fd = -1;             // -1: /dev/null, never the test's own stdin
  std::vector<int> ignored;      // signals set to SIG_IGN (a shell's background job, nohup)
};

// braid-launch running as a child of the test; stdout and stderr go to
// files in the job directory. The destructor kills and reaps it if the
// test did not wait for it.
class LaunchedJob {
 public:
  LaunchedJob(const JobDir& dir, const std::vector<std::string>& args, const EnvChanges& env = {},
              const ChildSetup& setup = {});
  // Any program (argv[0] a path) as a child of the test, its output in
  // <dir>/<name>.out and .err: a rank started by hand, as srun or mpirun
  // would start it.
  static std::unique_ptr<LaunchedJob> program(const JobDir& dir, const std::string& name,
                                              const std::vector<std::string>& argv, const EnvChanges& env = {});
  ~LaunchedJob();
  LaunchedJob(const LaunchedJob&) = delete;
  LaunchedJob& operator=(const LaunchedJob&) = delete;

  pid_t pid() const { return pid_; }
  // Waits for the launcher to exit and returns its status as a shell
  // reports it (exit code, or 128 + signal). Past the limit it kills the
  // launcher and fails the test.
  int wait(std::chrono::milliseconds limit = 20s);
  std::string out() const;
  std::string err() const;

 private:
  LaunchedJob(std::filesystem::path out_path, std::filesystem::path err_path, std::vector<std::string> argv,
              const EnvChanges& env, const ChildSetup& setup);

  std::filesystem::path out_path_;
  std::filesystem::path err_path_;
  pid_t pid_ = -1;
};

// The outcome of one launch run to completion.
struct LaunchResult {
  int status = -1;
  std::string out;
  std::string err;
};

LaunchResult run_launch(const JobDir& dir, const std::vector<std::string>& args,
                        const EnvChanges& env = {}, const ChildSetup& setup = {});

// braid-launch -n <nproc> [extra...] -- sh -c <script> <dir>
std::vector<std::string> shell_job(int nproc, const std::string& script, const JobDir& dir,
                                   const std::vector<std::string>& extra = {});

// Waits until the file exists; fails the test past the limit.
void wait_for_file(const std::filesystem::path& path, std::chrono::milliseconds limit = 20s);

std::string read_file(const std::filesystem::path& path);
std::vector<std::string> sorted_lines(const std::string& text);
// "NAME=value" lines (as `env` prints them) into a map.
std::map<std::string, std::string> parse_env(const std::string& text);
bool process_exists(pid_t pid);

}  // namespace braid::test
