#include "comm/transport/ibverbs/memory.h"

#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <cerrno>
#include <string>
#include <utility>

#include "runtime/errors.h"

namespace braid::comm::ibverbs {

Registered::Registered(ibv_pd* pd, std::size_t bytes, const char* what) : bytes_(bytes) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw SystemError(errno_message(std::string("allocating the RDMA ") + what, errno));
  data_ = static_cast<std::byte*>(memory);
  mr_ = ibv_reg_mr(pd, data_, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr_) {
    int error = errno;
    reset();
    throw SystemError(errno_message(std::string("registering the RDMA ") + what + " (" + std::to_string(bytes) +
                                        " bytes; is RLIMIT_MEMLOCK (ulimit -l) large enough?)",
                                    error));
  }
}

Registered::Registered(Registered&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mr_(std::exchange(other.mr_, nullptr)) {}

Registered& Registered::operator=(Registered&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mr_ = std::exchange(other.mr_, nullptr);
  }
  return *this;
}

Registered::~Registered() { reset(); }

void Registered::reset() {
  if (mr_) ibv_dereg_mr(mr_);
  if (data_) munmap(data_, bytes_);
  mr_ = nullptr;
  data_ = nullptr;
}

std::uint32_t Registered::lkey() const { return mr_->lkey; }
std::uint32_t Registered::rkey() const { return mr_->rkey; }

}  // namespace braid::comm::ibverbs
