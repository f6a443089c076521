// Names of braid's POSIX shared-memory segments. Every segment of a job
// starts with shm_run_prefix(token, run id), so that whoever outlives a
// crashed job (braid-launch, a test harness) can remove what it left in
// /dev/shm. The run id (BRAID_RUN_ID, which braid-launch draws for each
// job unless given one) tells apart two jobs on one host given the same
// BRAID_JOB_TOKEN (exported once for jobs across nodes): named by the token
// alone, the second job's segments collided with the first's ("File
// exists"), and either launcher's clean-up removed the other's.
#pragma once

#include <string>

namespace braid::runtime {

// "/braid-<16 hex digits of a hash of the job token>-": the segments of
// every run given that token.
std::string shm_job_prefix(const std::string& job_token);

// shm_job_prefix(job_token) + "<8 hex digits of a hash of the run id>-"
std::string shm_run_prefix(const std::string& job_token, const std::string& run_id);

// Unlinks every segment in /dev/shm whose name starts with `prefix` (one of
// the above, with or without its leading '/'); returns how many it removed.
int remove_segments(const std::string& prefix);

// remove_segments(shm_job_prefix(job_token)).
int remove_job_segments(const std::string& job_token);

}  // namespace braid::runtime
