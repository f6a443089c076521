// The completion thread and torch's Work over braid's (work.h).
#include "work.h"

#include <stdexcept>
#include <string>

#include "braid/errors.h"

namespace braid::torch_backend {

c10::intrusive_ptr<c10::ivalue::Future> make_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

Completer::Completer()
    : queue_(std::make_shared<CompletionQueue>()), thread_([queue = queue_] { queue->run(); }) {}

Completer::~Completer() {
  queue_->stop();
  thread_.join();
}

void CompletionQueue::push(Pending pending) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(pending));
  }
  queued_cv_.notify_one();
}

void CompletionQueue::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_cv_.notify_one();
}

bool CompletionQueue::on_completion_thread() {
  std::lock_guard lock(mutex_);
  return thread_id_ == std::this_thread::get_id();
}

void CompletionQueue::run() {
  {
    std::lock_guard lock(mutex_);
    thread_id_ = std::this_thread::get_id();
  }
  for (;;) {
    Pending pending;
    {
      std::unique_lock lock(mutex_);
      queued_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {  // stopping, and everything issued is finished
        thread_id_ = std::thread::id();
        return;
      }
      pending = std::move(queue_.front());
      queue_.pop_front();
    }
    complete(pending);
  }
}

// Calls are finished in issue order whichever frame of the completion thread
// pops them, so a callback's wait keeps braid's order.
void CompletionQueue::finish_until(const std::shared_ptr<Completion>& target) {
  for (;;) {
    Pending pending;
    {
      std::lock_guard done_lock(target->mutex);
      if (target->finished) return;
    }
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty())
        throw std::logic_error("braid: Work.wait in a future callback waits for the call whose callback it is");
      pending = std::move(queue_.front());
      queue_.pop_front();
    }
    complete(pending);
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

void settle(Pending& pending, std::exception_ptr error) {
  pending.keep_alive.clear();
  if (error && !pending.runs_as.empty()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(pending.runs_as + ": " + e.what()));
    }
  }
  {
    std::lock_guard lock(pending.completion->mutex);
    pending.completion->finished = true;
    pending.completion->error = error;
  }
  // Callbacks chained on the future run here.
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

}  // namespace

void fail_pending(Pending& pending, std::exception_ptr error) { settle(pending, as_runtime_error(error)); }

void CompletionQueue::complete(Pending& pending) {
  std::exception_ptr error;
  try {
    pending.work.wait();
    if (pending.finish) pending.finish();
  } catch (...) {
    error = as_runtime_error(std::current_exception());
  }
  settle(pending, error);
}

BraidWork::BraidWork(int rank, c10d::OpType type, const Pending& pending, std::shared_ptr<CompletionQueue> queue,
                     std::shared_ptr<CallRelease> release)
    : c10d::Work(rank, type), outputs_(pending.outputs), future_(pending.future),
      completion_(pending.completion), queue_(std::move(queue)), release_(std::move(release)) {}

bool BraidWork::isCompleted() {
  release_->release(completion_);
  return future_->completed();
}

bool BraidWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr BraidWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
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
    // In a future callback of this group: nothing else would finish the call.
    queue_->finish_until(completion_);
    std::lock_guard lock(completion_->mutex);
    if (completion_->error) std::rethrow_exception(completion_->error);
    return true;
  }
  std::unique_lock lock(completion_->mutex);
  if (timeout == kNoTimeout) {
    completion_->done_cv.wait(lock, [this] { return completion_->done; });
  } else if (!completion_->done_cv.wait_for(lock, timeout, [this] { return completion_->done; })) {
    throw TimeoutError("braid: Work.wait timed out after " + std::to_string(timeout.count()) +
                       " ms; the operation is still queued");
  }
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
