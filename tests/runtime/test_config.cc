// runtime/config: byte counts with binary suffixes, and the cached Config.
// config() reads the environment once per process, so these tests exercise
// parse_bytes directly rather than changing BRAID_* between calls.
#include <catch2/catch.hpp>

#include "runtime/config.h"
#include "runtime/errors.h"

using namespace braid;
using runtime::parse_bytes;

TEST_CASE("config: parse_bytes reads plain counts and binary suffixes", "[config]") {
  CHECK(parse_bytes("0") == 0);
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("7B") == 7);
  CHECK(parse_bytes("4K") == 4096);
  CHECK(parse_bytes("4k") == 4096);
  CHECK(parse_bytes("256KiB") == 256u << 10);
  CHECK(parse_bytes("64M") == 64u << 20);
  CHECK(parse_bytes("3MiB") == 3u << 20);
  CHECK(parse_bytes("2G") == std::size_t{2} << 30);
  CHECK(parse_bytes("1GiB") == std::size_t{1} << 30);
}

TEST_CASE("config: parse_bytes rejects what is not a byte count", "[config]") {
  for (const char* text : {"", "abc", "K", "12X", "12 K", "1.5M", "4KB", "12KiBs"})
    CHECK_THROWS_AS(parse_bytes(text), InvalidUsage);
  CHECK_THROWS_AS(parse_bytes("99999999999999999999"), InvalidUsage);  // past 64 bits
  CHECK_THROWS_AS(parse_bytes("17179869184G"), InvalidUsage);  // 2^34 GiB overflows
}

// std::stoull accepts a leading '-' and wraps it around; parse_bytes should
// refuse negative counts instead (config.cc is not this test's to fix).
TEST_CASE("config: parse_bytes rejects negative counts", "[config]") {
  CHECK_THROWS_AS(parse_bytes("-1"), InvalidUsage);
  CHECK_THROWS_AS(parse_bytes("-4K"), InvalidUsage);
}

TEST_CASE("config: config() reads once and returns the same object", "[config]") {
  const runtime::Config& first = runtime::config();
  CHECK(&first == &runtime::config());
  CHECK(first.timeout.count() > 0);
  CHECK(first.tcp_nsocks >= 1);
}
