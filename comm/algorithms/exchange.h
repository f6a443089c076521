// Exchange: everything a collective algorithm may touch while it runs.
//
// Algorithms see the operation being run, their rank and the communicator
// size, and move bytes with send / recv / recv_view, identified by the peer
// and the position of the message in the schedule (step, segment). The
// Exchange turns those into wire headers carrying the operation's signature,
// routes them to the transport that reaches the peer, and bounds every wait
// by the operation's deadline. It deliberately exposes no socket, shared
// memory name or transport type: algorithms build without any transport
// header (a test checks their includes).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/types.h"

namespace braid::comm {

class Transport;
class Reducer;
class SharedSlots;

struct Request {
  enum class Kind : std::uint8_t { send, recv, view };
  Transport* transport = nullptr;
  std::uint32_t id = 0;
  int peer = -1;
  Kind kind = Kind::send;
};

// The sizes an algorithm cuts messages into: chunks are what one rank owns in
// a ring; segments are single transport operations.
struct Tuning {
  std::size_t segment_bytes = 256u << 10;
  std::size_t chunk_bytes = 1u << 20;  // per rank and round of a large all-reduce; 0 = one round
  std::size_t stream_bytes = 4u << 20;  // out-of-place all-reduces from this size stream their output; 0 = never
  int window = 4;  // receives posted ahead of the one being consumed
};

// Which ranks do a direct collective's work (Config::direct_workers,
// comm/algorithms/direct.h): each its own share, or rank 0 all of them.
enum class DirectWorkers : std::uint8_t { automatic, all, one };

// What a communicator keeps for its operations' Exchanges, so that starting
// one allocates nothing.
// An operation's scratch memory, kept across operations. Not zeroed (each
// user writes what it reads), and from 2 MiB on 2 MiB-aligned and marked for
// transparent huge pages: a std::vector zero-filled it, and the kernel
// mapped it a 4 KiB page at a time, so that the first 256 MiB reduce_scatter
// of 2 ranks spent 0.9 s in memset and page faults where the next took 26 ms
// (helper-134's finding 3).
class ScratchMemory {
 public:
  ScratchMemory() = default;
  ScratchMemory(const ScratchMemory&) = delete;
  ScratchMemory& operator=(const ScratchMemory&) = delete;
  ~ScratchMemory() { release(); }
  // At least `bytes`; what it held before is not kept when it grows.
  std::byte* reserve(std::size_t bytes);
  std::size_t capacity() const { return bytes_; }
  void release();

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

struct ExchangeContext {
  std::uint32_t comm_id = 0;
  int rank = 0;
  int size = 1;
  std::vector<Transport*> routes;    // [peer] -> transport reaching it
  std::vector<Transport*> distinct;  // each transport once
  Tuning tuning;
  ScratchMemory scratch;             // reused across operations (Exchange::~Exchange trims it)
  int scratch_idle_calls = 0;        // calls since one needed more than is always kept
  std::vector<Request> sends;        // sends in flight, cleared per operation
  // The peer an operation is blocked on right now, -1 when none: read by the
  // communicator's status board for timeout attribution (comm/status.h).
  std::atomic<int> waiting_for{-1};
  std::string timeout_name = "BRAID_TIMEOUT";  // Config::timeout_name, for timeout messages
  // Device memory: the transport that registers it and maps the peers'
  // (cuda_ipc; null without CUDA or local peers), and the device path's
  // Reducer (set by the communicator's first call on device memory).
  Transport* device_regions = nullptr;
  Reducer* device_reducer = nullptr;
  // The shared slots when every peer is reached through one transport that
  // has them, else null, and the payload bytes a slot holds: looked up once
  // the transports are connected, before the first call (engine_lean.cc).
  SharedSlots* slots = nullptr;
  std::size_t slot_payload = 0;
  // The slots' geometry, asked once rather than through a virtual call per
  // use: entries per rank, payload bytes an entry holds, large slots per rank.
  std::uint64_t slot_depth = 0, entry_payload = 0, large_count = 0;
  // This rank's side of the slots' reuse rule (exchange_slots.cc): the
  // last call it published, the last call every peer is known to have
  // entered, and the calls it left before every peer had entered them
  // (Exchange::share_root_slot, as their root) whose peers' signatures are
  // still to be checked, at [seq modulo the slots' depth] (seq 0: none).
  std::uint64_t last_published = 0;
  std::uint64_t all_entered = 0;
  std::vector<Op> early;
  std::uint64_t oldest_early = 0;  // no unchecked early call is older; 0: none
  std::uint64_t newest_early = 0;
  // Off the small calls' path, so last (the fields above keep their lines):
  // the identity (UUID) of device_reducer's device, set with it (ranks whose
  // buffers are on the same GPU see the same bytes); Config::direct_workers;
  // whether the last direct collective ran with one worker (read by
  // Communicator::last_algorithm on the caller's thread), and whether it
  // ran in stream order (direct.h); and whether some
  // direct collective found a peer's buffers on this rank's GPU (once set,
  // it stays: BRAID_CUDA_GATE=auto holds the caller from then on).
  std::array<std::uint8_t, 16> device_id{};
  bool device_mps = false;  // set with device_id: this process reaches the GPU through MPS
  DirectWorkers direct_workers = DirectWorkers::automatic;
  std::atomic<bool> last_direct_one_worker{false};
  std::atomic<bool> last_direct_stream_ordered{false};
  std::atomic<bool> last_direct_flag_ordered{false};
  std::atomic<bool> gpu_shared{false};
  // The running call's stream order (gate `event`, comm/device.h), set and
  // taken by the engine around each call: the event on the caller's stream
  // after its input (unset: waited for on the host), and the events the
  // caller's stream must wait for before its result is there.
  DeviceEventRef call_ready;
  std::vector<DeviceEventRef> call_waits;
  // Gate `flag`: the call's flags (unset: not flag-ordered), and the wait
  // on the host for its input should its peers not all be flag-ordered.
  DeviceFlagsRef call_flags;
  std::function<void(Clock::time_point deadline)> wait_call_input;
  // Communicator::abort from another thread: `abort_reason` is written
  // before `aborting` is raised (release), once, and both stay. Every wait
  // of a call looks at the flag each turn (Exchange::drive, the shared
  // slots' sleep through SharedSlots::cancel, the point-to-point loop) and
  // then fails the call with AbortedError (throw_if_aborted).
  std::atomic<bool> aborting{false};
  std::string abort_reason;
  // A wait over several transports (shm to some peers, TCP to others)
  // gives each a turn, then blocks in the awaited one for a slice, so that
  // none starves while another blocks (Exchange::drive, the point-to-point
  // loop). The slice is 200 us for the first 256 turns in which no
  // transport advanced (about 50 ms: a running collective's pauses, its
  // ranks descheduled on shared cores, where a longer block in one
  // transport held up the other's sends: 10-15 % slower 4+4 MiB rings at
  // 3.2 ms), then doubles each quiet turn up to 6.4 ms; a turn that
  // advances starts it over. At a fixed 200 us, a rank waiting for a late
  // peer woke 5000 times a second for the whole wait: 13-16 % of a core
  // each (helper-132's F1).
  std::chrono::microseconds quiet_slice{kFirstQuietSlice};
  unsigned quiet_turns = 0;
  static constexpr std::chrono::microseconds kFirstQuietSlice{200}, kLongestQuietSlice{6400};
  static constexpr unsigned kQuietTurnsAtFirst = 256;
  // After a turn: the next one's slice (above).
  void after_turn(bool advanced) {
    quiet_turns = advanced ? 0 : quiet_turns + 1;
    quiet_slice = quiet_turns < kQuietTurnsAtFirst ? kFirstQuietSlice : std::min(quiet_slice * 2, kLongestQuietSlice);
  }
  // After the call, run or failed: clears the fields above except
  // call_waits, which the engine takes once the call has run.
  void end_call() {
    call_ready = {};
    call_flags = {};
    wait_call_input = nullptr;
  }
};

// Whether [data, data + bytes) lies in registered memory that one transport
// reaching every peer can hand out: host memory through the transport to
// every peer, device memory through device_regions (Exchange::find_region,
// and select.cc's question before an Exchange exists).
bool find_region(const ExchangeContext& context, const void* data, std::size_t bytes, RegionRef& ref,
                 runtime::MemoryKind memory = runtime::MemoryKind::host);

// Payload bytes a rank's shared slot holds for one call: 0 unless every
// peer is reached through one transport that has shared slots (shm with
// the whole communicator on this host).
inline std::size_t slot_capacity(const ExchangeContext& context) { return context.slot_payload; }
// Looks the slots up (context.slots, slot_payload) once the routes are set.
void find_slots(ExchangeContext& context);
// A receive `recv` from a peer on the shared slots finds nothing of the
// peer's to take: RemoteError naming both calls if the peer has meanwhile
// published its slot of a collective this rank has not entered (a
// collective that agrees through the slots sends no message, so the
// receive alone would wait out the timeout).
void check_receive(const ExchangeContext& context, const Op& recv);
// The early calls (Exchange::share_root_slot) no later call checked, at the
// communicator's end: a job's last broadcasts, whose roots returned without
// a word where two ranks each named themselves the root and kept their own
// data (a review helper's case). Each peer's entry of such a call is waited
// for until `deadline`, and one not there by then is not checked. Returns
// the mismatch a later call would have thrown, or "".
std::string check_early_calls_at_end(ExchangeContext& context, Clock::time_point deadline);
// AbortedError naming `op` and the reason, where Communicator::abort
// raised context.aborting; nothing otherwise.
void throw_if_aborted(const ExchangeContext& context, const Op& op);
// The error of a receive on `rank` whose peer `entered` a collective
// ("barrier #2 ...") instead of sending its message.
std::string receive_without_send(int rank, const Op& recv, const std::string& entered);

class Exchange {
 public:
  // Describes where `peer` is (its last-entered operation) in `op`, for
  // timeout messages; the communicator's, kept by reference.
  using PeerState = std::function<std::string(const Op& op, int peer)>;

