// The message header every transport puts in front of every segment, and
// the check every receiver applies to it.
//
// A header carries the sender's whole call signature (communicator, op
// sequence number, op kind, dtype, reduce op, count, root, the algorithm
// that runs it) plus the position
// of the segment in the algorithm's schedule (step, segment) and the payload
// length. The receiver builds the header it expects from its own call and
// compares: a peer that called another collective, or the same one with
// another count, dtype, op or root, is reported with both calls named, one
// that runs the same call with another algorithm with both algorithms
// named; a header that is not a braid header at all is reported as garbage. A
// mismatched message always fails the operation before any of its payload
// reaches the caller's memory (the TCP transport reads a small message
// whole into staging and a large one's header alone first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/types.h"

namespace braid::comm {

inline constexpr std::uint32_t kWireMagic = 0x4d445242;  // "BRDM"
inline constexpr std::uint16_t kWireVersion = 2;  // 2: the algorithm byte

struct WireHeader {
  std::uint32_t magic = kWireMagic;
  std::uint16_t version = kWireVersion;
  std::uint8_t kind = 0;       // OpKind
  std::uint8_t dtype = 0;      // DataType
  std::uint8_t reduce_op = 0;  // ReduceOp
  std::uint8_t algorithm = 0;  // algorithm_id
  std::uint8_t reserved[2] = {0, 0};
  std::int32_t root = -1;
  std::uint32_t comm_id = 0;
  std::uint32_t step = 0;
  std::uint32_t segment = 0;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::uint64_t payload_bytes = 0;
};
static_assert(sizeof(WireHeader) == 56, "the wire header layout is part of the protocol");

// The header a rank sends for `op`; for point-to-point ops `root` becomes the
// destination so that the receiver, whose own op names the source, can check it.
WireHeader make_header(std::uint32_t comm_id, const Op& op, int my_rank, int peer,
                       std::uint32_t step, std::uint32_t segment, std::uint64_t payload_bytes);

// The header a rank expects from `peer` while running `op`.
WireHeader expected_header(std::uint32_t comm_id, const Op& op, int my_rank, int peer,
                           std::uint32_t step, std::uint32_t segment, std::uint64_t payload_bytes);

// Empty when `got` matches `expected`; otherwise a full sentence naming both
// ranks and both calls, or calling the bytes garbage.
std::string header_mismatch(const WireHeader& expected, const WireHeader& got, int my_rank, int peer);
// The call a header names (kind, dtype, op, count, root, seq), for messages.
Op op_of(const WireHeader& header);

}  // namespace braid::comm
