// The launcher takes its signals through a signalfd so that the one thread
// that polls the ranks' pipes also sees SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGQUIT,
// and the job control signals SIGTSTP and SIGCONT, with no handler code
// running at arbitrary points.
//
// Create the SignalCatcher before starting any thread (the store server):
// a signal mask is per thread and inherited, so threads started afterwards
// keep these signals blocked and the kernel queues them for the signalfd
// instead of delivering them to a thread that would act on the default.
#pragma once

#include <signal.h>

#include <vector>

#include "tools/launcher/process.h"

namespace braid::launcher {

class SignalCatcher {
 public:
  // Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP and SIGCONT
  // (which still continues the process) in this thread, opens a
  // signalfd for them and ignores SIGPIPE and SIGTTIN (input.h); the
  // destructor restores all.
  SignalCatcher();
  ~SignalCatcher();
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  int fd() const { return fd_.get(); }
  // Signals that arrived since the last call, in order; SIGCHLD is
  // reported once however many children exited.
  std::vector<int> take();

 private:
  sigset_t old_mask_;
  struct sigaction old_sigpipe_;
  struct sigaction old_sigttin_;
  UniqueFd fd_;
};

}  // namespace braid::launcher