  Exchange(const Op& op, ExchangeContext& context, Clock::time_point deadline, const PeerState& peer_state);
  // The deadline `timeout` after the first wait that needs one: a small call
  // whose peers are already there (the engine's lean path) never reads the
  // clock.
  Exchange(const Op& op, ExchangeContext& context, std::chrono::milliseconds timeout, const PeerState& peer_state);
  ~Exchange();

  const Op& op() const { return op_; }
  int rank() const { return c_.rank; }
  int size() const { return c_.size; }
  const Tuning& tuning() const { return c_.tuning; }
  std::size_t element_bytes() const { return dtype_bytes(op_.dtype); }

  Request send(int peer, std::uint32_t step, std::uint32_t segment, const void* data, std::size_t bytes);
  Request recv(int peer, std::uint32_t step, std::uint32_t segment, void* data, std::size_t bytes,
               Placement placement = Placement::cached);
  // Receive into transport memory; after wait(), view() gives the bytes until release().
  Request recv_view(int peer, std::uint32_t step, std::uint32_t segment, std::size_t bytes);
  std::span<const std::byte> view(const Request& request);
  void release(const Request& request);

  // Sends `bytes` from `mine` to every other rank and receives each one's
  // into theirs + rank * bytes (this rank's slot untouched), all as (step,
  // segment 0); returns when every message has arrived and gone. With a
  // one-byte token it is a barrier.
  void swap_with_all(std::uint32_t step, const void* mine, void* theirs, std::size_t bytes);

