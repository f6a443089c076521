// The public calls. Each builds an Op, passes the one validate(), and goes
// through the one submit(): ten collectives, one copy of the checking code.
#include "comm/communicator.h"

#include <limits>

#include "comm/communicator_impl.h"
#include "runtime/errors.h"

namespace braid::comm {
namespace {

std::size_t buffer_elements(const Op& op, int size) {
  switch (op.kind) {
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
    case OpKind::all_to_all: return op.count * static_cast<std::size_t>(size);
    default: return op.count;
  }
}

bool needs_send_buffer(const Op& op, int rank) {
  switch (op.kind) {
    case OpKind::recv:
    case OpKind::barrier: return false;
    case OpKind::broadcast: return rank == op.root;
    default: return true;
  }
}

bool needs_recv_buffer(const Op& op, int rank) {
  switch (op.kind) {
    case OpKind::send:
    case OpKind::barrier: return false;
    case OpKind::reduce: return rank == op.root;
    default: return true;
  }
}

void validate(const Op& op, int rank, int size) {
  std::string call = "rank " + std::to_string(rank) + ", " + std::string(name(op.kind)) + ": ";
  if (!is_valid(op.dtype)) throw InvalidUsage(call + "unknown DataType " + std::to_string(int(op.dtype)));
  if (!is_valid(op.reduce_op)) throw InvalidUsage(call + "unknown ReduceOp " + std::to_string(int(op.reduce_op)));
  bool rooted = op.kind == OpKind::broadcast || op.kind == OpKind::reduce;
  bool p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
  if ((rooted || p2p) && (op.root < 0 || op.root >= size))
    throw InvalidUsage(call + (p2p ? "peer " : "root ") + std::to_string(op.root) + " is out of range [0, " +
                       std::to_string(size) + ")");
  if (p2p && op.root == rank) throw InvalidUsage(call + "a rank cannot send to or receive from itself");
  std::size_t limit = std::numeric_limits<std::size_t>::max() / 8 / static_cast<std::size_t>(size);
  if (op.count > limit)
    throw InvalidUsage(call + "count " + std::to_string(op.count) + " overflows the buffer size");
  if (buffer_elements(op, size) == 0) return;
  if (needs_send_buffer(op, rank) && !op.send) throw InvalidUsage(call + "send buffer is null with count > 0");
  if (needs_recv_buffer(op, rank) && !op.recv) throw InvalidUsage(call + "receive buffer is null with count > 0");
}

Op make(OpKind kind, const void* send, void* recv, std::size_t count, DataType dtype,
        ReduceOp reduce_op = ReduceOp::sum, int root = -1) {
  Op op;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.dtype = dtype;
  op.reduce_op = reduce_op;
  op.root = root;
  return op;
}

}  // namespace

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }

Work Communicator::submit(Op op) {
  validate(op, impl_->rank, impl_->size);
  return Work(impl_->enqueue(op));
}

Work Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op) {
  return submit(make(OpKind::all_reduce, send, recv, count, dtype, op));
}

Work Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                                  ReduceOp op) {
  return submit(make(OpKind::reduce_scatter, send, recv, recv_count, dtype, op));
}

Work Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype) {
  return submit(make(OpKind::all_gather, send, recv, send_count, dtype));
}

Work Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root) {
  return submit(make(OpKind::broadcast, send, recv, count, dtype, ReduceOp::sum, root));
}

Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                          int root) {
  return submit(make(OpKind::reduce, send, recv, count, dtype, op, root));
}

Work Communicator::send(const void* buffer, std::size_t count, DataType dtype, int peer) {
  return submit(make(OpKind::send, buffer, nullptr, count, dtype, ReduceOp::sum, peer));
}

Work Communicator::recv(void* buffer, std::size_t count, DataType dtype, int peer) {
  return submit(make(OpKind::recv, nullptr, buffer, count, dtype, ReduceOp::sum, peer));
}

Work Communicator::all_to_all(const void* send, void* recv, std::size_t count_per_peer, DataType dtype) {
  return submit(make(OpKind::all_to_all, send, recv, count_per_peer, dtype));
}

Work Communicator::barrier() { return submit(make(OpKind::barrier, nullptr, nullptr, 0, DataType::u8)); }

TrafficStats Communicator::traffic() const {
  TrafficStats stats;
  for (const auto& t : impl_->transports) {
    stats.bytes_sent += t->bytes_sent();
    stats.bytes_received += t->bytes_received();
  }
  return stats;
}

std::string Communicator::transport_summary() const {
  std::string summary;
  for (const auto& t : impl_->transports) summary += (summary.empty() ? "" : "+") + std::string(t->name());
  return summary.empty() ? "none" : summary;
}

}  // namespace braid::comm
