// An LD_PRELOAD library for the RDMA VM tests: a device that breaks one of
// the two promises braid's keepalive leans on (comm/transport/ibverbs/
// transport.h), chosen by BRAID_TEST_RDMA_FAULT:
//  - lose_events: the device's asynchronous events never reach the rank
//    (each is read and acknowledged here, and the caller is told the queue
//    is empty): a port that goes down says nothing;
//  - retry_forever: every queue pair is brought up with a retry count of 7,
//    which soft-RoCE reads as "retry forever": a write to a peer that does
//    not answer stays outstanding, never failing.
// tests/rdma/guest/ibverbs_failures.sh: each rank must still name the port
// or the silent peer, well before BRAID_TIMEOUT.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

bool fault_is(const char* name) {
  const char* fault = std::getenv("BRAID_TEST_RDMA_FAULT");
  return fault && std::strcmp(fault, name) == 0;
}

template <typename F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  static const auto get = real<int (*)(ibv_context*, ibv_async_event*)>("ibv_get_async_event");
  static const auto ack = real<void (*)(ibv_async_event*)>("ibv_ack_async_event");
  if (!fault_is("lose_events")) return get(context, event);
  while (get(context, event) == 0) ack(event);
  errno = EAGAIN;
  return -1;
}

extern "C" int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  static const auto modify = real<int (*)(ibv_qp*, ibv_qp_attr*, int)>("ibv_modify_qp");
  if (fault_is("retry_forever") && (mask & IBV_QP_RETRY_CNT)) attr->retry_cnt = 7;
  return modify(qp, attr, mask);
}
