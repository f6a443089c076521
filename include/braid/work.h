// Work: the handle every Communicator call returns.
//
// Operations on one communicator complete in the order they were issued.
// wait() blocks (on a futex-backed condition variable, never spinning) until
// the operation completes and rethrows its error, which names the operation,
// the peer and the cause. Every wait is bounded: wait() by the configured
// BRAID_TIMEOUT plus a margin (the operation itself fails at BRAID_TIMEOUT),
// wait(timeout) by the given duration, after which it throws TimeoutError
// while the operation stays queued.
#pragma once

#include <chrono>
#include <memory>

namespace braid::comm {

struct WorkState;

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  void wait();
  void wait(std::chrono::milliseconds timeout);
  // True once the operation completed; throws its error if it failed.
  bool test();
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace braid::comm
