// Communicator: braid's public API for collectives.
//
// A communicator is a group of ranks connected by transports. Every call
// takes (send buffer, receive buffer, count, DataType[, ReduceOp][, root]),
// works in place (same buffer, or for reduce_scatter / all_gather the rank's
// own slice of the larger buffer, as in NCCL) and out of place, validates its
// arguments before any byte moves (InvalidUsage), and returns a Work. In
// place, a reduce_scatter defines only the rank's own slice: the rest of the
// buffer (the other ranks' slices of the input) may be left holding partial
// results, as MPI_IN_PLACE allows; keep a copy of the input to use it again.
//
// Calls are queued and run in issue order by the communicator; small ones run
// directly in the calling thread when the communicator is idle (lower
// latency), the others on its progress thread, so several may be in flight
// while the caller computes. After any operation fails the communicator is
// aborted: its connections are closed (so peers fail fast too) and every
// later call fails with AbortedError carrying the first error.
//
// Buffers may be host or CUDA device memory (found with the driver, see
// runtime/device.h), both buffers of a call on the same side. A call on
// device memory takes an optional Stream and follows NCCL's stream
// semantics: it starts after the work already queued on the stream, and work
// queued after it waits for its result; Work::wait() returns once the result
// is in device memory. Device buffers move through pinned host staging
// (comm/device.h); a build without CUDA refuses them by name.
//
// Threads: every rank must issue one communicator's calls in the same
// order, so calls on one communicator come from one thread at a time in a
// set order (threads issuing at once pair their calls by arrival, which
// differs across ranks: same-shaped calls then mix data unseen). Give each
// thread a communicator of its own (split); different communicators may be
// used, split and destroyed from different threads at once. Worlds are
// created in the same order on every rank, one after another. As for any
// C++ object, destroying a communicator while another thread is inside one
// of its calls is undefined; wait for its Works first.
//
// Counts follow NCCL: reduce_scatter's count is per rank
// (output), all_gather's count is per rank (input), all_to_all's count is per
// peer.
#pragma once

// The one public header that needs C++20 (std::span): older standards read
// its declarations as errors of their own ("std::span has not been
// declared"). braid.pc sets no -std, so a newer standard the program
// chose stays. (dtype.h and the others stay C++17: the CUDA kernels,
// compiled by nvcc, include them.)
#if __cplusplus < 202002L
#error "braid's headers need C++20: compile with -std=c++20 (or later)"
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "braid/config.h"
#include "braid/rank_info.h"
#include "braid/types.h"
#include "braid/work.h"

