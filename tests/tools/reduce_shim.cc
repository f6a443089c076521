// LD_PRELOAD into braid-bench by the test "braid-bench counts a non-root
// reduce that changed its send buffer" (test_bench.cc): a library that
// breaks one promise on purpose. Communicator::reduce here runs the real
// call, waits for it, then flips one bit of a non-root's send buffer, out
// of place only: the root's result stays right, so only braid-bench's check
// of the non-root's input can see it.
//
// The real reduce is found by its own mangled name: dladdr of this
// definition gives it, dlsym(RTLD_NEXT) the next library's.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"

namespace braid::comm {

namespace {

using RealReduce = Work (*)(Communicator*, const void*, void*, std::size_t, DataType, ReduceOp, int, Stream);

RealReduce find_real() {
  // A pointer to a non-virtual member function holds its address first
  // (the Itanium C++ ABI, which GCC and Clang use on Linux).
  auto mine = &Communicator::reduce;
  void* address = nullptr;
  std::memcpy(&address, &mine, sizeof address);
  Dl_info info{};
  void* real = dladdr(address, &info) && info.dli_sname ? dlsym(RTLD_NEXT, info.dli_sname) : nullptr;
  if (real == nullptr) {
    std::fprintf(stderr, "reduce_shim: the real Communicator::reduce was not found\n");
    std::abort();
  }
  return reinterpret_cast<RealReduce>(real);
}

}  // namespace

Work Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root,
                          Stream stream) {
  static const RealReduce real = find_real();
  Work work = real(this, send, recv, count, dtype, op, root, stream);
  if (rank() != root && send != recv && count > 0) {
    work.wait();
    *static_cast<unsigned char*>(const_cast<void*>(send)) ^= 1;
  }
  return work;
}

}  // namespace braid::comm
