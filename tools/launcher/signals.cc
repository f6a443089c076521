#include "tools/launcher/signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace braid::launcher {

SignalCatcher::SignalCatcher() {
  sigset_t caught;
  sigemptyset(&caught);
  for (int signo : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGCONT}) sigaddset(&caught, signo);
  if (int err = pthread_sigmask(SIG_BLOCK, &caught, &old_mask_); err != 0)
    throw SystemError(errno_message("pthread_sigmask", err));
  fd_.reset(signalfd(-1, &caught, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd_.valid()) {
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    throw SystemError(errno_message("signalfd", err));
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_sigpipe_);
  sigaction(SIGTTIN, &ignore, &old_sigttin_);
}

SignalCatcher::~SignalCatcher() {
  sigaction(SIGTTIN, &old_sigttin_, nullptr);
  sigaction(SIGPIPE, &old_sigpipe_, nullptr);
  fd_.reset();
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

std::vector<int> SignalCatcher::take() {
  std::vector<int> signals;
  signalfd_siginfo info;
  while (::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    int signo = static_cast<int>(info.ssi_signo);
    bool repeated_chld = signo == SIGCHLD &&
                         std::find(signals.begin(), signals.end(), SIGCHLD) != signals.end();
    if (!repeated_chld) signals.push_back(signo);
  }
  return signals;
}

}  // namespace braid::launcher
