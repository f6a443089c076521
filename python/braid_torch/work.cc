// The completion thread and torch's Work over braid's (work.h).
#include "work.h"

#include <stdexcept>
#include <string>

#include "braid/errors.h"

namespace braid::torch_backend {

c10::intrusive_ptr<c10::ivalue::Future> make_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

Completer::Completer() : thread_([this] { run(); }) {}

Completer::~Completer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_cv_.notify_one();
  thread_.join();
}

void Completer::push(Pending pending) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(pending));
  }
  queued_cv_.notify_one();
}

void Completer::run() {
  for (;;) {
    Pending pending;
    {
      std::unique_lock lock(mutex_);
      queued_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything issued is finished
      pending = std::move(queue_.front());
      queue_.pop_front();
    }
    complete(pending);
  }
}

// braid's exception becomes a plain std::runtime_error with its message, so
// that torch and pybind11 raise it as RuntimeError wherever it surfaces.
void Completer::complete(Pending& pending) {
  try {
    pending.work.wait();
    if (pending.finish) pending.finish();
    pending.keep_alive.clear();
    pending.future->markCompleted(c10::IValue(pending.outputs));
  } catch (const std::exception& error) {
    pending.future->setError(std::make_exception_ptr(std::runtime_error(error.what())));
  }
  {
    std::lock_guard lock(pending.completion->mutex);
    pending.completion->done = true;
  }
  pending.completion->done_cv.notify_all();
}

BraidWork::BraidWork(int rank, c10d::OpType type, const Pending& pending)
    : c10d::Work(rank, type), outputs_(pending.outputs), future_(pending.future),
      completion_(pending.completion) {}

bool BraidWork::isCompleted() { return future_->completed(); }

bool BraidWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr BraidWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

std::vector<at::Tensor> BraidWork::result() { return outputs_; }

bool BraidWork::wait(std::chrono::milliseconds timeout) {
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

c10::intrusive_ptr<c10::ivalue::Future> BraidWork::getFuture() { return future_; }

}  // namespace braid::torch_backend
