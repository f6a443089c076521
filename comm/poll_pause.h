// The pause between two queries of a wait for the GPU (wait_for_event,
// comm/device_cuda.h): a thread that waits for a CUDA event polls it, since
// CUDA's own blocking waits have no timeout, and must sleep between polls,
// since it may share a core with the ranks it waits for.
//
// How long it sleeps is how late it notices: a kernel of a 256 MiB
// all_reduce on an H200 takes about 250 us, and with sleeps that grew to
// 100 us, each lengthened by Linux's default timer slack of 50 us, the
// waiting thread noticed its end 310 us after launch, where a spinning one
// did at 261 us (scripts/cuda_gate_probe.cu, mode wake). Here each sleep is
// an eighth of the time waited so far (5 us at least, 100 us at most), so
// the wait ends at most about 1/8 late, and the thread's timer slack is 1 us
// while it waits (restored after): a sleep then lasts what it asks for.
// A wait of t microseconds wakes about 8.5 ln(t / 40) + 8 times (24 times
// for 256 us); a wait past 800 us once every 100 us, as before.
// Self-contained (scripts/cuda_gate_probe.cu times it, mode wake).
#pragma once

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace braid::comm {

class PollPause {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kShortest = std::chrono::microseconds(5);
  static constexpr auto kLongest = std::chrono::microseconds(100);
  static constexpr unsigned long kSlackNs = 1000;

  PollPause() : start_(Clock::now()) {}
  ~PollPause() {
    if (previous_slack_ > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(previous_slack_), 0, 0, 0);
  }
  PollPause(const PollPause&) = delete;
  PollPause& operator=(const PollPause&) = delete;

  // The sleep the next pause takes, after `elapsed` of waiting.
  static Clock::duration sleep_after(Clock::duration elapsed) {
    return std::clamp<Clock::duration>(elapsed / 8, kShortest, kLongest);
  }

  // Sleeps; the first pause sets the thread's timer slack (a wait whose
  // first query finds the event done makes no system call).
  void operator()() {
    if (previous_slack_ == 0) {
      const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
      previous_slack_ = slack > static_cast<int>(kSlackNs) ? slack : -1;  // -1: left as it was
      if (previous_slack_ > 0 && prctl(PR_SET_TIMERSLACK, kSlackNs, 0, 0, 0) != 0) previous_slack_ = -1;
    }
    std::this_thread::sleep_for(sleep_after(Clock::now() - start_));
  }

 private:
  Clock::time_point start_;
  int previous_slack_ = 0;  // 0: not yet looked at; > 0: to restore
};

}  // namespace braid::comm
