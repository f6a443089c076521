// Names of braid's POSIX shared-memory segments. Every segment of a job
// starts with shm_job_prefix(token), so that whoever outlives a crashed job
// (braid-launch, a test harness) can remove what it left in /dev/shm.
#pragma once

#include <string>

namespace braid::runtime {

// "/braid-<16 hex digits of a hash of the job token>-"
std::string shm_job_prefix(const std::string& job_token);

// Unlinks every segment in /dev/shm whose name starts with the job's prefix;
// returns how many it removed.
int remove_job_segments(const std::string& job_token);

}  // namespace braid::runtime
