// StatusBoard: publishes, for timeout attribution, the last operation this
// rank entered on a communicator, and reads its peers'.
//
// entered() only stores two atomics (it runs on every call); a background
// thread publishes the value to the store when it changed, at most every
// 100 ms. When a wait times out, the waiting rank reads the peer's entry, so
// the error can say "rank 1 waits in all_reduce #812 for rank 2, which last
// entered all_gather #811". The board also carries abort reasons: a rank
// that fails writes its error before closing its connections, so peers that
// see the connection drop can say why.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/types.h"

namespace braid::runtime {
class Store;
}

namespace braid::comm {

class StatusBoard {
 public:
  StatusBoard(std::shared_ptr<runtime::Store> store, std::string key_prefix, int rank);
  ~StatusBoard();

  void entered(const Op& op);
  // "last entered all_gather #811", "has not entered any operation", ...
  std::string describe_peer(int peer);
  // The ranks (of `size`) whose last entered collective comes before `op`,
  // e.g. "rank 2 (last entered barrier #3)", so a timeout names the rank
  // that stopped even when the waiting rank waits for it only indirectly.
  // Empty when none is behind or `op` is point-to-point.
  std::string ranks_behind(const Op& op, int size);
  void publish_abort(const std::string& reason);
  // The reason a peer published when it aborted, or empty.
  std::string abort_reason(int peer);

 private:
  void run();
  std::string key(const char* what, int rank) const;

  std::shared_ptr<runtime::Store> store_;
  std::string prefix_;
  int rank_;
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<std::uint8_t> kind_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace braid::comm
