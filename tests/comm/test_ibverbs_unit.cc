// The ibverbs transport's pure parts, no device needed: the device, port
// and GID choice (comm/transport/ibverbs/device.h) over GID tables, and the
// checks of the direct-write protocol (direct.cc).
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include "comm/transport/ibverbs/device.h"
#include "comm/transport/ibverbs/ids.h"
#include "comm/transport/ibverbs/transport.h"
#include "runtime/errors.h"

using namespace braid::comm::ibverbs;
using Catch::Matchers::Contains;

namespace {

GidEntry entry(const char* device, int port, int index, const char* address, GidKind kind = GidKind::roce_v2,
               bool active = true) {
  GidEntry e;
  e.device = device;
  e.port = port;
  e.index = index;
  e.kind = kind;
  e.port_active = active;
  REQUIRE(inet_pton(AF_INET6, address, e.gid.data()) == 1);
  return e;
}

// A typical ConnectX RoCE port: v1 and v2 of link-local, IPv4-mapped and global addresses.
std::vector<GidEntry> roce_table() {
  return {entry("mlx5_0", 1, 0, "fe80::1", GidKind::roce_v1), entry("mlx5_0", 1, 1, "fe80::1"),
          entry("mlx5_0", 1, 2, "::ffff:10.0.0.1", GidKind::roce_v1), entry("mlx5_0", 1, 3, "::ffff:10.0.0.1"),
          entry("mlx5_0", 1, 4, "2001:db8::1", GidKind::roce_v1), entry("mlx5_0", 1, 5, "2001:db8::1")};
}

}  // namespace

TEST_CASE("ibverbs GID choice prefers RoCE v2 IPv4-mapped, then global IPv6, then link-local", "[ibverbs]") {
  auto table = roce_table();
  auto choice = choose_gid(table, {}, 0);
  CHECK(choice.entry.index == 3);
  CHECK_THAT(choice.reason, Contains("IPv4-mapped") && Contains("mlx5_0 port 1 GID index 3"));
  table.erase(table.begin() + 3);
  CHECK(choose_gid(table, {}, 0).entry.index == 5);
  table.pop_back();
  choice = choose_gid(table, {}, 0);
  CHECK(choice.entry.index == 1);
  CHECK_THAT(choice.reason, Contains("link-local"));
}

TEST_CASE("ibverbs GID choice: soft-RoCE's single link-local GID is chosen", "[ibverbs]") {
  auto choice = choose_gid({entry("rxe0", 1, 0, "fe80::a8bb:ccff:fedd:1")}, {}, 3);
  CHECK(choice.entry.device == "rxe0");
  CHECK(choice.entry.index == 0);
  CHECK_THAT(choice.reason, Contains("rank 3"));
}

TEST_CASE("ibverbs GID choice: BRAID_IB_HCA and BRAID_IB_GID_INDEX override", "[ibverbs]") {
  auto table = roce_table();
  auto second = roce_table();
  for (auto& e : second) e.device = "mlx5_1";
  table.insert(table.end(), second.begin(), second.end());
  CHECK(choose_gid(table, {}, 0).entry.device == "mlx5_0");  // ties go to the first device
  CHECK(choose_gid(table, {"mlx5_1", -1}, 0).entry.device == "mlx5_1");
  CHECK(choose_gid(table, {"mlx5_1:1", -1}, 0).entry.index == 3);
  auto forced = choose_gid(table, {"", 0}, 0);
  CHECK(forced.entry.index == 0);
  CHECK(forced.entry.kind == GidKind::roce_v1);
  CHECK_THAT(forced.reason, Contains("BRAID_IB_GID_INDEX=0"));
}

