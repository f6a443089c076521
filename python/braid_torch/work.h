// How braid's Work handles become torch's: a Work whose future DDP's comm
// hooks chain on, completed by one thread per process group.
//
// braid completes the operations of a communicator in issue order, so the
// completion threads wait for them in that order, one at a time (each wait
// bounded by BRAID_TIMEOUT), run the call's finishing step (copying out of a
// staging buffer where torch's layout differs from braid's), and then
// complete the torch future with the call's output tensors, or fail it with
// braid's message. Callbacks chained on the future (DDP's) run on the thread
// that completed it, after it has let the next call's turn go: a callback
// may wait for a later call of the group (DDP's PowerSGD hook waits on the
// future of an all_reduce it issues), which another completion thread then
// finishes. A thread is added whenever one starts callbacks with no other
// waiting for the queue, so one is always free to take the next call (at
// most kMaxThreads; two in the common case, as gloo's workers; past
// kSpareThreads a thread that idles kSpareIdle retires), and beyond
// kMaxThreads whenever a callback waits with none free (lend_thread). A finished call is
// let go without the queue's lock: its tensors' last reference may take the
// GIL, which a thread asking for a Work's future holds while it waits for
// that lock.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "braid/work.h"

namespace braid::torch_backend {

// Signalled once the future is complete, so that Work::wait(timeout) can
// give up at its deadline. `finished` and `error` are set before the future
// completes (and its callbacks run), `done` after.
struct Completion {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool finished = false;
  std::exception_ptr error;
  bool done = false;
  // It could not be issued (CompletionQueue::push_failed): its Work says
  // so at once, though its future fails only in issue order.
  bool refused = false;
};

// One issued call, as the completion thread finishes it.
struct Pending {
  comm::Work work;
  std::function<void()> finish;       // after the braid call succeeded; may be empty
  std::vector<at::Tensor> keep_alive;  // inputs and staging the call reads or writes
  std::vector<at::Tensor> outputs;     // the future's value
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::shared_ptr<Completion> completion;
  std::string runs_as;  // put in front of an error's message (ProcessGroupBraid::Call)
};

// What a Work asks of its group before it waits or is asked about: that its
// call, if the group still holds it back (process_group.cc, Issuer), be
// issued. Neither throws: a call that cannot be issued fails its future.
class CallRelease {
 public:
  // The caller waits for the call, with no timeout: it may run in the
  // caller's thread.
  virtual void run_here(const std::shared_ptr<Completion>& completion) = 0;
  // On the progress thread; the caller does not wait for it here.
  virtual void release(const std::shared_ptr<Completion>& completion) = 0;

 protected:
  ~CallRelease() = default;
};

// The queue of one group's issued calls and the threads that complete them.
// Each thread holds the queue: a group whose last reference a future
// callback let go ends on one of them (stop_and_join).
class CompletionQueue : public std::enable_shared_from_this<CompletionQueue> {
 public:
  static constexpr std::size_t kMaxThreads = 8;
  // Threads kept however long they idle; others retire after kSpareIdle.
  static constexpr std::size_t kSpareThreads = 2;
  static constexpr std::chrono::seconds kSpareIdle{2};

  CompletionQueue() = default;
  // Starts the first thread.
  void start();
  // stop_and_join() must have run.
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  void push(Pending pending);
  // A call that could not be issued, queued like an issued one: marked
  // failed at once (its Completion finished, with the error its future
  // will carry: the calls deferred behind it go on), its future failed by a
  // completion thread in issue order, where its callbacks may wait for
  // later calls of the group (on the Issuer's thread, which issues those,
  // they waited for good). Takes no tensor's last reference: callers may
  // hold a lock that a thread holding the GIL waits for.
  void push_failed(Pending pending, std::exception_ptr error);
  // Runs, on a completion thread, after each call has finished (before its
  // future's callbacks): the Issuer's deferred calls wait for calls to
  // finish. Set before the first push.
  void set_finished_hook(std::function<void()> hook) { finished_hook_ = std::move(hook); }
  // Finishes every call still queued (each bounded by its own wait), then
  // joins the threads.
  void stop_and_join();
  // Whether the caller is one of the completion threads (in a callback).
  bool on_completion_thread();
  // A callback is about to wait for a later call: where no thread is free
  // to take the queue's next call, starts one, past kMaxThreads too. Nine
  // callbacks each waiting for a call of its own held all eight threads,
  // and the job hung for good, past the group's timeout.
  void lend_thread();
  // Waits, up to `limit`, until no call is queued or being finished and no
  // callback runs; whether it got there.
  bool wait_quiet(std::chrono::milliseconds limit);

 private:
  void run();
  void start_thread_locked();
  static std::exception_ptr finish(Pending& pending);

  std::mutex mutex_;
  std::condition_variable queued_cv_;
  std::deque<Pending> queue_;
  std::function<void()> finished_hook_;
  bool stopping_ = false;
  bool turn_taken_ = false;  // a thread is waiting for the call at the front
  std::size_t idle_ = 0;     // threads waiting for the queue
  std::size_t in_callbacks_ = 0;  // threads running a future's callbacks
  std::thread::id ended_in_callback_;  // the thread whose callback ran stop_and_join
  std::condition_variable quiet_cv_;  // in_callbacks_ or the queue may have come to rest
  std::vector<std::thread> threads_;  // started, retired ones not yet joined included
  std::vector<std::thread::id> ids_;   // of threads_, in its order
  std::vector<std::thread::id> retired_;  // left run(); joined by the next start
};

class Completer {
 public:
  Completer() : queue_(std::make_shared<CompletionQueue>()) { queue_->start(); }
  // Finishes every call still queued (each bounded by its own wait), then
  // joins the threads.
  ~Completer() { queue_->stop_and_join(); }
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  void push(Pending pending) { queue_->push(std::move(pending)); }
  const std::shared_ptr<CompletionQueue>& queue() const { return queue_; }

 private:
  std::shared_ptr<CompletionQueue> queue_;
};

class BraidWork : public c10d::Work {
 public:
  BraidWork(int rank, c10d::OpType type, const Pending& pending, std::shared_ptr<CompletionQueue> queue,
            std::shared_ptr<CallRelease> release);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits for the call and rethrows its error (RuntimeError with braid's
  // message). kNoTimeout waits as long as braid's own bound (BRAID_TIMEOUT);
  // a timeout that expires first throws, leaving the call queued.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A receive's peer (gloo's Work answers it; torch's own recv does not ask).
  int sourceRank() const override;
  void set_source_rank(int rank) { source_rank_ = rank; }

 private:
  bool refused() const;  // Completion::refused
  int source_rank_ = -1;  // a receive's peer
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<Completion> completion_;
  std::shared_ptr<CompletionQueue> queue_;
  std::shared_ptr<CallRelease> release_;
};

// A future for a call's list of output tensors.
c10::intrusive_ptr<c10::ivalue::Future> make_future();

}  // namespace braid::torch_backend
