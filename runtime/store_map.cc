#include "runtime/store_map.h"

#include <algorithm>
#include <charconv>

#include "runtime/errors.h"

namespace braid::runtime::store_map {
namespace {

constexpr std::size_t kMaxQuotedKeyBytes = 64;

std::int64_t parse_counter(const std::string& key, const Bytes& bytes) {
  const char* first = reinterpret_cast<const char*>(bytes.data());
  const char* last = first + bytes.size();
  std::int64_t value = 0;
  auto [end, err] = std::from_chars(first, last, value);
  if (err != std::errc() || end != last || bytes.empty())
    throw InvalidUsage("store add on key " + quoted_key(key) +
                       ": its value is not a decimal integer; use a separate key as a counter");
  return value;
}

}  // namespace

std::string quoted_key(const std::string& key) {
  if (key.size() <= kMaxQuotedKeyBytes) return "'" + key + "'";
  return "'" + key.substr(0, kMaxQuotedKeyBytes) + "...' (" + std::to_string(key.size()) + " bytes)";
}

StoreMap::StoreMap(std::size_t max_bytes) : max_bytes_(max_bytes) {}

Value StoreMap::make_value(Bytes bytes) {
  *value_bytes_ += bytes.size();
  return Value(new Bytes(std::move(bytes)), [counter = value_bytes_](const Bytes* value) {
    *counter -= value->size();
    delete value;
  });
}

// What the store would hold with `value_bytes` under `key`: the old value is
// freed only if no response still holds it.
void StoreMap::check_room(const std::string& key, std::size_t value_bytes) const {
  std::size_t freed = 0;
  std::size_t key_cost = key.size() + kStoreEntryOverheadBytes;
  if (auto it = values_.find(key); it != values_.end()) {
    key_cost = 0;
    if (it->second.use_count() == 1) freed = it->second->size();
  }
  std::size_t after = held_bytes() - freed + key_cost + value_bytes;
  if (after <= max_bytes_) return;
  throw InvalidUsage("the store is full: key " + quoted_key(key) + " with a value of " +
                     std::to_string(value_bytes) + " bytes would bring what it holds to " +
                     std::to_string(after) + " bytes, past its limit of " + std::to_string(max_bytes_) +
                     " bytes (BRAID_STORE_MAX_BYTES); the store is meant for addresses and names, "
                     "not data: remove keys that are no longer needed, or raise BRAID_STORE_MAX_BYTES");
}

void StoreMap::set(const std::string& key, Bytes value) {
  check_room(key, value.size());
  auto [it, inserted] = values_.try_emplace(key);
  if (inserted) key_bytes_ += key.size() + kStoreEntryOverheadBytes;
  it->second = make_value(std::move(value));
}

Value StoreMap::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : it->second;
}

bool StoreMap::remove(const std::string& key) {
  if (values_.erase(key) == 0) return false;
  key_bytes_ -= key.size() + kStoreEntryOverheadBytes;
  return true;
}

std::size_t StoreMap::remove_prefix(const std::string& prefix, const std::vector<std::string>& spare) {
  std::size_t removed = 0;
  for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.starts_with(prefix);) {
    const bool spared = std::any_of(spare.begin(), spare.end(), [&](const std::string& s) {
      return it->first.starts_with(s);
    });
    if (spared) {
      ++it;
      continue;
    }
    key_bytes_ -= it->first.size() + kStoreEntryOverheadBytes;
    it = values_.erase(it);
    ++removed;
  }
  return removed;
}

std::vector<std::string> StoreMap::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& key : keys)
    if (!values_.count(key)) out.push_back(key);
  return out;
}

std::int64_t StoreMap::add(const std::string& key, std::int64_t delta) {
  std::int64_t value = 0;
  if (Value old = find(key)) value = parse_counter(key, *old);
  if (__builtin_add_overflow(value, delta, &value))
    throw InvalidUsage("store add on key " + quoted_key(key) + " would overflow a 64-bit counter");
  std::string text = std::to_string(value);
  set(key, Bytes(text.begin(), text.end()));
  return value;
}

}  // namespace braid::runtime::store_map
