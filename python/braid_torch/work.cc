// The completion thread and torch's Work over braid's (work.h).
#include "work.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "braid/errors.h"

namespace braid::torch_backend {

void settle_finished(Pending& pending, std::exception_ptr error);

c10::intrusive_ptr<c10::ivalue::Future> make_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

void CompletionQueue::start() {
  std::lock_guard lock(mutex_);
  start_thread_locked();
}

CompletionQueue::~CompletionQueue() {
  for (std::thread& thread : threads_)
    if (thread.joinable()) thread.detach();  // only if stop_and_join() was skipped by an exception
}

// Joins and forgets the threads that retired (run()) first, so that the
// list holds live threads only.
void CompletionQueue::start_thread_locked() {
  for (std::thread::id id : retired_) {
    const auto at = std::find(ids_.begin(), ids_.end(), id) - ids_.begin();
    // It has left run() and holds nothing; stop_and_join() may have taken it.
    if (threads_[at].joinable()) threads_[at].join();
    threads_.erase(threads_.begin() + at);
    ids_.erase(ids_.begin() + at);
  }
  retired_.clear();
  threads_.emplace_back([self = shared_from_this()] { self->run(); });
  ids_.push_back(threads_.back().get_id());
}

void CompletionQueue::push(Pending pending) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(pending));
  }
  queued_cv_.notify_one();
}

void CompletionQueue::stop_and_join() {
  const std::thread::id me = std::this_thread::get_id();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    // Called in a future callback on one of this queue's threads (the
    // group's last reference let go there): that thread cannot join itself
    // (the process aborted), and its callback no longer counts as one the
    // others wait for; it leaves run() once the callback returns.
    if (std::find(ids_.begin(), ids_.end(), me) != ids_.end() && in_callbacks_ > 0) {
      ended_in_callback_ = me;
      --in_callbacks_;
    }
  }
  queued_cv_.notify_all();
  // A thread may start another until it ends (run()): join until none is
  // new.
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      for (std::thread& thread : threads_) {
        if (!thread.joinable()) continue;
        if (thread.get_id() == me)
          thread.detach();
        else
          threads.push_back(std::move(thread));
      }
    }
    if (threads.empty()) return;
    for (std::thread& thread : threads) thread.join();
    threads.clear();
  }
}

bool CompletionQueue::wait_quiet(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  return quiet_cv_.wait_for(lock, limit, [this] { return queue_.empty() && !turn_taken_ && in_callbacks_ == 0; });
}

bool CompletionQueue::on_completion_thread() {
  std::lock_guard lock(mutex_);
  return std::find(ids_.begin(), ids_.end(), std::this_thread::get_id()) != ids_.end();
}

void CompletionQueue::lend_thread() {
  std::lock_guard lock(mutex_);
  if (idle_ == 0 && !turn_taken_) start_thread_locked();
}

// One thread at a time takes the call at the front and waits for it, so
// calls finish in issue order; the callbacks run after the turn is let go.
// Threads past kSpareThreads that wait kSpareIdle for work retire.
void CompletionQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    // While callbacks run they may issue more calls (the group's end waits
    // for them too): a thread leaves only when none runs.
    const bool woke = queued_cv_.wait_for(lock, kSpareIdle, [this] {
      return (stopping_ && queue_.empty() && in_callbacks_ == 0) || (!queue_.empty() && !turn_taken_);
    });
    --idle_;
    if (!woke) {
      if (threads_.size() - retired_.size() <= kSpareThreads || stopping_) continue;
      retired_.push_back(std::this_thread::get_id());
      return;
    }
    if (queue_.empty()) return;  // stopping, and everything issued is finished
    turn_taken_ = true;
    {
      Pending pending = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error = finish(pending);
      lock.lock();
      turn_taken_ = false;
      // Callbacks may wait for a later call: another thread must be free
      // to take it.
      if (idle_ == 0 && threads_.size() - retired_.size() < kMaxThreads) start_thread_locked();
      ++in_callbacks_;
      lock.unlock();
      queued_cv_.notify_one();
      if (finished_hook_) finished_hook_();
      settle_finished(pending, error);
    }  // the call dies here, without mutex_: the last reference to a tensor
       // Python made takes the GIL, which a thread holding it may hold while
       // it waits for mutex_ (Work.get_future() issuing a held call)
    lock.lock();
    if (ended_in_callback_ == std::this_thread::get_id()) return;  // stop_and_join ran in its callback
    if (--in_callbacks_ == 0) {
      if (stopping_) queued_cv_.notify_all();
      quiet_cv_.notify_all();
    }
  }
}

namespace {

// braid's exception becomes a plain std::runtime_error with its message, so
// that torch and pybind11 raise it as RuntimeError wherever it surfaces.
std::exception_ptr as_runtime_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& failure) {
    return std::make_exception_ptr(std::runtime_error(failure.what()));
  } catch (...) {
    return std::make_exception_ptr(std::runtime_error("braid: the call failed"));
  }
}

// A call braid runs as another says so in front of braid's message.
std::exception_ptr with_runs_as(const Pending& pending, std::exception_ptr error) {
  if (!error || pending.runs_as.empty()) return error;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return std::make_exception_ptr(std::runtime_error(pending.runs_as + ": " + e.what()));
  }
}