TEST_CASE("ibverbs GID choice refuses what the host does not offer, naming it and the remedy", "[ibverbs]") {
  std::vector<GidEntry> rxe = {entry("rxe0", 1, 0, "fe80::1")};
  auto refused = [&](const GidRequest& request, const std::string& text) {
    CHECK_THROWS_AS(choose_gid(rxe, request, 1), braid::InvalidUsage);
    CHECK_THROWS_WITH(choose_gid(rxe, request, 1),
                      Contains("rank 1") && Contains(text) && Contains("BRAID_IB_GID_INDEX"));
  };
  refused({"", 1}, "BRAID_IB_GID_INDEX=1");
  refused({"mlx5_0", -1}, "BRAID_IB_HCA=mlx5_0");
  refused({"rxe0:2", -1}, "rxe0 port 1 GID index 0");
  CHECK_THROWS_WITH(choose_gid(rxe, {"rxe0:x", -1}, 1), Contains("rank 1") && Contains("BRAID_IB_HCA='rxe0:x'"));
  CHECK_THROWS_AS(choose_gid({}, {}, 0), braid::InvalidUsage);
  CHECK_THROWS_AS(choose_gid({entry("rxe0", 1, 0, "fe80::1", GidKind::roce_v2, false)}, {}, 0), braid::InvalidUsage);
  CHECK_THROWS_AS(choose_gid({entry("rxe0", 1, 0, "::")}, {}, 0), braid::InvalidUsage);
}

// The sender's check of a receiver's clear-to-send (comm/transport/ibverbs/
// direct.cc): the payload must lie within the registration the receiver
// advertises, or nothing is written and the peer is named.
TEST_CASE("ibverbs: a clear-to-send beyond its advertised registration is refused", "[ibverbs]") {
  Cts cts;
  cts.region_base = 0x10000;
  cts.region_bytes = 0x4000;
  cts.address = 0x11000;
  cts.offer = 1;
  CHECK(advertised_range_error(cts, 0x3000, 0, 1).empty());  // ends exactly at the region's end
  CHECK_THAT(advertised_range_error(cts, 0x3001, 0, 1),
             Contains("rank 0 refused a receive buffer rank 1 advertised") && Contains("12289 bytes") &&
                 Contains("within its registration of 16384 bytes"));
  cts.address = 0xf000;  // starts before the region
  CHECK_FALSE(advertised_range_error(cts, 16, 2, 3).empty());
  cts.address = 0x11000;
  cts.region_base = ~std::uint64_t{0} - 0x100;  // a region that wraps around the address space
  CHECK_FALSE(advertised_range_error(cts, 16, 0, 1).empty());
  cts.region_base = 0x10000;
  cts.region_bytes = 0x10;  // smaller than the payload
  CHECK_FALSE(advertised_range_error(cts, 0x20, 0, 1).empty());
}

TEST_CASE("ibverbs: large messages stripe over at most BRAID_IB_QPS_PER_PEER queue pairs, 64 KiB each at least",
          "[ibverbs]") {
  CHECK(stripes_of(64u << 10, 4) == 1);
  CHECK(stripes_of((64u << 10) + 1, 4) == 2);
  CHECK(stripes_of(1u << 20, 4) == 4);
  CHECK(stripes_of(1u << 20, 1) == 1);
  CHECK(stripes_of(1u << 30, 8) == 8);
}

TEST_CASE("ibverbs: credits ride on ring pieces' immediates, 10 bits of the freed count", "[ibverbs]") {
  using namespace braid::comm::ibverbs;
  const std::uint64_t slots = 8;
  // Byte count, credit count and the direct-header flag come back apart; no
  // piece's immediate can be mistaken for a reserved one (bit 31).
  const std::uint32_t imm = piece_imm(266240, 1027, kDirectHeader);
  CHECK((imm & kPieceBytesMask) == 266240);
  CHECK((imm & kDirectHeader) != 0);
  CHECK((imm & 0x80000000u) == 0);
  CHECK(piece_imm(kPieceBytesMask, ~std::uint64_t{0}, kDirectHeader) != kCreditImm);
  // A fresh count is 0 .. slots ahead of what the sender knows, across the
  // 10-bit wrap as well.
  CHECK(credits_after(1020, piece_imm(8, 1020, 0), slots) == 1020);
  CHECK(credits_after(1020, piece_imm(8, 1025, 0), slots) == 1025);
  CHECK(credits_after(5000, piece_imm(8, 5008, 0), slots) == 5008);
  // A count behind what a credit write already told (it was overtaken) changes nothing.
  CHECK(credits_after(5008, piece_imm(8, 5003, 0), slots) == 5008);
  CHECK(credits_after(1025, piece_imm(8, 1020, 0), slots) == 1025);
}
