// A build without CUDA (-Dcuda=disabled or no nvcc): --device cuda is
// refused by name.
#include "runtime/errors.h"
#include "trainer/model/backend.h"

namespace braid::trainer {

void set_cuda_local_rank(int) {}

bool cuda_usable(std::string* why) {
  if (why != nullptr) *why = "this braid was built without CUDA (no nvcc found, or -Dcuda=disabled)";
  return false;
}

namespace detail {
const Backend& cuda_backend() {
  throw InvalidUsage("--device cuda: this braid was built without CUDA (no nvcc found, or -Dcuda=disabled); "
                     "install the CUDA toolkit and rebuild, or use --device cpu");
}
}  // namespace detail

}  // namespace braid::trainer
