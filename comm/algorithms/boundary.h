// Forced into every algorithm's compilation (comm/algorithms/meson.build):
// the structural half of DESIGN.md's rule that algorithms never see a
// socket, a shared-memory mapping, a queue pair or a CUDA handle. They move
// bytes through the Exchange and reduce with kernels, nothing else.
//
// - Every transport header includes comm/transport/transport_only.h, which
//   stops the build when BRAID_ALGORITHMS_BUILD is defined (it is, here).
// - The system calls transports are made of are poisoned, so an algorithm
//   that includes <sys/socket.h>, <sys/mman.h>, <infiniband/verbs.h> or
//   <cuda_runtime.h> (which declare them) fails to compile, as does one
//   that calls them.
// tests/comm/test_unit.cc reads the includes as well (angle brackets too).
#pragma once

#pragma GCC poison socket connect accept listen setsockopt sendmsg recvmsg
#pragma GCC poison mmap munmap shm_open shm_unlink memfd_create pidfd_getfd
#pragma GCC poison ibv_open_device ibv_reg_mr ibv_post_send ibv_post_recv ibv_poll_cq
#pragma GCC poison cudaMalloc cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaMemcpyAsync
