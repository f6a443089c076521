// Pipeline parallelism's communication: activations forward and their
// gradients backward between adjacent stages (Megatron-LM's p2p_communication),
// and the sum of the tied embedding's gradient over the first and last stage.
//
// The PP group's rank is the stage. Stage s receives its input x from s-1
// (recv_forward) and sends its output y to s+1 (send_forward); backward
// receives dL/dy from s+1 (recv_backward) and sends dL/dx to s-1
// (send_backward). Calls that would cross the end of the pipeline (the
// first stage's recv_forward / send_backward, the last stage's send_forward
// / recv_backward) do nothing, so a schedule is written once for every stage.
//
// Every call is blocking, and a send may wait for the peer's matching recv
// (a message larger than the transport's buffer). Operations on one
// communicator run in issue order, so two adjacent stages that both send
// first would wait for each other for ever. The rule that prevents it: on
// each link (s, s+1) both stages make the same calls in the same order.
// 1F1B's two paired calls keep it by always moving the activation first:
//
//   stage s:    send_forward_recv_backward   = send y_j to s+1, then recv dy_i
//   stage s+1:  send_backward_recv_forward   = recv x_j from s, then send dx_i
//
// With every link in the same order, a chain of stages cannot deadlock. A
// blocked stage waits on one link for a neighbour that has not reached the
// same message there; having made the same earlier calls on that link, the
// neighbour must be blocked on its other link, one step further along the
// line. The waits cannot go on past the first or the last stage, which have
// one link only. (tests/trainer/test_pp.cc runs with sends that wait for
// their receive, so an order that breaks the rule fails there.)
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "comm/communicator.h"
#include "trainer/strategy/comm_meter.h"

namespace braid::trainer {

class PipeComm {
 public:
  // `pp_group`: the ranks of one pipeline, rank = stage. Collective over
  // the group when it has more than one stage: splits off the two-rank
  // group of the first and last stage that sums the tied embedding.
  explicit PipeComm(comm::Communicator& pp_group);
  ~PipeComm();
  PipeComm(const PipeComm&) = delete;
  PipeComm& operator=(const PipeComm&) = delete;

  int stage() const { return group_.rank(); }
  int stages() const { return group_.size(); }
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == stages() - 1; }

  // `count` floats each: B*T*C of one micro-batch.
  void recv_forward(float* x, std::size_t count);
  void send_forward(const float* y, std::size_t count);
  void recv_backward(float* dy, std::size_t count);
  void send_backward(const float* dx, std::size_t count);
  // 1F1B's steady state, in the order of the header comment. The two
  // micro-batches may differ in shape, hence two counts.
  void send_forward_recv_backward(const float* y, std::size_t y_count, float* dy, std::size_t dy_count);
  void send_backward_recv_forward(const float* dx, std::size_t dx_count, float* x, std::size_t x_count);

  // Sums the gradient of wte ([V, C], `count` floats) of the first and the
  // last stage, both keeping the sum, so their two copies of the tied
  // weight take the same optimizer step. Call once per step after the last
  // backward, on every stage (the others return at once). Nothing to do
  // with one stage, which holds the only copy.
  void sum_tied_embedding_grads(float* wte_grad, std::size_t count);

  // A barrier over the pipeline: the schedules open and close each step's
  // window with it, so that every stage measures its idle time over the same
  // interval, the flush included (a stage done early waits here for the
  // others). Does nothing with one stage.
  void synchronize();

  // Time spent in the calls above since construction (waiting for peers
  // included), their bus bytes (comm_meter.h: each send's bytes, the tied
  // embedding's all-reduce over its two ranks) and transport bytes, over the
  // PP group and the first and last stage's group together.
  std::chrono::duration<double> blocked() const { return traffic().blocked; }
  GroupTraffic traffic() const;
  // The PP group's meter, for the other sums over it a step makes (the
  // mesh's loss and gradient norm).
  CommMeter& meter() { return meter_; }

 private:
  void send(const float* data, std::size_t count, int peer);
  void recv(float* data, std::size_t count, int peer);

  comm::Communicator& group_;
  CommMeter meter_;
  std::unique_ptr<comm::Communicator> embedding_group_;  // first and last stage; null elsewhere
  std::unique_ptr<CommMeter> embedding_meter_;
};

}  // namespace braid::trainer
