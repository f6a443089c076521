// Private to runtime/: the store's wire format, shared by store_server.cc and
// store_client.cc. store.h gives the framing; this file fixes the rest.
//
// Handshake reply: u8 status, u32 msg_bytes, msg. Status 0 accepts, and
//                  its msg is the store's instance: eight bytes drawn at
//                  random when the store started, which a client that
//                  reconnects checks, so that it never carries on against
//                  a store started since, which holds none of the keys its
//                  job set (the launcher or rank 0 restarted on the same
//                  port, with the same BRAID_JOB_TOKEN). Status 2
//                  refuses a wrong token (the client belongs to another
//                  job: one probing a job's ports moves on, store_ports.h);
//                  any other value refuses for another reason.
// Request frame:   u32 body_bytes, u8 Command, body (body_bytes excludes the
//                  five header bytes).
// Response frame:  u32 body_bytes, u8 Status, body.
//
// A key is u32 key_bytes followed by its bytes; a key list is u32 count
// followed by keys. Request bodies (every field must lie inside the body and
// nothing may follow the last one):
//   set      key, value (the rest of the body)
//   get      u32 timeout_ms, key
//   try_get  key
//   wait     u32 timeout_ms, key list
//   add      i64 delta, key
//   remove   key
//   remove_prefix  key (the prefix), key list (prefixes spared)
// Response bodies by status:
//   ok          get/try_get: the value; add: i64 new value; remove: u8
//               existed; remove_prefix: i64 keys removed; set/wait: empty
//   not_found   try_get of an absent key: empty
//   timeout     get/wait ran out of time: the key list still missing
//   bad_value   the request was well formed but cannot apply (add on a key
//               whose value is not a decimal integer; a set or add past the
//               store's byte limit, BRAID_STORE_MAX_BYTES; a request body
//               larger than the room left to receive it, which the server
//               reads and discards): message; the connection stays open
//   bad_request the request broke the protocol: message; the server closes
//               the connection after sending it
//
// Counters: add keeps a counter as its decimal ASCII text ("-42"), so get on
// a counter key returns readable digits and set(key, "10") seeds a counter.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errors.h"
#include "runtime/store.h"

namespace braid::runtime::store_wire {

inline constexpr char kMagic[4] = {'B', 'R', 'D', 'S'};
inline constexpr std::size_t kHandshakeHeaderBytes = 12;  // magic, version, token_bytes
inline constexpr std::size_t kHandshakeReplyHeaderBytes = 5;  // status, msg_bytes
inline constexpr std::size_t kFrameHeaderBytes = 5;  // body_bytes, command or status
inline constexpr std::size_t kMaxTokenBytes = 4096;
inline constexpr std::size_t kMaxMessageBytes = 64u << 10;  // refusal texts
inline constexpr std::size_t kInstanceBytes = 8;
inline constexpr std::uint8_t kHandshakeOk = 0;
inline constexpr std::uint8_t kHandshakeRefused = 1;
inline constexpr std::uint8_t kHandshakeWrongToken = 2;

enum class Command : std::uint8_t { set = 1, get = 2, try_get = 3, wait = 4, add = 5, remove = 6, remove_prefix = 7 };
enum class Status : std::uint8_t { ok = 0, not_found = 1, timeout = 2, bad_value = 3, bad_request = 4 };

inline void put_u32(Bytes& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

inline void put_u64(Bytes& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

inline void put_i64(Bytes& out, std::int64_t value) { put_u64(out, static_cast<std::uint64_t>(value)); }

inline void put_text(Bytes& out, std::string_view text) {
  out.insert(out.end(), text.begin(), text.end());
}

inline void put_key(Bytes& out, std::string_view key) {
  put_u32(out, static_cast<std::uint32_t>(key.size()));
  put_text(out, key);
}

inline void put_keys(Bytes& out, const std::vector<std::string>& keys) {
  put_u32(out, static_cast<std::uint32_t>(keys.size()));
  for (const auto& key : keys) put_key(out, key);
}

inline std::uint32_t load_u32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

// u32 body_bytes, u8 code, body: one request or response.
inline Bytes frame(std::uint8_t code, const Bytes& body) {
  Bytes out;
  out.reserve(kFrameHeaderBytes + body.size());
  put_u32(out, static_cast<std::uint32_t>(body.size()));
  out.push_back(code);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Reads fields from a body, checking every length against what is left, so
// a peer's length can never make us read past the buffer. Throws RemoteError.
class WireReader {
 public:
  explicit WireReader(const Bytes& body)
      : begin_(body.data()), at_(body.data()), end_(body.data() + body.size()) {}

  std::uint32_t u32() { return load_u32(take(4)); }

  std::uint64_t u64() {
    const std::uint8_t* p = take(8);
    std::uint64_t bits = 0;
    for (int i = 7; i >= 0; --i) bits = bits << 8 | p[i];
    return bits;
  }

  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }

  std::string key() {
    std::uint32_t key_bytes = u32();
    const std::uint8_t* p = take(key_bytes);
    return std::string(reinterpret_cast<const char*>(p), key_bytes);
  }

  // The count that keys() is about to read, not consumed; checked as keys()
  // checks it.
  std::uint32_t count_ahead() const {
    if (left() < 4) throw RemoteError("malformed store message: a field runs past the body");
    const std::uint32_t count = load_u32(at_);
    if (count > (left() - 4) / 4) throw RemoteError("malformed store message: key count runs past the body");
    return count;
  }

  std::vector<std::string> keys() {
    std::uint32_t count = u32();
    // Each key takes at least four bytes: reject a count the body cannot hold
    // before reserving memory for it.
    if (count > left() / 4) throw RemoteError("malformed store message: key count runs past the body");
    std::vector<std::string> out;
    out.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) out.push_back(key());
    return out;
  }

  Bytes rest() {
    Bytes out(at_, end_);
    at_ = end_;
    return out;
  }

  // Bytes of the body read so far.
  std::size_t offset() const { return static_cast<std::size_t>(at_ - begin_); }

  void expect_end() const {
    if (at_ != end_) throw RemoteError("malformed store message: unexpected bytes after the last field");
  }

 private:
  std::size_t left() const { return static_cast<std::size_t>(end_ - at_); }

  const std::uint8_t* take(std::size_t bytes) {
    if (bytes > left()) throw RemoteError("malformed store message: a field runs past the body");
    const std::uint8_t* p = at_;
    at_ += bytes;
    return p;
  }

  const std::uint8_t* begin_;
  const std::uint8_t* at_;
  const std::uint8_t* end_;
};

inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (const auto& key : keys) out += (out.size() > 1 ? ", " : "") + key;
  return out + "]";
}

}  // namespace braid::runtime::store_wire
