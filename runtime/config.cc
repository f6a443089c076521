#include "runtime/config.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "runtime/decimal.h"
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

// The settings' allowed values, read by read_config() from the
// environment and checked by validate() on a Config made in code.
struct Choice {
  const char* var;
  const char* field;
  std::string Config::*member;
  std::initializer_list<const char*> allowed;
};
struct Bytes {
  const char* var;
  const char* field;
  std::size_t Config::*member;
  std::size_t lo, hi;
  // The least a Config made in code may hold, where the code runs with
  // less than the environment is allowed to ask (tests' 4 KiB rings wrap
  // every few messages); lo where 0.
  std::size_t code_lo = 0;
  // 0 is allowed besides [lo, hi]: it turns the setting off.
  bool zero_off = false;
};
struct Int {
  const char* var;
  const char* field;
  int Config::*member;
  int lo, hi;
};

// Below 64 KiB a socket's window cannot hold one loopback segment (MSS
// 65483): Linux then moves data only on its persist timer, one 256 KiB
// all_reduce took seconds at 8K, and no wait timed out to say why.
const Choice kChoices[] = {
    {"BRAID_LOG_LEVEL", "log_level", &Config::log_level, {"trace", "debug", "info", "warn", "error", "off"}},
    {"BRAID_TRANSPORT", "transport", &Config::transport, {"auto", "tcp", "shm", "ibverbs"}},
    {"BRAID_ALGO", "algo", &Config::algo,
     {"auto", "ring", "recursive_doubling", "binomial", "pipelined", "oneshot", "direct"}},
    {"BRAID_DIRECT_WORKERS", "direct_workers", &Config::direct_workers, {"auto", "all", "one"}},
    {"BRAID_CUDA_GATE", "cuda_gate", &Config::cuda_gate, {"auto", "kernel", "wait", "host", "event", "flag"}},
};
const Bytes kBytes[] = {
    {"BRAID_SOCKET_BUFFER_BYTES", "socket_buffer_bytes", &Config::socket_buffer_bytes, 64u << 10, 1u << 30},
    {"BRAID_SEGMENT_BYTES", "segment_bytes", &Config::segment_bytes, 4096, 1u << 30},
    // 0: one round. Under a segment's least, chunks of a few elements made
    // a 4 MiB all_reduce take seconds (4 bytes: past a 20 s timeout that
    // did not name the setting), and one under the element size meant one
    // round for some types only (a review helper's cases).
    {"BRAID_CHUNK_BYTES", "chunk_bytes", &Config::chunk_bytes, 4096, std::size_t{1} << 40, 0, true},
    {"BRAID_STREAM_BYTES", "stream_bytes", &Config::stream_bytes, 0, std::size_t{1} << 40},
    {"BRAID_INLINE_BYTES", "inline_bytes", &Config::inline_bytes, 0, 1u << 30},
    {"BRAID_SHM_RING_BYTES", "shm_ring_bytes", &Config::shm_ring_bytes, 64u << 10, 1u << 30, 4096},
    {"BRAID_SHM_HOST_BYTES", "shm_host_bytes", &Config::shm_host_bytes, 1u << 20, std::size_t{1} << 40},
    {"BRAID_STORE_MAX_BYTES", "store_max_bytes", &Config::store_max_bytes, 1u << 20, std::size_t{1} << 40},
};
const Int kInts[] = {
    {"BRAID_IB_GID_INDEX", "ib_gid_index", &Config::ib_gid_index, -1, 255},
    {"BRAID_IB_QPS_PER_PEER", "ib_qps_per_peer", &Config::ib_qps_per_peer, 1, 8},
    {"BRAID_TCP_NSOCKS", "tcp_nsocks", &Config::tcp_nsocks, 1, 16},
    {"BRAID_SPIN_US", "spin_us", &Config::spin_us, 0, 10000},
};
// BRAID_TIMEOUT, in seconds: at least 1 ms (a smaller positive value
// rounded down to 0 ms, and every wait failed at once).
constexpr double kTimeoutLo = 0.001, kTimeoutHi = 1e7;
const char* const kTimeoutRange = "seconds from 0.001 to 1e7 (about 116 days)";

std::string list_of(std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : "|") + std::string(a);
  return list;
}

std::string between(std::size_t lo, std::size_t hi, const char* unit) {
  return "between " + std::to_string(lo) + " and " + std::to_string(hi) + unit;
}

