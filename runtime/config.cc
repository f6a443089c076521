#include "runtime/config.h"

#include <cstdlib>
#include <stdexcept>

#include "runtime/errors.h"

namespace braid::runtime {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value && *value) ? value : nullptr;
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& allowed) {
  throw InvalidUsage(std::string("environment variable ") + name + "='" + value +
                     "' is invalid: expected " + allowed);
}

std::string one_of(const char* name, const std::string& fallback,
                   std::initializer_list<const char*> allowed) {
  const char* value = env(name);
  if (!value) return fallback;
  std::string list;
  for (const char* a : allowed) {
    if (value == std::string(a)) return value;
    list += (list.empty() ? "" : "|") + std::string(a);
  }
  bad(name, value, list);
}

std::size_t bytes_in_range(const char* name, std::size_t fallback, std::size_t lo, std::size_t hi) {
  const char* value = env(name);
  if (!value) return fallback;
  std::size_t parsed = 0;
  try {
    parsed = parse_bytes(value);
  } catch (const InvalidUsage&) {
    bad(name, value, "a byte count such as 4096, 256K or 4M");
  }
  if (parsed < lo || parsed > hi)
    bad(name, value, "between " + std::to_string(lo) + " and " + std::to_string(hi) + " bytes");
  return parsed;
}

int int_in_range(const char* name, int fallback, int lo, int hi) {
  const char* value = env(name);
  if (!value) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < lo || parsed > hi)
    bad(name, value, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return static_cast<int>(parsed);
}

}  // namespace

Config read_config() {
  Config c;
  c.log_level = one_of("BRAID_LOG_LEVEL", c.log_level,
                       {"trace", "debug", "info", "warn", "error", "off"});
  // At least 1 ms: a smaller positive value rounded down to 0 ms, and
  // every wait failed at once.
  if (const char* t = env("BRAID_TIMEOUT")) {
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    if (*end != '\0' || !(seconds >= 0.001) || seconds > 1e7)
      bad("BRAID_TIMEOUT", t, "seconds from 0.001 to 1e7 (about 116 days)");
    c.timeout = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  }
  if (const char* a = env("BRAID_BIND_ADDR")) c.bind_addr = a;
  c.transport = one_of("BRAID_TRANSPORT", c.transport, {"auto", "tcp", "shm", "ibverbs"});
  if (const char* h = env("BRAID_IB_HCA")) c.ib_hca = h;
  c.ib_gid_index = int_in_range("BRAID_IB_GID_INDEX", c.ib_gid_index, -1, 255);
  c.ib_qps_per_peer = int_in_range("BRAID_IB_QPS_PER_PEER", c.ib_qps_per_peer, 1, 8);
  c.algo = one_of("BRAID_ALGO", c.algo,
                  {"auto", "ring", "recursive_doubling", "binomial", "pipelined", "oneshot", "direct"});
  c.direct_workers = one_of("BRAID_DIRECT_WORKERS", c.direct_workers, {"auto", "all", "one"});
  c.tcp_nsocks = int_in_range("BRAID_TCP_NSOCKS", c.tcp_nsocks, 1, 16);
  // Below 64 KiB a socket's window cannot hold one loopback segment (MSS
  // 65483): Linux then moves data only on its persist timer, one 256 KiB
  // all_reduce took seconds at 8K, and no wait timed out to say why.
  c.socket_buffer_bytes =
      bytes_in_range("BRAID_SOCKET_BUFFER_BYTES", c.socket_buffer_bytes, 64u << 10, 1u << 30);
  c.segment_bytes = bytes_in_range("BRAID_SEGMENT_BYTES", c.segment_bytes, 4096, 1u << 30);
  c.chunk_bytes = bytes_in_range("BRAID_CHUNK_BYTES", c.chunk_bytes, 0, std::size_t{1} << 40);
  c.stream_bytes = bytes_in_range("BRAID_STREAM_BYTES", c.stream_bytes, 0, std::size_t{1} << 40);
  c.inline_bytes = bytes_in_range("BRAID_INLINE_BYTES", c.inline_bytes, 0, 1u << 30);
  if (const char* h = env("BRAID_HOST_ID")) c.host_id = h;
  c.shm_ring_bytes = bytes_in_range("BRAID_SHM_RING_BYTES", c.shm_ring_bytes, 64u << 10, 1u << 30);
  c.shm_host_bytes = bytes_in_range("BRAID_SHM_HOST_BYTES", c.shm_host_bytes, 1u << 20, std::size_t{1} << 40);
  c.spin_us = int_in_range("BRAID_SPIN_US", 20, 0, 10000);
  c.cuda_gate = one_of("BRAID_CUDA_GATE", c.cuda_gate, {"auto", "kernel", "wait", "host", "event", "flag"});
  c.store_max_bytes =
      bytes_in_range("BRAID_STORE_MAX_BYTES", c.store_max_bytes, 1u << 20, std::size_t{1} << 40);
  return c;
}

std::size_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  if (text.empty() || text[0] < '0' || text[0] > '9') throw InvalidUsage("'" + text + "' is not a byte count");
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw InvalidUsage("'" + text + "' is not a byte count");
  }
  std::string suffix = text.substr(pos);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") shift = 30;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB") shift = 40;  // the ranges' own bounds read 1T
  else if (!suffix.empty() && suffix != "B") throw InvalidUsage("'" + text + "' has an unknown unit");
  if (value > (~0ull >> shift)) throw InvalidUsage("'" + text + "' is too large");
  return static_cast<std::size_t>(value << shift);
}

const Config& config() {
  static const Config c = read_config();
  return c;
}

}  // namespace braid::runtime
