// Private to runtime/: the store server's keys and values and what each
// command does to them, with every byte they hold counted against the job's
// limit (StoreLimits::max_bytes). No I/O.
//
// Values are shared, immutable buffers: a get sends the stored buffer itself
// rather than a copy, so a thousand clients reading one large value cost
// one value. A value stays counted for as long as it exists, so one that is
// replaced or removed while a response still sends it is counted until the
// send completes; the limit therefore bounds real memory, not only the map.
// A key costs its bytes plus kStoreEntryOverheadBytes, so a flood of tiny
// keys is bounded too.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "runtime/store.h"

namespace braid::runtime::store_map {

using Value = std::shared_ptr<const Bytes>;

class StoreMap {
 public:
  explicit StoreMap(std::size_t max_bytes);

  // Throws InvalidUsage naming BRAID_STORE_MAX_BYTES when the value does not
  // fit; the map is then unchanged.
  void set(const std::string& key, Bytes value);
  // The value, or null when the key is absent.
  Value find(const std::string& key) const;
  bool remove(const std::string& key);
  // Removes every key that starts with `prefix` and with none of `spare`;
  // returns how many.
  std::size_t remove_prefix(const std::string& prefix, const std::vector<std::string>& spare);
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  // Counters are decimal text (store_wire.h); throws InvalidUsage when the
  // key holds something else, the sum would overflow, or it does not fit.
  std::int64_t add(const std::string& key, std::int64_t delta);

  // Bytes held now: keys with their overhead, and every value still alive.
  std::size_t held_bytes() const { return key_bytes_ + *value_bytes_; }
  std::size_t max_bytes() const { return max_bytes_; }

 private:
  Value make_value(Bytes bytes);
  void check_room(const std::string& key, std::size_t value_bytes) const;

  std::size_t max_bytes_;
  std::size_t key_bytes_ = 0;
  // Shared with every value's deleter, which may run after the map is gone
  // (a Session destroyed later still holds the value it was sending).
  std::shared_ptr<std::size_t> value_bytes_ = std::make_shared<std::size_t>(0);
  std::map<std::string, Value, std::less<>> values_;  // ordered: a prefix is a range
};

// At most 64 characters of a key, for messages: keys come from clients and
// may be megabytes long.
std::string quoted_key(const std::string& key);

}  // namespace braid::runtime::store_map
