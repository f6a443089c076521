#include "comm/status.h"

#include <chrono>
#include <optional>

#include "runtime/errors.h"
#include "runtime/store.h"

namespace braid::comm {

StatusBoard::StatusBoard(std::shared_ptr<runtime::Store> store, std::string key_prefix, int rank)
    : store_(std::move(store)), prefix_(std::move(key_prefix)), rank_(rank) {
  if (store_) thread_ = std::thread([this] { run(); });
}

StatusBoard::~StatusBoard() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string StatusBoard::key(const char* what, int rank) const {
  return prefix_ + "/" + what + "/" + std::to_string(rank);
}

void StatusBoard::entered(const Op& op) {
  kind_.store(static_cast<std::uint8_t>(op.kind), std::memory_order_relaxed);
  seq_.store(op.seq, std::memory_order_release);
}

void StatusBoard::run() {
  std::uint64_t published = 0;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
    std::uint64_t seq = seq_.load(std::memory_order_acquire);
    if (seq == published) continue;
    std::string value = std::string(name(static_cast<OpKind>(kind_.load()))) + " #" + std::to_string(seq);
    lock.unlock();
    try {
      store_->set(key("status", rank_), value);
      published = seq;
    } catch (const Error&) {
      // The store is gone (job ending); attribution is best effort.
    }
    lock.lock();
  }
}

std::string StatusBoard::describe_peer(int peer) {
  if (!store_) return "is unknown";
  try {
    auto value = store_->try_get(key("status", peer));
    if (!value) return "has not entered any operation on this communicator (or entered one < 100 ms ago)";
    return "last entered " + std::string(value->begin(), value->end());
  } catch (const Error&) {
    return "could not be asked (the store did not answer)";
  }
}

std::string StatusBoard::ranks_behind(const Op& op, int size) {
  if (!store_ || op.kind == OpKind::send || op.kind == OpKind::recv) return {};
  std::string list;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank_) continue;
    std::optional<runtime::Bytes> value;
    try {
      value = store_->try_get(key("status", peer));
    } catch (const Error&) {
      return {};
    }
    std::string text = value ? std::string(value->begin(), value->end()) : std::string();
    auto hash = text.find(" #");
    bool p2p = text.rfind("send", 0) == 0 || text.rfind("recv", 0) == 0;
    if (p2p) continue;
    bool behind = !value || (hash != std::string::npos && std::stoull(text.substr(hash + 2)) < op.seq);
    if (behind)
      list += (list.empty() ? "" : ", ") + std::string("rank ") + std::to_string(peer) +
              (value ? " (last entered " + text + ")" : " (entered nothing yet)");
  }
  return list;
}

void StatusBoard::publish_abort(const std::string& reason) {
  if (!store_) return;
  try {
    store_->set(key("abort", rank_), reason);
  } catch (const Error&) {
  }
}

std::string StatusBoard::abort_reason(int peer) {
  if (!store_) return {};
  try {
    auto value = store_->try_get(key("abort", peer));
    return value ? std::string(value->begin(), value->end()) : std::string();
  } catch (const Error&) {
    return {};
  }
}

}  // namespace braid::comm
