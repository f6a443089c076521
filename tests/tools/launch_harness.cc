#include "launch_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace braid::test {
namespace {

std::string launcher_path() {
  const char* path = std::getenv("BRAID_LAUNCH");
  if (!path || !*path) FAIL("BRAID_LAUNCH is not set; run this test through `meson test`");
  return path;
}

std::vector<std::string> launcher_environment(const EnvChanges& changes) {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; *entry; ++entry) {
    std::string text(*entry);
    auto eq = text.find('=');
    if (eq != std::string::npos) vars[text.substr(0, eq)] = text.substr(eq + 1);
  }
  for (const auto& [name, value] : changes) {
    if (value)
      vars[name] = *value;
    else
      vars.erase(name);
  }
  std::vector<std::string> flat;
  for (const auto& [name, value] : vars) flat.push_back(name + "=" + value);
  return flat;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Only processes started by braid-launch carry a job token; a pid reused by
// something else since the rank recorded it is left alone.
bool is_braid_rank(pid_t pid) {
  std::ifstream environ_file("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(environ_file)), std::istreambuf_iterator<char>());
  return text.find("BRAID_JOB_TOKEN=") != std::string::npos;
}

int shell_status(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

JobDir::JobDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "braid-launch-test-XXXXXX").string();
  if (!mkdtemp(pattern.data())) FAIL("mkdtemp failed: " << std::strerror(errno));
  path_ = pattern;
}

JobDir::~JobDir() {
  for (const auto& [rank, pid] : recorded_pids())
    if (process_exists(pid) && is_braid_rank(pid)) ::kill(pid, SIGKILL);
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::map<int, pid_t> JobDir::recorded_pids() const {
  std::map<int, pid_t> pids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(path_, error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("pid_", 0) != 0) continue;
    std::string text = read_file(entry.path());
    if (!text.empty()) pids[std::stoi(name.substr(4))] = static_cast<pid_t>(std::stol(text));
  }
  return pids;
}

// braid-bench's memcpy baseline page-faults 512 MiB and copies it four
// times before the first call: 1.4 s of each run on these 2-core machines,
// where the tests start braid-bench dozens of times. A job of braid-bench
// (BRAID_BENCH) runs without it (--memcpy_bytes 0) unless the test gives
// --memcpy_bytes itself, as the baseline's own tests do.
std::vector<std::string> without_memcpy_baseline(std::vector<std::string> argv) {
  const char* bench = std::getenv("BRAID_BENCH");
  if (!bench || std::find(argv.begin(), argv.end(), "--memcpy_bytes") != argv.end()) return argv;
  auto at = std::find(argv.begin(), argv.end(), bench);
  if (at != argv.end()) argv.insert(at + 1, {"--memcpy_bytes", "0"});
  return argv;
}

LaunchedJob::LaunchedJob(const JobDir& dir, const std::vector<std::string>& args,
                         const EnvChanges& env, const ChildSetup& setup)
    : LaunchedJob(dir.path() / "launcher.out", dir.path() / "launcher.err",
                  [&] {
                    std::vector<std::string> argv{launcher_path()};
                    argv.insert(argv.end(), args.begin(), args.end());
                    return without_memcpy_baseline(std::move(argv));
                  }(),
                  env, setup) {}

std::unique_ptr<LaunchedJob> LaunchedJob::program(const JobDir& dir, const std::string& name,
                                                  const std::vector<std::string>& argv, const EnvChanges& env) {
  return std::unique_ptr<LaunchedJob>(
      new LaunchedJob(dir.path() / (name + ".out"), dir.path() / (name + ".err"), argv, env, {}));
}

LaunchedJob::LaunchedJob(std::filesystem::path out_path, std::filesystem::path err_path,
                         std::vector<std::string> argv, const EnvChanges& env, const ChildSetup& setup)
    : out_path_(std::move(out_path)), err_path_(std::move(err_path)) {
  std::vector<std::string> envp = launcher_environment(env);
  std::vector<char*> argv_c = c_strings(argv);
  std::vector<char*> envp_c = c_strings(envp);
  int out_fd = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(out_fd >= 0);
  REQUIRE(err_fd >= 0);
  int in_fd = setup.stdin_fd >= 0 ? setup.stdin_fd : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(in_fd >= 0);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (setup.nofile && setrlimit(RLIMIT_NOFILE, &*setup.nofile) != 0) _exit(125);
    for (int signo : setup.ignored) ::signal(signo, SIG_IGN);
    execve(argv_c[0], argv_c.data(), envp_c.data());
    _exit(126);
  }
  ::close(out_fd);
  ::close(err_fd);
  if (setup.stdin_fd < 0) ::close(in_fd);
  REQUIRE(pid_ > 0);
}

LaunchedJob::~LaunchedJob() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

int LaunchedJob::wait(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
      FAIL(out_path_.stem() << " did not exit within " << limit.count() << " ms; stderr:\n" << err());
    }
    std::this_thread::sleep_for(10ms);
  }
  pid_ = -1;
  return shell_status(status);
}

std::string LaunchedJob::out() const { return read_file(out_path_); }
std::string LaunchedJob::err() const { return read_file(err_path_); }

LaunchResult run_launch(const JobDir& dir, const std::vector<std::string>& args,
                        const EnvChanges& env, const ChildSetup& setup) {
  LaunchedJob job(dir, args, env, setup);
  LaunchResult result;
  result.status = job.wait();
  result.out = job.out();
  result.err = job.err();
  return result;
}

std::vector<std::string> shell_job(int nproc, const std::string& script, const JobDir& dir,
                                   const std::vector<std::string>& extra) {
  std::vector<std::string> args{"-n", std::to_string(nproc)};
  args.insert(args.end(), extra.begin(), extra.end());
  for (std::string tail : {"--", "/bin/sh", "-c"}) args.push_back(tail);
  args.push_back(script);
  args.push_back(dir.str());
  return args;
}

void wait_for_file(const std::filesystem::path& path, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() >= deadline) FAIL("timed out waiting for " << path);
    std::this_thread::sleep_for(10ms);
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

std::map<std::string, std::string> parse_env(const std::string& text) {
  std::map<std::string, std::string> vars;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

bool process_exists(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  // A killed process whose new parent does not reap it (a container's
  // init may not) lingers as a zombie: it is dead all the same.
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos || stat.substr(close_paren + 2, 1) != "Z";
}

}  // namespace braid::test
