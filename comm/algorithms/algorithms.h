// The collective algorithms, one per file, each a free function that runs
// the operation in x.op() through the Exchange. select.cc picks one per call.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/algorithms/exchange.h"

namespace braid::comm {

// How a message of `count` elements is cut into `parts` chunks: the first
// count % parts chunks hold one element more.
struct ChunkLayout {
  std::size_t count = 0;
  int parts = 1;
  std::size_t offset(int chunk) const {
    std::size_t base = count / parts, extra = count % parts;
    return base * chunk + std::min<std::size_t>(chunk, extra);
  }
  std::size_t count_of(int chunk) const {
    return count / parts + (static_cast<std::size_t>(chunk) < count % parts ? 1 : 0);
  }
};

// Receives posted ahead of the one being consumed, oldest first, at most
// Tuning::window of them: a fixed ring, so pipelining allocates nothing.
class Window {
 public:
  explicit Window(int limit) : limit_(std::clamp(limit, 1, kMaxWindow)) {}
  bool full() const { return count_ == limit_; }
  bool empty() const { return count_ == 0; }
  void push(const Request& request) {
    slots_[(head_ + count_) % kMaxWindow] = request;
    ++count_;
  }
  Request pop() {
    Request request = slots_[head_];
    head_ = (head_ + 1) % kMaxWindow;
    --count_;
    return request;
  }

