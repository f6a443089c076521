// Point-to-point calls between pipeline stages, each waited for before it
// returns (so the buffer may be reused at once), timed into blocked().
#include "trainer/strategy/pp_comm.h"

namespace braid::trainer {

PipeComm::PipeComm(comm::Communicator& pp_group) : group_(pp_group), meter_(&pp_group) {
  if (stages() == 1) return;
  const bool holds_wte = is_first_stage() || is_last_stage();
  embedding_group_ = group_.split(holds_wte ? 0 : -1, stage());
  if (embedding_group_) embedding_meter_ = std::make_unique<CommMeter>(embedding_group_.get());
}

PipeComm::~PipeComm() = default;

void PipeComm::send(const float* data, std::size_t count, int peer) {
  meter_.run([&](CommMeter::Calls& c) { return c.send(data, count, DataType::f32, peer); });
}

void PipeComm::recv(float* data, std::size_t count, int peer) {
  meter_.run([&](CommMeter::Calls& c) { return c.recv(data, count, DataType::f32, peer); });
}

GroupTraffic PipeComm::traffic() const {
  const GroupTraffic mine = meter_.snapshot();
  return embedding_meter_ ? mine + embedding_meter_->snapshot() : mine;
}

void PipeComm::recv_forward(float* x, std::size_t count) {
  if (!is_first_stage()) recv(x, count, stage() - 1);
}

void PipeComm::send_forward(const float* y, std::size_t count) {
  if (!is_last_stage()) send(y, count, stage() + 1);
}

void PipeComm::recv_backward(float* dy, std::size_t count) {
  if (!is_last_stage()) recv(dy, count, stage() + 1);
}

void PipeComm::send_backward(const float* dx, std::size_t count) {
  if (!is_first_stage()) send(dx, count, stage() - 1);
}

void PipeComm::send_forward_recv_backward(const float* y, std::size_t y_count, float* dy, std::size_t dy_count) {
  send_forward(y, y_count);
  recv_backward(dy, dy_count);
}

// The activation first, as the upstream stage sends it first (header comment).
void PipeComm::send_backward_recv_forward(const float* dx, std::size_t dx_count, float* x, std::size_t x_count) {
  recv_forward(x, x_count);
  send_backward(dx, dx_count);
}

void PipeComm::synchronize() {
  if (stages() == 1) return;
  meter_.run([](CommMeter::Calls& c) { return c.barrier(); });
}

void PipeComm::sum_tied_embedding_grads(float* wte_grad, std::size_t count) {
  if (!embedding_meter_) return;
  embedding_meter_->run([&](CommMeter::Calls& c) {
    return c.all_reduce(wte_grad, wte_grad, count, DataType::f32, ReduceOp::sum);
  });
}

}  // namespace braid::trainer
