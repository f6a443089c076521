// Whether an environment variable's text is a whole number in decimal
// digits, a '-' at most before them: strtol alone takes " 5" with its
// space, "+5", and hex where asked, which braid's flags and BRAID_TIMEOUT
// refuse (tools/decimal_flag.h says the same of the command lines).
#pragma once

#include <cstring>

namespace braid::runtime {

inline bool is_decimal_integer(const char* text) {
  const char* digits = text + (text[0] == '-');
  return *digits != '\0' && std::strspn(digits, "0123456789") == std::strlen(digits);
}

}  // namespace braid::runtime
