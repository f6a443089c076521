#include "runtime/shm_names.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "runtime/hash.h"

namespace braid::runtime {

std::string shm_job_prefix(const std::string& job_token) {
  char text[40];
  std::snprintf(text, sizeof text, "/braid-%016llx-", static_cast<unsigned long long>(fnv1a(job_token)));
  return text;
}

std::string shm_run_prefix(const std::string& job_token, const std::string& run_id) {
  char text[16];
  std::snprintf(text, sizeof text, "%08llx-", static_cast<unsigned long long>(fnv1a(run_id) & 0xffffffffull));
  return shm_job_prefix(job_token) + text;
}

int remove_segments(const std::string& prefix) {
  const std::string name = prefix.rfind('/', 0) == 0 ? prefix.substr(1) : prefix;
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string file = entry.path().filename().string();
    if (file.rfind(name, 0) == 0 && shm_unlink(("/" + file).c_str()) == 0) ++removed;
  }
  return removed;
}

int remove_job_segments(const std::string& job_token) { return remove_segments(shm_job_prefix(job_token)); }

}  // namespace braid::runtime
