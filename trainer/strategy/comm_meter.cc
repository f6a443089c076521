#include "trainer/strategy/comm_meter.h"

namespace braid::trainer {

GroupTraffic GroupTraffic::operator-(const GroupTraffic& e) const {
  return {bus_bytes - e.bus_bytes,
          {transport.bytes_sent - e.transport.bytes_sent, transport.bytes_received - e.transport.bytes_received},
          blocked - e.blocked};
}

GroupTraffic GroupTraffic::operator+(const GroupTraffic& o) const {
  return {bus_bytes + o.bus_bytes,
          {transport.bytes_sent + o.transport.bytes_sent, transport.bytes_received + o.transport.bytes_received},
          blocked + o.blocked};
}

double bus_bytes(comm::OpKind kind, std::size_t call_bytes, int ranks) {
  const double S = static_cast<double>(call_bytes), n = ranks;
  if (ranks <= 1) return 0.0;
  switch (kind) {
    case comm::OpKind::all_reduce: return 2.0 * (n - 1) / n * S;
    case comm::OpKind::reduce_scatter:
    case comm::OpKind::all_gather:
    case comm::OpKind::all_to_all: return (n - 1) / n * S;
    case comm::OpKind::broadcast:
    case comm::OpKind::reduce:
    case comm::OpKind::send: return S;
    case comm::OpKind::recv:
    case comm::OpKind::barrier: return 0.0;
  }
  return 0.0;
}

void CommMeter::Calls::note(comm::OpKind kind, std::size_t elements, DataType dtype) {
  meter_.bus_bytes_ += trainer::bus_bytes(kind, elements * dtype_bytes(dtype), meter_.size());
}

comm::Work CommMeter::Calls::all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                                        comm::Stream stream) {
  note(comm::OpKind::all_reduce, count, dtype);
  return meter_.comm_->all_reduce(send, recv, count, dtype, op, stream);
}

comm::Work CommMeter::Calls::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                                            ReduceOp op, comm::Stream stream) {
  note(comm::OpKind::reduce_scatter, recv_count * static_cast<std::size_t>(meter_.size()), dtype);
  return meter_.comm_->reduce_scatter(send, recv, recv_count, dtype, op, stream);
}

comm::Work CommMeter::Calls::all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype,
                                        comm::Stream stream) {
  note(comm::OpKind::all_gather, send_count * static_cast<std::size_t>(meter_.size()), dtype);
  return meter_.comm_->all_gather(send, recv, send_count, dtype, stream);
}

comm::Work CommMeter::Calls::broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                                       comm::Stream stream) {
  note(comm::OpKind::broadcast, count, dtype);
  return meter_.comm_->broadcast(send, recv, count, dtype, root, stream);
}

comm::Work CommMeter::Calls::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                                    int root, comm::Stream stream) {
  note(comm::OpKind::reduce, count, dtype);
  return meter_.comm_->reduce(send, recv, count, dtype, op, root, stream);
}

comm::Work CommMeter::Calls::send(const void* buffer, std::size_t count, DataType dtype, int peer) {
  note(comm::OpKind::send, count, dtype);
  return meter_.comm_->send(buffer, count, dtype, peer);
}

comm::Work CommMeter::Calls::recv(void* buffer, std::size_t count, DataType dtype, int peer) {
  return meter_.comm_->recv(buffer, count, dtype, peer);
}

comm::Work CommMeter::Calls::barrier() { return meter_.comm_->barrier(); }

void CommMeter::wait(comm::Work& work) {
  const auto start = std::chrono::steady_clock::now();
  work.wait();
  blocked_ += std::chrono::steady_clock::now() - start;
}

void CommMeter::wait_all(std::vector<comm::Work>& works) {
  for (comm::Work& w : works) wait(w);
  works.clear();
}

comm::TrafficStats CommMeter::traffic() const { return comm_ != nullptr ? comm_->traffic() : comm::TrafficStats{}; }

}  // namespace braid::trainer
