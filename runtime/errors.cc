#include "runtime/errors.h"

#include <cstring>

namespace braid {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace braid