  // Waits for one request; sends and plain receives are then released, a
  // view receive stays readable until release().
  void wait(const Request& request);
  // Whether a send has completed, after one turn of progress that never
  // blocks; a completed send is then released as wait() would.
  bool send_done(const Request& request);
  // Waits for every send posted so far.
  void wait_sends();

  // A buffer of at least `bytes` owned by the communicator, reused across ops.
  std::byte* scratch(std::size_t bytes);

  // Registered memory (DESIGN.md "Registered regions"): whether
  // [data, data + bytes) lies in memory this rank registered that the
  // transport reaching every peer can hand out (`ref` names it for them),
  // and the part of `peer`'s registered memory that a ref it sent names, as
  // a span here, checked against what the peer registered (RemoteError when
  // it lies outside, or does not hold the `bytes` this call needs). Refs
  // are opaque: pass them on, read nothing in them.
  bool find_region(const void* data, std::size_t bytes, RegionRef& ref) const;
  std::span<std::byte> peer_region(int peer, const RegionRef& ref, std::size_t bytes);
  // Once the call's steps are done or queued (close_direct): tells the
  // transport that mapped the peers' device buffers where the steps that
  // use them are queued, so that it unmaps none of them before they are
  // done (Transport::regions_used).
  void peer_regions_used();

