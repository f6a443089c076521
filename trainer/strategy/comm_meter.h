// What one group's communication costs this rank: the time the training
// thread is blocked on it, the bytes its calls move counted per call as
// nccl-tests counts bus bytes, and the bytes the group's transports carried.
//
// Bus bytes are what each rank of a bandwidth-optimal algorithm sends for
// a call of S bytes (nccl-tests' busBw x time; n: the group's ranks):
//
//   all_reduce                   2(n-1)/n x S     (ring: reduce-scatter + all-gather)
//   reduce_scatter, all_gather   (n-1)/n x S      (S: the whole n-part buffer)
//   broadcast, reduce            S                (a chain's inner rank)
//   send                         S on the sender  (recv and barrier: 0)
//
// They depend on the calls alone, never on the algorithm that ran them:
// braid's direct and one-shot collectives on one host read their peers'
// shared memory and move (almost) nothing through the transports, so the
// transport counters say what crossed a socket or a shared ring, and bus
// bytes say what the strategy asked of the group. Both are set beside the
// theory: the transports' in DESIGN.md's invariant 5 (test_strategies.cc,
// over TCP), the bus bytes of every group in braid-train's summary.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "trainer/model/backend.h"

namespace braid::trainer {

// A meter's counters at one moment; differences give a step's share.
struct GroupTraffic {
  double bus_bytes = 0.0;               // sent by this rank, nccl-tests' convention
  comm::TrafficStats transport;         // the communicator's transports
  std::chrono::duration<double> blocked{};

  GroupTraffic operator-(const GroupTraffic& earlier) const;
  GroupTraffic operator+(const GroupTraffic& other) const;
};

// Bus bytes of one call (header table) on `ranks` ranks.
double bus_bytes(comm::OpKind kind, std::size_t call_bytes, int ranks);

class CommMeter {
 public:
  // The communicator's calls that issue() hands its call, each counted in
  // bus bytes before it is made. Counts follow the Communicator's.
  class Calls {
   public:
    comm::Work all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                          comm::Stream stream = {});
    comm::Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype, ReduceOp op,
                              comm::Stream stream = {});
    comm::Work all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype,
                          comm::Stream stream = {});
    comm::Work broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                         comm::Stream stream = {});
    comm::Work reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root,
                      comm::Stream stream = {});
    comm::Work send(const void* buffer, std::size_t count, DataType dtype, int peer);
    comm::Work recv(void* buffer, std::size_t count, DataType dtype, int peer);
    comm::Work barrier();

   private:
    friend class CommMeter;
    explicit Calls(CommMeter& meter) : meter_(meter) {}
    void note(comm::OpKind kind, std::size_t elements, DataType dtype);
    CommMeter& meter_;
  };

  // `comm` may be null (no communication; traffic() is zero). `ops`: the
  // backend of the buffers passed to issue_on_device (default: the CPU's).
  explicit CommMeter(comm::Communicator* comm, const Backend* ops = nullptr)
      : comm_(comm), ops_(ops != nullptr ? ops : &backend(Device::kCpu)) {}
  CommMeter(const CommMeter&) = delete;
  CommMeter& operator=(const CommMeter&) = delete;

  // Runs `call` (which makes one call through the Calls it gets, on host
  // buffers, and returns its Work), counting the time it blocks.
  template <typename Call>
  comm::Work issue(Call&& call) {
    const auto start = std::chrono::steady_clock::now();
    Calls calls(*this);
    comm::Work work = call(calls);
    blocked_ += std::chrono::steady_clock::now() - start;
    return work;
  }
  // The same for a call on the strategy's buffers: `call` also gets the
  // stream to pass (Backend::comm_stream), which first waits for the
  // kernels queued so far.
  template <typename Call>
  comm::Work issue_on_device(Call&& call) {
    const auto start = std::chrono::steady_clock::now();
    ops_->order_comm_after_compute();
    Calls calls(*this);
    comm::Work work = call(calls, comm::Stream{ops_->comm_stream()});
    blocked_ += std::chrono::steady_clock::now() - start;
    return work;
  }
  // issue() and wait.
  template <typename Call>
  void run(Call&& call) {
    comm::Work work = issue(std::forward<Call>(call));
    wait(work);
  }
  void wait(comm::Work& work);
  // Waits for every work in order, then forgets them.
  void wait_all(std::vector<comm::Work>& works);

  int size() const { return comm_ != nullptr ? comm_->size() : 1; }
  std::chrono::duration<double> blocked() const { return blocked_; }
  double bus_bytes() const { return bus_bytes_; }
  // Zero for a meter without a communicator.
  comm::TrafficStats traffic() const;
  GroupTraffic snapshot() const { return {bus_bytes_, traffic(), blocked_}; }

 private:
  comm::Communicator* comm_;
  const Backend* ops_;
  std::chrono::steady_clock::duration blocked_{};
  double bus_bytes_ = 0.0;
};

}  // namespace braid::trainer
