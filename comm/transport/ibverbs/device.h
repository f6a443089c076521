// Which verbs device, port and GID this rank uses (private to the ibverbs
// transport).
//
// The choice is a pure function over a table of GID entries, so it is tested
// without a device: BRAID_IB_HCA (name[:port]) and BRAID_IB_GID_INDEX narrow
// the table; among what is left, an active port's RoCE v2 GID holding an
// IPv4-mapped address wins (routable like the host's IPv4 network), then a
// RoCE v2 global IPv6 address, then a link-local one (one L2 segment only),
// then RoCE v1 and InfiniBand GIDs; ties go to the first device and the
// lowest index. probe_gid_table() reads the real table from libibverbs.
#pragma once

#include "comm/transport/transport_only.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::comm::ibverbs {

enum class GidKind : std::uint8_t { ib, roce_v1, roce_v2 };

struct GidEntry {
  std::string device;
  int port = 1;
  int index = 0;
  std::array<std::uint8_t, 16> gid{};
  GidKind kind = GidKind::roce_v2;
  bool port_active = true;
};

// BRAID_IB_HCA and BRAID_IB_GID_INDEX as given (empty / -1: not given).
struct GidRequest {
  std::string hca;
  int gid_index = -1;
};

struct GidChoice {
  GidEntry entry;
  std::string reason;  // one sentence for the info log
};

// Throws InvalidUsage naming `rank`, what was asked, what the table offers
// and the remedy when nothing fits.
GidChoice choose_gid(const std::vector<GidEntry>& table, const GidRequest& request, int rank);

// "fe80::1", "::ffff:10.0.0.1": the GID as an address.
std::string gid_text(const std::array<std::uint8_t, 16>& gid);

// Every non-zero GID of every port of every verbs device on this host.
// Empty when there is no device (or no driver).
std::vector<GidEntry> probe_gid_table();

}  // namespace braid::comm::ibverbs
