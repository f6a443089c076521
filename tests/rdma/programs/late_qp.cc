// An LD_PRELOAD library for the RDMA VM tests: the rank named by
// BRAID_TEST_LATE_QP_RANK (its BRAID_RANK, else RANK) sleeps BRAID_TEST_LATE_QP_MS
// before it creates its first queue pair, as a rank that starts late or
// reads the store slowly does. Its peers then bring their queue pairs up
// seconds before it brings up its own (tests/rdma/guest/ibverbs_failures.sh).
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  using Create = ibv_qp* (*)(ibv_pd*, ibv_qp_init_attr*);
  static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "ibv_create_qp"));
  static bool slept = false;
  const char* rank = std::getenv("BRAID_RANK") ? std::getenv("BRAID_RANK") : std::getenv("RANK");
  const char* late = std::getenv("BRAID_TEST_LATE_QP_RANK");
  const char* ms = std::getenv("BRAID_TEST_LATE_QP_MS");
  if (!slept && rank && late && ms && std::strcmp(rank, late) == 0) {
    slept = true;
    ::usleep(static_cast<useconds_t>(std::atoi(ms)) * 1000);
  }
  return real(pd, attr);
}
