// Included by every transport header: a transport header reached from a
// collective algorithm stops the build (algorithms build with
// BRAID_ALGORITHMS_BUILD; comm/algorithms/boundary.h says why).
#pragma once

#ifdef BRAID_ALGORITHMS_BUILD
#error "a transport header is included from a collective algorithm: algorithms move bytes only through the Exchange (comm/algorithms/exchange.h) and reduce with kernels"
#endif
