// The CUDA probes of scripts/ (cuda_gate_probe.cu, allreduce_wait_probe.cu) run
// their parts in child processes, forked before anything touches CUDA.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

// Waits up to `limit` for child `pid` to exit, then kills it. True when it
// exited by itself with status 0; false when it failed or was killed.
inline bool reap_within(pid_t pid, std::chrono::milliseconds limit, bool* killed = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      if (killed) *killed = true;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (killed) *killed = false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
