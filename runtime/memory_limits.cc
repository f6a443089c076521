#include "runtime/memory_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

namespace braid::runtime {
namespace {

namespace fs = std::filesystem;

// The first number of a file ("max" and unreadable files: none).
std::optional<double> read_number(const fs::path& path) {
  std::ifstream in(path);
  double value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

std::optional<MemoryLimit> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return MemoryLimit{kib * 1024, "MemAvailable in /proc/meminfo", true};
    in.ignore(256, '\n');
  }
  return std::nullopt;
}

// memory.max - memory.current of this process's cgroup v2 and each
// ancestor ("0::/path" in /proc/self/cgroup); the tightest.
std::optional<MemoryLimit> cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return std::nullopt;
  std::optional<MemoryLimit> tightest;
  for (fs::path p = path; !p.empty(); p = p == p.parent_path() ? fs::path() : p.parent_path()) {
    const fs::path dir = fs::path("/sys/fs/cgroup") / p.relative_path();
    const auto max = read_number(dir / "memory.max");
    if (!max) continue;
    const double left = *max - read_number(dir / "memory.current").value_or(0.0);
    if (!tightest || left < tightest->bytes) {
      tightest = MemoryLimit{left, "the cgroup limit " + (dir / "memory.max").string() + " less memory.current", true};
    }
  }
  return tightest;
}

std::optional<MemoryLimit> address_space_limit(double reserved, const std::string& reserved_for) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const double mapped = read_number("/proc/self/statm").value_or(0.0) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  return MemoryLimit{static_cast<double>(limit.rlim_cur) - mapped - reserved,
                     "the address-space limit (ulimit -v) less what this process maps" +
                         (reserved > 0 ? " and " + format_bytes(reserved) + " for " + reserved_for : std::string()),
                     false};
}

}  // namespace

std::vector<MemoryLimit> memory_limits(double reserved, const std::string& reserved_for) {
  std::vector<MemoryLimit> limits;
  for (auto limit : {mem_available(), cgroup_limit(), address_space_limit(reserved, reserved_for)}) {
    if (limit) limits.push_back(*limit);
  }
  return limits;
}

double per_rank(const MemoryLimit& limit, int local_ranks) {
  return limit.per_host ? limit.bytes / std::max(1, local_ranks) : limit.bytes;
}

const MemoryLimit* tightest(const std::vector<MemoryLimit>& limits, int local_ranks) {
  const auto it = std::min_element(limits.begin(), limits.end(), [&](const auto& a, const auto& b) {
    return per_rank(a, local_ranks) < per_rank(b, local_ranks);
  });
  return it == limits.end() ? nullptr : &*it;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char text[64];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.3g %s", bytes, units[u]);
  return text;
}

}  // namespace braid::runtime