namespace braid::comm {

struct Op;  // comm/types.h: one validated call, private to the library

// What select.cc chose for a call, and why ("ring", "1048576 B > 32768 B on 2 ranks").
struct AlgorithmChoice {
  std::string name;
  std::string reason;
};

struct TrafficStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

class Communicator {
 public:
  // The world communicator of this process, from the launcher's environment
  // (runtime::rank_info_from_env). Connects to the store (serving it when this
  // is rank 0 and no launcher does) and to every peer.
  static std::unique_ptr<Communicator> create_world();
  static std::unique_ptr<Communicator> create_world(const runtime::RankInfo& info);
  // With explicit settings instead of the BRAID_* environment (tests,
  // embedding); both are checked first (runtime::validate), so a value the
  // environment could not give is refused with InvalidUsage naming it.
  static std::unique_ptr<Communicator> create_world(const runtime::RankInfo& info,
                                                    const runtime::Config& config);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Fails the communicator now, from any thread (a watchdog's), as
  // ncclCommAbort does: the call running fails at its next wait, within
  // milliseconds, and queued and later calls at once, each with
  // AbortedError naming `reason`; the connections close, so the peers fail
  // at their next wait on this rank, naming it too. Returns without
  // waiting for the running call. Destroying a communicator waits for its
  // queued calls, each up to the timeout while a peer never joins it;
  // after abort() it returns at once. A communicator that failed already
  // stays as it was. Splits are communicators of their own: abort each.
  void abort(const std::string& reason = "");

  int rank() const;
  int size() const;
  // BRAID_TIMEOUT (or the explicit config's): how long any wait of this
  // communicator's calls lasts at most.
  std::chrono::milliseconds timeout() const;

  Work all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, Stream stream = {});
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype, ReduceOp op,
                      Stream stream = {});
  // reduce_scatter from one buffer per rank (torch's list form): send[r]
  // holds this rank's recv_count elements for rank r, of size() pointers to
  // host memory that may share bytes with one another (they are only read)
  // but not with recv, unless send[rank()] is recv (in place). The table is
  // copied; the buffers must live until the Work completes. The same call
  // as the flat form to the peers, which may pass either; it runs the ring
  // as the flat form would (partial sums in scratch, not in the inputs),
  // never the direct collective.
  Work reduce_scatter(std::span<const void* const> send, void* recv, std::size_t recv_count, DataType dtype,
                      ReduceOp op);
  Work all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype, Stream stream = {});
  // all_gather into one buffer per rank (torch's list form): rank r's
  // send_count elements land in recv[r], which holds size() pointers to
  // host memory, each of its own (none overlapping another, nor the send
  // buffer unless it is recv[rank()]: in place). The table is copied; the
  // buffers must live until the Work completes. The same call as the flat
  // form to the peers, which may pass either; it runs the ring or one-shot
  // as the flat form would, never the direct collective.
  Work all_gather(const void* send, std::span<void* const> recv, std::size_t send_count, DataType dtype);
  // A mismatch of a small broadcast (one that fits a slot, the one-shot
  // algorithm) is found late, unlike every other call's: the root returns
  // once it has published, and a rank whose call differs from the root's
  // fails at once, buffers untouched; the others get the root's data and
  // fail at their next call that waits for every rank. Two ranks that each
  // name themselves the root keep their own data; where no later call finds
  // that (the job's last call), destroying the communicator logs it as an
  // error. README.md ("one-shot broadcast") says why.
  Work broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root, Stream stream = {});
  Work reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root,
              Stream stream = {});
  Work send(const void* buffer, std::size_t count, DataType dtype, int peer, Stream stream = {});
  Work recv(void* buffer, std::size_t count, DataType dtype, int peer, Stream stream = {});
  Work all_to_all(const void* send, void* recv, std::size_t count_per_peer, DataType dtype, Stream stream = {});
  Work barrier();

  // Host memory that the ranks of one host map into each other (anonymous
  // shared memory, nothing named in /dev/shm). An all_reduce of at least
  // 64 KiB whose buffers come from here on every rank of a one-host
  // communicator skips the transport rings: each rank reduces its chunk
  // straight from every input into every output (all_reduce_direct.cc).
  // Zeroed; throws SystemError when memory runs out. Any communicator.
  // deallocate(nullptr) does nothing; a pointer allocate did not return
  // throws InvalidUsage.
  static void* allocate(std::size_t bytes);
  static void deallocate(void* pointer);

  // Whether calls of up to BRAID_INLINE_BYTES may run in the calling thread
  // while the communicator is idle (on by default: a hand-off to the
  // progress thread costs more than such a call). Off, every call returns at
  // once and runs on the progress thread. A process that issues async calls
  // on several communicators, in orders that differ between ranks (torch's
  // process groups, as gloo allows), needs it off: a call that runs in the
  // caller's thread returns only once its peers have joined it, and a peer
  // may first wait for this rank's next call, on the other communicator.
  // Any thread, any time; calls already issued are not affected.
  void set_inline(bool on);

  // Collective over this communicator: ranks passing the same color form a
  // new communicator, ordered by (key, rank). A negative color takes part in
  // the split but gets nullptr.
  std::unique_ptr<Communicator> split(int color, int key);

  // Payload bytes this communicator's transports moved since creation.
  TrafficStats traffic() const;
  // "tcp" for every peer, or e.g. "shm+tcp".
  std::string transport_summary() const;
  // The transport that reaches `peer` ("shm", "tcp"; "self" for this rank).
  std::string transport_of(int peer) const;
  // The node `rank` runs on: hosts (their BRAID_HOST_ID, default hostname and
  // boot id) numbered 0, 1, ... in the order of their lowest rank, whatever
  // the launcher calls its nodes.
  int host_index(int rank) const;
  // The algorithm the last call of `kind` ran with and why, as select.cc
  // returned it (braid-bench prints it); empty names before any such call.
  AlgorithmChoice last_algorithm(OpKind kind) const;

  struct Impl;

 private:
  explicit Communicator(std::shared_ptr<Impl> impl);
  Work submit(Op&& op);  // by reference: a by-value copy reads narrow stores back with wide loads
  std::shared_ptr<Impl> impl_;
};

}  // namespace braid::comm
