#include "comm/wire.h"

namespace braid::comm {

Op op_of(const WireHeader& h) {
  Op op;
  op.kind = static_cast<OpKind>(h.kind);
  op.dtype = static_cast<DataType>(h.dtype);
  op.reduce_op = static_cast<ReduceOp>(h.reduce_op);
  op.count = h.count;
  op.root = h.root;
  op.seq = h.seq;
  return op;
}

namespace {

bool same_call(const WireHeader& a, const WireHeader& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.count == b.count && a.root == b.root && a.seq == b.seq;
}

}  // namespace

WireHeader make_header(std::uint32_t comm_id, const Op& op, int my_rank, int peer,
                       std::uint32_t step, std::uint32_t segment, std::uint64_t payload_bytes) {
  WireHeader h;
  h.kind = static_cast<std::uint8_t>(op.kind);
  h.dtype = static_cast<std::uint8_t>(op.dtype);
  h.reduce_op = static_cast<std::uint8_t>(op.reduce_op);
  h.algorithm = op.algorithm;
  h.root = op.root;
  h.comm_id = comm_id;
  h.step = step;
  h.segment = segment;
  h.seq = op.seq;
  h.count = op.count;
  h.payload_bytes = payload_bytes;
  if (op.kind == OpKind::send) h.root = peer;  // the destination
  return h;
}

WireHeader expected_header(std::uint32_t comm_id, const Op& op, int my_rank, int peer,
                           std::uint32_t step, std::uint32_t segment, std::uint64_t payload_bytes) {
  WireHeader h = make_header(comm_id, op, my_rank, peer, step, segment, payload_bytes);
  if (op.kind == OpKind::recv) {  // the sender called send(.., peer = me)
    h.kind = static_cast<std::uint8_t>(OpKind::send);
    h.root = my_rank;
  }
  return h;
}

std::string header_mismatch(const WireHeader& expected, const WireHeader& got, int my_rank, int peer) {
  // Every message of every call passes here: the match builds no string.
  if (got.magic == kWireMagic && got.version == kWireVersion && got.comm_id == expected.comm_id &&
      same_call(expected, got) && got.algorithm == expected.algorithm && got.step == expected.step &&
      got.segment == expected.segment && got.payload_bytes == expected.payload_bytes)
    return {};
  std::string me = "rank " + std::to_string(my_rank);
  std::string them = "rank " + std::to_string(peer);
  if (got.magic != kWireMagic || got.version != kWireVersion)
    return me + " received bytes from " + them +
           " that are not a braid message header (garbage, or a peer of another braid version)";
  if (got.comm_id != expected.comm_id)
    return me + " received a message of another communicator from " + them +
           "; both ranks must create and split communicators in the same order";
  if (!same_call(expected, got)) {
    Op mine = op_of(expected), theirs = op_of(got);
    // A receive expects its sender's header (expected_header): "send to
    // me" is this rank's recv from `peer`, whatever the peer called.
    if (mine.kind == OpKind::send && mine.root == my_rank) {
      mine.kind = OpKind::recv;
      mine.root = peer;
    }
    return "mismatched collectives: " + me + " called " + describe(mine) + " but " + them +
           " called " + describe(theirs) + "; every rank must issue the same collectives in the same order";
  }
  if (got.algorithm != expected.algorithm)
    return "mismatched collectives: " + me + " runs " + describe(op_of(expected)) + " with " +
           algorithm_name(expected.algorithm) + ", " + them + " with " + algorithm_name(got.algorithm) +
           "; set BRAID_ALGO alike on every rank, and give every rank registered buffers (Communicator::allocate) "
           "or none, counting every buffer a rank passes (a send buffer of a broadcast on the ranks other than the "
           "root too)" + list_form_note(op_of(expected).kind);
  if (got.step != expected.step || got.segment != expected.segment ||
      got.payload_bytes != expected.payload_bytes)
    return me + " received an out-of-order message from " + them + " (step " + std::to_string(got.step) +
           " segment " + std::to_string(got.segment) + ", " + std::to_string(got.payload_bytes) +
           " bytes; expected step " + std::to_string(expected.step) + " segment " +
           std::to_string(expected.segment) + ", " + std::to_string(expected.payload_bytes) +
           " bytes): the peers disagree on the algorithm or its settings (BRAID_SEGMENT_BYTES, BRAID_CHUNK_BYTES, BRAID_ALGO)";
  return {};
}

}  // namespace braid::comm
