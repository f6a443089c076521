// Private to the ibverbs transport: what its work request ids and
// immediates encode (the protocol is in transport.h).
#pragma once

#include "comm/transport/transport_only.h"

#include <cstddef>
#include <cstdint>

namespace braid::comm::ibverbs {

// wr_id: the kind of work request in the top byte, the queue pair's index
// among the peer's in the next, the peer's index in the low 32 bits.
enum class Work : std::uint64_t {
  data = 1, credit = 2, proof = 3, receive = 4, keepalive = 5, cts = 6, direct = 7, farewell = 8
};

inline std::uint64_t wr_id(Work kind, std::size_t peer, int qp = 0) {
  return (static_cast<std::uint64_t>(kind) << 56) | (static_cast<std::uint64_t>(qp & 0xff) << 48) | (peer & 0xffffffffu);
}
inline Work kind_of(std::uint64_t id) { return static_cast<Work>(id >> 56); }
inline int qp_of(std::uint64_t id) { return static_cast<int>((id >> 48) & 0xff); }
inline std::size_t peer_index_of(std::uint64_t id) { return static_cast<std::size_t>(id & 0xffffffffu); }

// What a work request of `kind` does, for error messages.
inline const char* operation(Work kind) {
  switch (kind) {
    case Work::data: return "an RDMA write of message data";
    case Work::credit: return "an RDMA write returning ring credits";
    case Work::proof: return "the set-up path proof (an 8-byte RDMA write)";
    case Work::keepalive: return "a keepalive (an 8-byte RDMA write to a peer this rank waits on)";
    case Work::cts: return "an RDMA write of a clear-to-send (a receive buffer offered for a large message)";
    case Work::direct: return "a direct RDMA write of a large message into the peer's buffer";
    case Work::farewell: return "an RDMA write telling the peer why this rank stops";
    default: return "a receive of an RDMA write with immediate";
  }
}

// Immediates. A ring piece's carries its byte count in the low 20 bits (a
// slot is under 1 MiB), the sender's count of freed slots of the opposite
// direction modulo 1024 in the next 10 (credits ride on data, transport.h),
// and kDirectHeader on the header-only piece that stands in the ring for a
// message written directly; bit 31 is never set, and the reserved values
// below all have it.
inline constexpr std::uint32_t kCreditImm = 0xffffffffu;
inline constexpr std::uint32_t kCtsImm = 0xfffffffeu;
inline constexpr std::uint32_t kStripeImm = 0xfffffffdu;
inline constexpr std::uint32_t kFarewellImm = 0xfffffffcu;
inline constexpr std::uint32_t kDirectHeader = 0x40000000u;
inline constexpr std::uint32_t kPieceBytesMask = 0x000fffffu;
inline constexpr int kPieceCreditShift = 20;
inline constexpr std::uint32_t kPieceCreditMask = 0x3ffu;

// The immediate of a ring piece of `bytes` carrying `freed` (a count of
// slots freed; only its low 10 bits travel) and `flags`.
inline std::uint32_t piece_imm(std::size_t bytes, std::uint64_t freed, std::uint32_t flags) {
  return static_cast<std::uint32_t>(bytes) | (static_cast<std::uint32_t>(freed & kPieceCreditMask) << kPieceCreditShift) |
         flags;
}

// The sender's credits once a piece carrying `imm` arrives, from `credits`
// known before and at most `slots` ahead: a fresh count is 0 .. slots ahead
// of what is known (a peer never frees more than it was sent), one already
// overtaken by a credit write's absolute count is behind and changes nothing.
inline std::uint64_t credits_after(std::uint64_t credits, std::uint32_t imm, std::uint64_t slots) {
  const std::uint64_t ahead = (((imm >> kPieceCreditShift) & kPieceCreditMask) - credits) & kPieceCreditMask;
  return ahead <= slots ? credits + ahead : credits;
}

}  // namespace braid::comm::ibverbs
