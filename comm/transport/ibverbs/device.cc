#include "comm/transport/ibverbs/device.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>

#include "runtime/errors.h"

namespace braid::comm::ibverbs {
namespace {

bool is_zero(const std::array<std::uint8_t, 16>& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}

bool is_ipv4_mapped(const std::array<std::uint8_t, 16>& gid) {
  return std::all_of(gid.begin(), gid.begin() + 10, [](std::uint8_t b) { return b == 0; }) && gid[10] == 0xff &&
         gid[11] == 0xff;
}

bool is_link_local(const std::array<std::uint8_t, 16>& gid) { return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80; }

// Higher is better; the order of the header's comment.
int score(const GidEntry& e) {
  if (e.kind == GidKind::roce_v2) return is_ipv4_mapped(e.gid) ? 6 : is_link_local(e.gid) ? 4 : 5;
  if (e.kind == GidKind::ib) return 3;
  return is_ipv4_mapped(e.gid) ? 2 : 1;
}

const char* describe(const GidEntry& e) {
  switch (score(e)) {
    case 6: return "RoCE v2 with an IPv4-mapped address (preferred: routed like the host's IPv4 network)";
    case 5: return "RoCE v2 with a global IPv6 address (no IPv4-mapped RoCE v2 GID is present)";
    case 4: return "RoCE v2 with a link-local address (no routable RoCE v2 GID is present: peers must share the L2 segment)";
    case 3: return "InfiniBand";
    default: return "RoCE v1 (no RoCE v2 GID is present)";
  }
}

std::string where(const GidEntry& e) {
  return e.device + " port " + std::to_string(e.port) + " GID index " + std::to_string(e.index) + " (" +
         gid_text(e.gid) + ")";
}

std::string offered(const std::vector<GidEntry>& table) {
  std::string list;
  for (const auto& e : table) list += (list.empty() ? "" : "; ") + where(e) + (e.port_active ? "" : " [port down]");
  return list.empty() ? "no verbs device with a GID" : list;
}

// Splits "name[:port]"; port 0 means any.
std::pair<std::string, int> parse_hca(const std::string& hca, int rank) {
  auto colon = hca.find(':');
  if (colon == std::string::npos) return {hca, 0};
  const std::string port = hca.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 3)
    throw InvalidUsage("rank " + std::to_string(rank) + ": BRAID_IB_HCA='" + hca +
                       "' is invalid: expected a device name with an optional :port, such as mlx5_0:1");
  return {hca.substr(0, colon), std::stoi(port)};
}

}  // namespace

std::string gid_text(const std::array<std::uint8_t, 16>& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.data(), text, sizeof text);
  return text;
}

GidChoice choose_gid(const std::vector<GidEntry>& table, const GidRequest& request, int rank) {
  const std::string me = "rank " + std::to_string(rank);
  auto [device, port] = request.hca.empty() ? std::pair<std::string, int>{} : parse_hca(request.hca, rank);
  std::vector<GidEntry> fits;
  for (const auto& e : table) {
    if (is_zero(e.gid) || !e.port_active) continue;
    if (!device.empty() && e.device != device) continue;
    if (port != 0 && e.port != port) continue;
    if (request.gid_index >= 0 && e.index != request.gid_index) continue;
    fits.push_back(e);
  }
  if (fits.empty()) {
    std::string asked = "an active port with a GID";
    if (!request.hca.empty()) asked += " on BRAID_IB_HCA=" + request.hca;
    if (request.gid_index >= 0) asked += " at BRAID_IB_GID_INDEX=" + std::to_string(request.gid_index);
    throw InvalidUsage(me + " found no usable RDMA device: it needs " + asked + ", and this host offers: " +
                       offered(table) + ". Set BRAID_IB_HCA / BRAID_IB_GID_INDEX to one of those (or unset them), " +
                       "or use BRAID_TRANSPORT=auto or tcp");
  }
  // max_element keeps the first of equals: the first device, lowest index.
  auto best = std::max_element(fits.begin(), fits.end(),
                          [](const GidEntry& a, const GidEntry& b) { return score(a) < score(b); });
  std::string why = request.gid_index >= 0 ? "BRAID_IB_GID_INDEX=" + std::to_string(request.gid_index) + " (" +
                                                 describe(*best) + ")"
                                           : std::string(describe(*best));
  if (!request.hca.empty()) why += ", on BRAID_IB_HCA=" + request.hca;
  return {*best, me + " uses " + where(*best) + ": " + why};
}

namespace {

GidKind kind_of(const ibv_port_attr& port, const ibv_gid_entry& entry) {
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET) return GidKind::ib;
  return entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? GidKind::roce_v2 : GidKind::roce_v1;
}

void probe_device(ibv_device* device, std::vector<GidEntry>& table) {
  ibv_context* context = ibv_open_device(device);
  if (!context) return;
  ibv_device_attr attr{};
  if (ibv_query_device(context, &attr) == 0)
    for (int port = 1; port <= attr.phys_port_cnt; ++port) {
      ibv_port_attr port_attr{};
      if (ibv_query_port(context, static_cast<std::uint8_t>(port), &port_attr) != 0) continue;
      for (int index = 0; index < port_attr.gid_tbl_len; ++index) {
        ibv_gid_entry entry{};
        if (ibv_query_gid_ex(context, static_cast<std::uint32_t>(port), static_cast<std::uint32_t>(index), &entry, 0))
          continue;  // an empty slot of the table
        GidEntry e{ibv_get_device_name(device), port, index, {}, kind_of(port_attr, entry),
                   port_attr.state == IBV_PORT_ACTIVE};
        std::copy(entry.gid.raw, entry.gid.raw + 16, e.gid.begin());
        if (!is_zero(e.gid)) table.push_back(e);
      }
    }
  ibv_close_device(context);
}

}  // namespace

std::vector<GidEntry> probe_gid_table() {
  std::vector<GidEntry> table;
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (!devices) return table;
  for (int i = 0; i < count; ++i) probe_device(devices[i], table);
  ibv_free_device_list(devices);
  return table;
}

}  // namespace braid::comm::ibverbs
