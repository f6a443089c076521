// LD_PRELOAD into braid-bench and braid-check by their tests: a library
// that breaks one promise on purpose, so that the tests see the checker
// catch it. $FAULT_SHIM names the fault; each runs the real call, waits for
// it, then
//   reduce_send          flips a bit of a non-root's reduce send buffer (out
//                        of place: the root's result stays right);
//   reduce_recv          writes a non-root's reduce receive buffer, which
//                        is not the library's (out of place);
//   all_reduce_overrun   writes the element past the end of an all_reduce's
//                        receive buffer;
//   all_reduce_bf16      rounds an f32 all_reduce's result to bf16's 8
//                        significant bits (a reduction through a narrower
//                        type);
// and any other call, or no $FAULT_SHIM, is the real one alone.
//
// The real functions are found by their own mangled names: dladdr of the
// definitions here gives them, dlsym(RTLD_NEXT) the next library's.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "comm/communicator.h"

namespace braid::comm {

namespace {

// The next library's definition of the member function `mine` points to.
template <class Real, class Member>
Real next_definition(Member mine) {
  // A pointer to a non-virtual member function holds its address first
  // (the Itanium C++ ABI, which GCC and Clang use on Linux).
  void* address = nullptr;
  std::memcpy(&address, &mine, sizeof address);
  Dl_info info{};
  void* real = dladdr(address, &info) && info.dli_sname ? dlsym(RTLD_NEXT, info.dli_sname) : nullptr;
  if (real == nullptr) {
    std::fprintf(stderr, "fault_shim: the real definition of %s was not found\n",
                 info.dli_sname ? info.dli_sname : "a Communicator call");
    std::abort();
  }
  return reinterpret_cast<Real>(real);
}

bool fault(std::string_view name) {
  const char* chosen = std::getenv("FAULT_SHIM");
  return chosen != nullptr && name == chosen;
}

using ReduceFn = Work (*)(Communicator*, const void*, void*, std::size_t, DataType, ReduceOp, int, Stream);
using AllReduceFn = Work (*)(Communicator*, const void*, void*, std::size_t, DataType, ReduceOp, Stream);
using AllReduceMember = Work (Communicator::*)(const void*, void*, std::size_t, DataType, ReduceOp, Stream);

}  // namespace

Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root,
                          Stream stream) {
  static const auto real = next_definition<ReduceFn>(&Communicator::reduce);
  Work work = real(this, send, recv, count, dtype, op, root, stream);
  if (rank() == root || send == recv || count == 0) return work;
  if (fault("reduce_send")) {
    work.wait();
    *static_cast<unsigned char*>(const_cast<void*>(send)) ^= 1;
  } else if (fault("reduce_recv") && recv != nullptr) {
    work.wait();
    std::memset(recv, 0, dtype_bytes(dtype));
  }
  return work;
}

Work Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                              Stream stream) {
  static const auto real = next_definition<AllReduceFn>(static_cast<AllReduceMember>(&Communicator::all_reduce));
  Work work = real(this, send, recv, count, dtype, op, stream);
  if (count == 0) return work;
  if (fault("all_reduce_overrun")) {
    work.wait();
    std::memset(static_cast<std::byte*>(recv) + count * dtype_bytes(dtype), 0, dtype_bytes(dtype));
  } else if (fault("all_reduce_bf16") && dtype == DataType::f32) {
    work.wait();
    auto* result = static_cast<std::uint32_t*>(recv);
    for (std::size_t i = 0; i < count; ++i) result[i] &= 0xFFFF0000u;
  }
  return work;
}

}  // namespace braid::comm
