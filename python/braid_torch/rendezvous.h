// How the ranks of a torch process group find braid's store: through the
// store torch hands the backend.
//
// torch passes every backend its own Store (TCPStore under torchrun and
// env://, FileStore, ...; prefixed per group). braid's connection set-up
// talks to braid's store, whose protocol carries the handshake token, byte
// limits and timeouts that the transports rely on. So group rank 0 serves a
// braid store on a free port of the bind address and publishes its address
// and a fresh random job token under one key of torch's store; the other
// ranks wait for that key (bounded by the group's timeout) and connect. The
// torch store carries only that one value, so any torch store works, and
// every group (new_group included) gets its own braid store and token.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "braid/config.h"
#include "braid/rank_info.h"
#include "runtime/store.h"

namespace braid::torch_backend {

struct Rendezvous {
  std::unique_ptr<runtime::StoreServer> server;  // on group rank 0 only
  runtime::RankInfo info;                        // what create_world needs
};

Rendezvous rendezvous(c10d::Store& store, int rank, int size, const runtime::Config& config);

}  // namespace braid::torch_backend