// The call's outcome, before its future completes: a wait on a completion
// thread (a callback's) needs no more than this.
std::exception_ptr mark_finished(Pending& pending, std::exception_ptr error) {
  // Before anyone is told: a staging block goes back to its pool when its
  // tensor's last reference goes, and the finishing step holds one too. Let
  // go when the call died, a synchronous caller's next call found the block
  // still out and mapped a second one (another 128 MiB for a 2-rank 64 MiB
  // list all_gather).
  pending.keep_alive.clear();
  pending.finish = nullptr;
  error = with_runs_as(pending, error);
  {
    std::lock_guard lock(pending.completion->mutex);
    pending.completion->finished = true;
    pending.completion->error = error;
  }
  pending.completion->done_cv.notify_all();
  return error;
}

}  // namespace

// Completes the future: the callbacks chained on it run here.
void settle_finished(Pending& pending, std::exception_ptr error) {
  if (error) {
    pending.future->setError(error);
  } else {
    pending.future->markCompleted(c10::IValue(pending.outputs));
  }
  {
    std::lock_guard lock(pending.completion->mutex);
    pending.completion->done = true;
  }
  pending.completion->done_cv.notify_all();
}

void CompletionQueue::push_failed(Pending pending, std::exception_ptr error) {
  error = with_runs_as(pending, as_runtime_error(error));
  {
    std::lock_guard lock(pending.completion->mutex);
    pending.completion->finished = true;
    pending.completion->error = error;
    pending.completion->refused = true;
  }
  pending.completion->done_cv.notify_all();
  push(std::move(pending));
}

std::exception_ptr CompletionQueue::finish(Pending& pending) {
  {
    std::unique_lock lock(pending.completion->mutex);
    if (pending.completion->refused) {  // push_failed
      std::exception_ptr error = pending.completion->error;
      lock.unlock();
      pending.keep_alive.clear();
      pending.finish = nullptr;
      return error;
    }
  }
  std::exception_ptr error;
  try {
    pending.work.wait();
    if (pending.finish) pending.finish();
  } catch (...) {
    error = as_runtime_error(std::current_exception());
  }
  return mark_finished(pending, error);
}

BraidWork::BraidWork(int rank, c10d::OpType type, const Pending& pending, std::shared_ptr<CompletionQueue> queue,
                     std::shared_ptr<CallRelease> release)
    : c10d::Work(rank, type), outputs_(pending.outputs), future_(pending.future),
      completion_(pending.completion), queue_(std::move(queue)), release_(std::move(release)) {}

bool BraidWork::isCompleted() {
  release_->release(completion_);
  return future_->completed() || refused();
}

bool BraidWork::refused() const {
  std::lock_guard lock(completion_->mutex);
  return completion_->refused;
}

int BraidWork::sourceRank() const {
  return source_rank_ >= 0 ? source_rank_ : c10d::Work::sourceRank();  // the base refuses, by name
}

bool BraidWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr BraidWork::exception() const {
  if (future_->completed() && future_->hasError()) return future_->exception_ptr();
  std::lock_guard lock(completion_->mutex);
  return completion_->refused ? completion_->error : nullptr;
}

std::vector<at::Tensor> BraidWork::result() { return outputs_; }

bool BraidWork::wait(std::chrono::milliseconds timeout) {
  // Only a wait without a deadline may run the call here: it returns once
  // every peer has joined it.
  if (timeout == kNoTimeout && !queue_->on_completion_thread())
    release_->run_here(completion_);
  else
    release_->release(completion_);
  if (queue_->on_completion_thread()) {
    // In a future callback of this group: another completion thread
    // finishes the call. Until it has finished, not until its own callbacks
    // have run: they may be this very callback (a wait for its own call).
    queue_->lend_thread();
    std::unique_lock lock(completion_->mutex);
    auto finished = [this] { return completion_->finished; };
    if (timeout == kNoTimeout) {
      completion_->done_cv.wait(lock, finished);
    } else if (!completion_->done_cv.wait_for(lock, timeout, finished)) {
      throw TimeoutError("braid: Work.wait timed out after " + std::to_string(timeout.count()) +
                         " ms; the operation is still queued");
    }
    if (completion_->error) std::rethrow_exception(completion_->error);
    return true;
  }
  std::unique_lock lock(completion_->mutex);
  auto settled = [this] { return completion_->done || completion_->refused; };
  if (timeout == kNoTimeout) {
    completion_->done_cv.wait(lock, settled);
  } else if (!completion_->done_cv.wait_for(lock, timeout, settled)) {
    throw TimeoutError("braid: Work.wait timed out after " + std::to_string(timeout.count()) +
                       " ms; the operation is still queued");
  }
  if (completion_->refused) std::rethrow_exception(completion_->error);
  lock.unlock();
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

// Whoever chains on the future (DDP's comm hooks) waits for it elsewhere.
c10::intrusive_ptr<c10::ivalue::Future> BraidWork::getFuture() {
  release_->release(completion_);
  return future_;
}

}  // namespace braid::torch_backend
