#include "comm/resources.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>

#include "runtime/errors.h"

namespace braid::comm {
namespace {

constexpr const char* kFewerCommunicators = "destroy communicators the program no longer uses";

long fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return LONG_MAX;
  return static_cast<long>(limit.rlim_cur);
}

// Descriptors the process has open now. When not even the listing can be
// opened, every one is in use.
long fds_in_use() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return errno == EMFILE ? fd_limit() : 0;
  long entries = 0;
  while (readdir(dir)) ++entries;
  closedir(dir);
  return entries - 3;  // ".", ".." and the listing's own descriptor
}

std::string fd_usage() {
  return "the process has " + std::to_string(fds_in_use()) + " descriptors open of RLIMIT_NOFILE=" +
         std::to_string(fd_limit());
}

std::string read_word(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  return word;
}

// The pids controller of this process's cgroup (v2, or v1's "pids"
// hierarchy), "" when there is none.
std::string pids_cgroup_dir() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (controllers.empty() && line.compare(0, first, "0") == 0) return "/sys/fs/cgroup" + path;
    if (controllers == "pids") return "/sys/fs/cgroup/pids" + path;
  }
  return "";
}

// Threads the process may still start, and which limit says so; LONG_MAX
// when neither the cgroup nor the kernel limits it (RLIMIT_NPROC counts a
// whole user's processes and is left to the point of failure).
long threads_left(std::string& limit) {
  long left = LONG_MAX;
  std::string dir = pids_cgroup_dir();
  std::string max = dir.empty() ? "" : read_word(dir + "/pids.max");
  if (!max.empty() && max != "max") {
    long current = std::atol(read_word(dir + "/pids.current").c_str());
    left = std::atol(max.c_str()) - current;
    limit = "its cgroup allows " + max + " tasks (" + dir + "/pids.max) and " + std::to_string(current) + " run";
  }
  std::ifstream loadavg("/proc/loadavg");  // "0.10 0.20 0.30 <runnable>/<threads> <last pid>"
  std::string ignored, threads;
  loadavg >> ignored >> ignored >> ignored >> threads;
  auto slash = threads.find('/');
  long kernel_max = std::atol(read_word("/proc/sys/kernel/threads-max").c_str());
  if (slash != std::string::npos && kernel_max > 0) {
    long running = std::atol(threads.c_str() + slash + 1);
    if (kernel_max - running < left) {
      left = kernel_max - running;
      limit = "the kernel allows " + std::to_string(kernel_max) + " threads (kernel.threads-max) and " +
              std::to_string(running) + " run";
    }
  }
  return left;
}

}  // namespace

void check_resources(int rank, const ResourceNeeds& needs) {
  const std::string who = "rank " + std::to_string(rank) + " cannot create another communicator: ";
  const long limit = fd_limit(), in_use = fds_in_use();
  if (limit - in_use < needs.fds)
    throw SystemError(who + "it needs " + std::to_string(needs.fds) +
                      " more file descriptors (TCP sockets, pidfds on its shared-memory peers, set-up's own), "
                      "but the process has " + std::to_string(in_use) + " open of RLIMIT_NOFILE=" +
                      std::to_string(limit) + "; raise the limit (ulimit -n, LimitNOFILE= for a systemd "
                      "service) or " + kFewerCommunicators);
  std::string thread_limit;
  if (threads_left(thread_limit) < needs.threads)
    throw SystemError(who + "it needs " + std::to_string(needs.threads) + " more threads, but " + thread_limit +
                      "; raise that limit or " + kFewerCommunicators);
}

std::string fd_limit_hint(int err) {
  if (err == EMFILE)
    return std::string("; ") + fd_usage() + ": raise the limit (ulimit -n) or " + kFewerCommunicators;
  if (err == ENFILE)
    return std::string("; the system-wide table of open files is full (fs.file-max): close descriptors "
                       "elsewhere or raise fs.file-max");
  return "";
}

std::string thread_limit_hint() {
  std::string limit = "no cgroup or kernel limit is reached, so RLIMIT_NPROC (ulimit -u) or memory is";
  threads_left(limit);
  return "; starting a thread failed: " + limit + "; raise that limit or " + kFewerCommunicators;
}

}  // namespace braid::comm
