// Integer flags of braid's tools are decimal.
//
// CLI11 2.1 reads an integer with strtoll in base 0, so "--steps 010" was 8
// steps and "-n 0x10" 16 iterations, it lets a 64-bit value out of range
// saturate ("--steps 99999999999999999999" ran 2^63 - 1 steps), and it read
// "-1" into an unsigned count as 2^64 - 1. decimal() drops leading zeros and
// refuses anything else but digits (after a '-' where the flag's type may be
// negative), and any value the type cannot hold.
#pragma once

#include <charconv>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace braid::tools {

template <class T>
CLI::Validator decimal(const T&) {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        // The type's range only for a value the type cannot hold: the
        // flag's own check (applied after) names the range it takes, and
        // "-n 0x10" was told "from -2147483648 to 2147483647" of a flag
        // that takes 1 and up.
        const std::string range = "must be a whole number from " + std::to_string(std::numeric_limits<T>::min()) +
                                  " to " + std::to_string(std::numeric_limits<T>::max()) + ", not " + value;
        const std::size_t digits_at = value.rfind('-', 0) == 0 ? 1 : 0;
        if (value.size() == digits_at || value.find_first_not_of("0123456789", digits_at) != std::string::npos)
          return "must be a whole number in decimal digits (no sign other than '-', no 0x, no exponent), not " + value;
        T parsed{};
        const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
        if (error != std::errc() || end != value.data() + value.size()) return range;
        value = std::to_string(parsed);
        return {};
      },
      "");  // no word of its own: the help keeps "INT"
}

}  // namespace braid::tools