bool in_range(const Bytes& b, std::size_t value, std::size_t lo) {
  return (b.zero_off && value == 0) || (value >= lo && value <= b.hi);
}

std::string range_of(const Bytes& b, std::size_t lo) {
  return (b.zero_off ? "0 (off) or " : "") + between(lo, b.hi, " bytes");
}

}  // namespace

Config read_config() {
  Config c;
  for (const Choice& choice : kChoices) {
    const char* value = env(choice.var);
    if (!value) continue;
    bool known = false;
    for (const char* a : choice.allowed) known = known || value == std::string(a);
    if (!known) bad(choice.var, value, list_of(choice.allowed));
    c.*choice.member = value;
  }
  for (const Bytes& b : kBytes) {
    const char* value = env(b.var);
    if (!value) continue;
    std::size_t parsed = 0;
    try {
      parsed = parse_bytes(value);
    } catch (const InvalidUsage&) {
      bad(b.var, value, "a byte count such as 4096, 256K or 4M");
    }
    if (!in_range(b, parsed, b.lo)) bad(b.var, value, range_of(b, b.lo));
    c.*b.member = parsed;
  }
  for (const Int& i : kInts) {
    const char* value = env(i.var);
    if (!value) continue;
    char* end = nullptr;
    long parsed = std::strtol(value, &end, 10);
    if (!is_decimal_integer(value) || *end != '\0' || parsed < i.lo || parsed > i.hi)
      bad(i.var, value, "an integer from " + std::to_string(i.lo) + " to " + std::to_string(i.hi));
    c.*i.member = static_cast<int>(parsed);
  }
  if (const char* t = env("BRAID_TIMEOUT")) {
    // Decimal, as every number braid reads: strtod alone took 0x10 for 16 s
    // and " 5" with its space.
    const bool decimal = std::strspn(t, "0123456789.eE+-") == std::strlen(t);
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    if (!decimal || *end != '\0' || !(seconds >= kTimeoutLo) || seconds > kTimeoutHi)
      bad("BRAID_TIMEOUT", t, kTimeoutRange);
    c.timeout = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  }
  if (const char* a = env("BRAID_BIND_ADDR")) c.bind_addr = a;
  if (const char* h = env("BRAID_IB_HCA")) c.ib_hca = h;
  if (const char* h = env("BRAID_HOST_ID")) c.host_id = h;
  return c;
}

// The ranges read_config() holds the environment to. A Config made in code
// (create_world(info, config): tests, embedding, the torch backend) was
// taken as it was: 1-element segments crawled, a 0-byte socket buffer
// waited out the timeout, -1 sockets asked for a vector of 2^64 (found by
// a review helper).
void validate(const Config& c) {
  auto refuse = [](const char* field, const char* var, const std::string& value, const std::string& allowed) {
    throw InvalidUsage(std::string("Config::") + field + " (" + var + ") = " + value + " is invalid: expected " +
                       allowed);
  };
  for (const Choice& choice : kChoices) {
    // An empty algo, which no environment gives, is taken in code (tests)
    // as auto that keeps small calls off the shared slots (select.cc).
    bool known = choice.member == &Config::algo && c.algo.empty();
    for (const char* a : choice.allowed) known = known || c.*choice.member == a;
    if (!known) refuse(choice.field, choice.var, "'" + c.*choice.member + "'", list_of(choice.allowed));
  }
  for (const Bytes& b : kBytes) {
    const std::size_t lo = b.code_lo ? b.code_lo : b.lo;
    if (!in_range(b, c.*b.member, lo)) refuse(b.field, b.var, std::to_string(c.*b.member), range_of(b, lo));
  }
  for (const Int& i : kInts)
    if (c.*i.member < i.lo || c.*i.member > i.hi)
      refuse(i.field, i.var, std::to_string(c.*i.member),
             "an integer from " + std::to_string(i.lo) + " to " + std::to_string(i.hi));
  using Seconds = std::chrono::duration<double>;
  const double seconds = std::chrono::duration_cast<Seconds>(c.timeout).count();
  if (!(seconds >= kTimeoutLo) || seconds > kTimeoutHi)
    refuse("timeout", "BRAID_TIMEOUT", std::to_string(c.timeout.count()) + " ms", kTimeoutRange);
  if (c.bind_addr.empty()) refuse("bind_addr", "BRAID_BIND_ADDR", "''", "an IP address");
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