 private:
  static constexpr int kMaxWindow = 16;
  std::array<Request, kMaxWindow> slots_{};
  int head_ = 0, count_ = 0, limit_;
};

// Called by the ring reduce-scatter as each segment of the rank's own chunk
// becomes final: (segment index, its elements, element count). Returns the
// send it posted from `data`, if any (a default Request otherwise): with
// staging the data is in a staging slot that is reused only once that send
// is done, and the callback writes it to its place in dst itself.
using OnFinalSegment = std::function<Request(std::size_t segment, std::byte* data, std::size_t count)>;

// Cache-resident slots, each the largest segment of the call (a segment,
// or a chunk where chunks are smaller), that final segments are reduced
// into; kept by the caller across calls (rounds), since a slot's send may
// still be in flight when a call returns: its memory must outlive every
// send, which Exchange::wait_sends ends.
struct FinalStaging {
  static constexpr std::size_t kSlots = 2;
  std::byte* memory = nullptr;
  std::size_t slot_bytes = 0;
  std::array<Request, kSlots> sent{};  // the send still reading each slot
};

struct ReduceScatterRingOptions {
  // Wire step of the schedule's step 0, and whether the caller has already
  // posted that step (reduce_scatter_ring_start).
  std::uint32_t first_step = 0;
  bool first_sent = false;
  // dst has room for the rank's own output chunk only (it points there);
  // partial sums of other chunks go to scratch.
  bool final_only = false;
  OnFinalSegment on_final;
  // With on_final, final segments are reduced into these slots rather than
  // dst, for a caller that sends them on and writes dst with streaming
  // stores (an out-of-place all-reduce spares the read-for-ownership of its
  // output that way); a segment whose slot's send has not yet gone is
  // reduced into dst as without staging, so staging never waits on a peer.
  FinalStaging* staging = nullptr;
  // Chunk c's input at inputs[c] instead of its place in src (the list form
  // of reduce_scatter, Op::send_chunks); src is then unused. Needs
  // final_only: the partial sums must not land in the caller's inputs.
  const void* const* inputs = nullptr;
};
// Ring reduce-scatter of the `layout` chunks of `src` (element type and op from
// x.op()): on return chunk `rank` of `dst` holds the reduction over all ranks.
// Partial sums of other chunks are written to dst too, so dst must have room
// for every chunk unless options.final_only is set.
void reduce_scatter_ring(Exchange& x, const std::byte* src, std::byte* dst, const ChunkLayout& layout,
                         const ReduceScatterRingOptions& options);
// The reduce-scatter's first step alone (this rank's contribution to the
// chunk of its right neighbour, straight from `src`), for a caller that
// posts it early and passes first_sent; its sends are left to
// Exchange::wait_sends.
void reduce_scatter_ring_start(Exchange& x, const std::byte* src, const ChunkLayout& layout, std::uint32_t first_step);
struct AllGatherRingOptions {
  // Wire step of the schedule's step 0, and whether the caller has already
  // posted that step's sends of the rank's own chunk.
  std::uint32_t first_step = 0;
  bool first_sent = false;
  // How the last step's receives, which are not forwarded, are written.
  Placement last_step = Placement::cached;
  // Chunk c at chunks[c] instead of its place in buf (the list form of
  // all_gather, Op::recv_chunks); buf is then unused.
  void* const* chunks = nullptr;
};
// Ring all-gather: chunk `rank` of `buf` is present; on return every chunk is.
void all_gather_ring(Exchange& x, std::byte* buf, const ChunkLayout& layout,
                     const AllGatherRingOptions& options = {});

void all_reduce_ring(Exchange& x);
// On registered buffers of every rank of one host (all_reduce_direct.cc),
// from this size.
inline constexpr std::size_t kDirectAllReduceMinBytes = 64u << 10;
// The direct collectives (direct.h): every rank's buffers mapped, no ring.
void all_reduce_direct(Exchange& x);
void reduce_direct(Exchange& x);
void reduce_scatter_direct(Exchange& x);
void all_gather_direct(Exchange& x);
void broadcast_direct(Exchange& x);
void all_to_all_direct(Exchange& x);
void all_reduce_recursive_doubling(Exchange& x);
void reduce_scatter(Exchange& x);
void all_gather(Exchange& x);
void broadcast_pipelined(Exchange& x);
void broadcast_binomial(Exchange& x);
void reduce_pipelined(Exchange& x);
void all_to_all_pairwise(Exchange& x);
void barrier_dissemination(Exchange& x);
// The one-shot collectives through the shared slots of a one-host
// communicator (oneshot.h).
void all_reduce_oneshot(Exchange& x);
void reduce_oneshot(Exchange& x);
void broadcast_oneshot(Exchange& x);
void all_gather_oneshot(Exchange& x);
void barrier_oneshot(Exchange& x);
// Proves that every rank called the same operation (barrier_dissemination.cc);
// run before an algorithm that writes a user buffer before its own messages
// could prove it.
void agree_signatures(Exchange& x);
void send_direct(Exchange& x);
void recv_direct(Exchange& x);
// The messages of a send or a receive (op().kind), posted and not waited
// for: send_direct and recv_direct wait for them; the engine runs several
// point-to-point calls at once with them (comm/engine_p2p.cc).
std::vector<Request> post_point_to_point(Exchange& x);

// What select.cc decides from: the call, and what its ranks and buffers can
// do. Built by the engine for every call and by the device path when it
// stages one.
struct CallShape {
  OpKind kind = OpKind::barrier;
  std::size_t bytes = 0;  // count x element size
  int ranks = 1;
  bool one_host = false;    // every rank of the communicator on this host
  // Every buffer the call uses on this rank lies in registered memory the
  // peers can map: host memory through the transport to every peer, device
  // memory through CUDA IPC.
  bool registered = false;
  bool device = false;      // CUDA device memory
  bool in_place = false;    // the send and receive buffers overlap
  // Payload bytes of a rank's shared slot (Exchange::slot_capacity): 0
  // unless every rank is on this host and reached through shared memory.
  std::size_t slot_bytes = 0;
  std::string_view transport = "auto";  // BRAID_TRANSPORT
  std::string_view forced = "auto";     // BRAID_ALGO
};

// Why select.cc chose an algorithm, as plain values: select_algorithm runs on
// every call, so the sentence is built only when someone reads it
// (describe(): "1024 B <= 32768 B on 2 ranks", with the threshold that decided).
struct Reason {
  enum class Rule : std::uint8_t { only_one, point_to_point, forced, registered, at_most, above, cuda_ipc, slots };
  Rule rule = Rule::only_one;
  std::size_t bytes = 0, limit = 0;
  int ranks = 0;                // 0: the rule does not depend on the rank count
  std::string_view forced;      // BRAID_ALGO, for Rule::forced
  bool staged = false;          // device buffers staged through pinned host memory
  // What `bytes` counts where it is not the whole message: " per rank"
  // (all_gather's input, reduce_scatter's output), " per peer"
  // (all_to_all's block), as the call's count does (communicator.h).
  std::string_view bytes_of;
};
std::string describe(const Reason& reason);

// The algorithm table's answer: which function runs the call, its name, and why.
struct Algorithm {
  void (*run)(Exchange&) = nullptr;
  std::string_view name;
  // Whether the schedule itself has checked, through a chain of headers, that
  // every rank called the same operation before it writes any user buffer
  // (recursive doubling, the dissemination barrier, the direct collectives'
  // swap with every rank, point-to-point). Otherwise agree_signatures runs
  // first.
  bool agrees = false;
  Reason reason;
  // Reads the inputs of an avg of halves as they are and scales them down
  // itself as it reduces them (Op::avg_inputs_unscaled): no scaled copy of
  // the input is made for it (StagedInput::fill).
  bool scales_avg_inputs = false;
  // Reads the peers' inputs where they lie (the direct collectives): an
  // input this rank's output may overwrite first is read from a registered
  // copy (StagedInput::for_direct).
  bool maps_inputs = false;
  // comm/types.h's algorithm_id of `name`, as Op::algorithm carries it (0 for
  // point-to-point calls); set by select_algorithm and the lean path's
  // look-ups.
  std::uint8_t id = 0;
};
Algorithm select_algorithm(const CallShape& call);
// Whether the answer for `call` depends on call.registered: the engine
// looks the buffers up in registered memory (for device memory a CUDA IPC
// export) only then.
bool registration_matters(const CallShape& call);
// The one-shot algorithm that select_algorithm runs every host call of
// call.kind on up to call.slot_bytes, whatever its registration and
// placement, or nullopt: the engine's lean path asks once per kind.
std::optional<Algorithm> oneshot_whenever_fits(const CallShape& call);
// The algorithm that select_algorithm runs every host call of call.kind on
// up to `up_to` bytes, whatever its registration and placement, or nullopt
// (where a threshold lies in between, for point-to-point calls and device
// memory): the lean path of a communicator without shared slots asks once
// per kind.
std::optional<Algorithm> steady_algorithm(const CallShape& call, std::size_t up_to);

// Elements in op's send and receive buffers on `rank`, 0 for a buffer the
// call does not use there (a broadcast's send buffer off the root, ...);
// defined with the validation of the calls (comm/communicator.cc).
std::size_t send_elements(const Op& op, int rank, int size);
std::size_t recv_elements(const Op& op, int rank, int size);

// Elements per segment for this dtype (at least one).
std::size_t segment_count(const Exchange& x);

}  // namespace braid::comm