  // The arithmetic of the direct collectives on the memory the call's
  // buffers are in (comm/algorithms/reducer.h); finish() it by deadline().
  // Regions and reducer follow op().memory; a call staged through pinned
  // host memory keeps its device kind there, but select.cc never runs a
  // direct collective on staging.
  Reducer& reducer();
  // For the direct collectives' choice of workers (direct.h): the setting,
  // and the identity of the GPU this call's buffers are on (all zeros for
  // host memory).
  // `auto` is `all` on a GPU this process reaches through MPS (the ranks'
  // kernels run at once there, with no context switches to save).
  DirectWorkers direct_workers() const {
    if (c_.direct_workers == DirectWorkers::automatic && c_.device_mps &&
        op_.memory.kind == runtime::MemoryKind::device)
      return DirectWorkers::all;
    return c_.direct_workers;
  }
  std::array<std::uint8_t, 16> device_id() const;
  void note_direct_workers(bool one) { c_.last_direct_one_worker.store(one, std::memory_order_relaxed); }
  void note_stream_ordered(bool by_events, bool by_flags) {
    c_.last_direct_stream_ordered.store(by_events, std::memory_order_relaxed);
    c_.last_direct_flag_ordered.store(by_flags, std::memory_order_relaxed);
  }
  void note_gpu_shared() { c_.gpu_shared.store(true, std::memory_order_relaxed); }
  // Stream order (direct.h): this call's `ready` event, and one more event
  // the caller's stream waits for before the work queued after the call.
  const DeviceEventRef& call_ready() const { return c_.call_ready; }
  void wait_on_stream(const DeviceEventRef& event) { c_.call_waits.push_back(event); }
  // Stream order by flags (direct.h): this call's flags, and the host's
  // wait for its input where the peers' calls are not flag-ordered (throws
  // as StagedOp::wait_inputs).
  const DeviceFlagsRef& call_flags() const { return c_.call_flags; }
  void wait_call_input() {
    if (c_.wait_call_input) c_.wait_call_input(deadline());
  }
  // Throws the TimeoutError of this call waiting for `peer` past deadline()
  // (what it says of the peer: the PeerState's), or its AbortedError where
  // Communicator::abort cut the wait short (ExchangeContext::aborting).
  [[noreturn]] void timed_out(int peer);
  Clock::time_point deadline() const {
    if (deadline_ == Clock::time_point{}) deadline_ = Clock::now() + timeout_;
    return deadline_;
  }

  // Shared slots (comm/exchange_slots.cc; the one-shot steps of
  // comm/algorithms/oneshot.h): each rank has one per call, which every
  // other rank reads. share_slots(data, bytes, views) copies `bytes` of
  // `data` (at most slot_capacity(); 0: no slots here) into this rank's slot
  // with the call's signature and publishes it, waits for every peer's,
  // checks that each is this very call carrying `bytes` (a RemoteError
  // naming both calls otherwise), and gives each rank's payload at
  // views[rank], readable until this call returns. Every wait is bounded by
  // deadline() and attributed as the messages' waits are.
  //
  // share_root_slot(data, bytes) returns before every peer has entered the
  // call (the one-shot broadcast): op().root publishes `bytes` of `data` and
  // waits for nobody; every other rank publishes its signature alone, waits
  // for the root's slot only, checks it and gets its payload (the root gets
  // null). Every peer's signature of such a call is checked by its root
  // later, while their slots still hold it: before it publishes its next
  // call that waits for every peer, or before it rewrites its own slot of
  // that call, failing with both calls named where one differs.
  //
  // A publish first makes sure that no peer still reads the memory it
  // rewrites, waiting where a peer lags: a rank runs at most the slots'
  // depth less one calls ahead of the slowest. Both steps are whole here,
  // so that a small call's slot operations compile into one function.
  std::size_t slot_capacity() const { return comm::slot_capacity(c_); }
  void share_slots(const void* data, std::size_t bytes, std::span<const void*> views);
  const void* share_root_slot(const void* data, std::size_t bytes);

 private:
  void drive(const Request& request);
  SharedSlots& slots() const;
  // Inline, defined in comm/exchange_slots.cc, their only user: the parts
  // of the two steps above.
  inline std::span<const std::byte> publish_slot(SharedSlots& slots, const void* data, std::size_t bytes, bool early);
  inline std::span<const std::byte> peer_slot(SharedSlots& slots, int peer, std::size_t bytes);
  inline void wait_slot(SharedSlots& slots, int peer, std::uint64_t seq);
  inline void make_room(SharedSlots& slots, bool in_entry, bool early);
  void check_early_calls(SharedSlots& slots, std::uint64_t before);

  // The caller's Op, which outlives the Exchange: a copy would read the
  // Op's narrow stores back with wide loads, which wait for them to leave
  // the store buffer (a failed store forward).
  const Op& op_;
  ExchangeContext& c_;
  mutable Clock::time_point deadline_;  // {}: not read yet, timeout_ from the first deadline()
  std::size_t scratch_asked_ = 0;       // the most this call asked of scratch()
  std::chrono::milliseconds timeout_{0};
  const PeerState& peer_state_;
};

}  // namespace braid::comm
