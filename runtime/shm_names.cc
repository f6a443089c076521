#include "runtime/shm_names.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>

namespace braid::runtime {

std::string shm_job_prefix(const std::string& job_token) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, stable across processes
  for (unsigned char c : job_token) h = (h ^ c) * 1099511628211ull;
  char text[40];
  std::snprintf(text, sizeof text, "/braid-%016llx-", static_cast<unsigned long long>(h));
  return text;
}

int remove_job_segments(const std::string& job_token) {
  std::string prefix = shm_job_prefix(job_token).substr(1);  // without the leading '/'
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) == 0 && shm_unlink(("/" + file).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace braid::runtime
