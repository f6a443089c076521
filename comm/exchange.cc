#include "comm/algorithms/exchange.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <vector>

#include "comm/algorithms/reducer.h"
#include "comm/transport/transport.h"
#include "comm/wire.h"
#include "runtime/errors.h"

namespace braid::comm {

Exchange::Exchange(const Op& op, ExchangeContext& context, Clock::time_point deadline, const PeerState& peer_state)
    : op_(op), c_(context), deadline_(deadline), peer_state_(peer_state) {
  c_.sends.clear();
}

Exchange::Exchange(const Op& op, ExchangeContext& context, std::chrono::milliseconds timeout,
                   const PeerState& peer_state)
    : op_(op), c_(context), deadline_(), timeout_(timeout), peer_state_(peer_state) {
  c_.sends.clear();
}

// Sends still in flight when an algorithm throws are abandoned with their
// transport, which the communicator shuts down on any error.
// Scratch past what the ring algorithms reuse from call to call (two slots
// of a chunk or a segment, and at least 16 MiB) is given back once 16 calls
// in a row needed none of it: a whole message's worth (an in-place
// all_to_all's copy of its input; a non-root's reduce accumulator, before
// reduce_pipelined kept segments) stayed with the communicator until it was
// destroyed, +192 MiB on each rank after one 192 MiB call (a review
// helper's measurement). Not after every call:
// faulting the pages in again made each 64 MiB reduce 10-40x slower here.
Exchange::~Exchange() {
  constexpr std::size_t kAlwaysKept = std::size_t{16} << 20;
  constexpr int kIdleCalls = 16;
  const std::size_t kept = std::max(kAlwaysKept, 2 * std::max(c_.tuning.chunk_bytes, c_.tuning.segment_bytes));
  if (c_.scratch.capacity() <= kept || scratch_asked_ > kept) {
    c_.scratch_idle_calls = 0;
    return;
  }
  if (++c_.scratch_idle_calls < kIdleCalls) return;
  c_.scratch.release();
  c_.scratch_idle_calls = 0;
}

Request Exchange::send(int peer, std::uint32_t step, std::uint32_t segment, const void* data,
                       std::size_t bytes) {
  Transport* t = c_.routes.at(static_cast<std::size_t>(peer));
  auto header = make_header(c_.comm_id, op_, c_.rank, peer, step, segment, bytes);
  Request r{t, t->post_send(peer, header, data), peer, Request::Kind::send};
  c_.sends.push_back(r);
  return r;
}

Request Exchange::recv(int peer, std::uint32_t step, std::uint32_t segment, void* data, std::size_t bytes,
                       Placement placement) {
  Transport* t = c_.routes.at(static_cast<std::size_t>(peer));
  auto header = expected_header(c_.comm_id, op_, c_.rank, peer, step, segment, bytes);
  static std::byte empty;
  return {t, t->post_recv(peer, header, data ? data : &empty, placement), peer, Request::Kind::recv};
}

Request Exchange::recv_view(int peer, std::uint32_t step, std::uint32_t segment, std::size_t bytes) {
  Transport* t = c_.routes.at(static_cast<std::size_t>(peer));
  auto header = expected_header(c_.comm_id, op_, c_.rank, peer, step, segment, bytes);
  return {t, t->post_recv(peer, header, nullptr, Placement::cached), peer, Request::Kind::view};
}

std::span<const std::byte> Exchange::view(const Request& request) {
  return request.transport->view(request.id);
}

void Exchange::release(const Request& request) { request.transport->release(request.id); }

// Progress is driven here. With one transport the wait blocks in it until the
// deadline, and the clock is read only where the transport had nothing to
// advance (it read the clock then itself) or once per kClockEvery turns
// that advanced: a small call's wait is a few turns, and where the clock is
// slow to read (an emulated HPET costs ~1 us a read) it would cost more
// than the wait. With several transports (shm to some peers, TCP to others)
// each gets turns so that none starves while another blocks, and a wait
// with nothing to do backs off (ExchangeContext::quiet_slice).
void Exchange::drive(const Request& request) {
  constexpr unsigned kClockEvery = 64;
  Transport* t = request.transport;
  if (t->is_done(request.id)) return;
  c_.waiting_for.store(request.peer, std::memory_order_relaxed);
  for (unsigned turn = 1; !t->is_done(request.id); ++turn) {
    if (c_.aborting.load(std::memory_order_acquire)) throw_if_aborted(c_, op_);
    if (c_.distinct.size() == 1) {
      if ((!t->progress(deadline()) || turn % kClockEvery == 0) && Clock::now() >= deadline())
        timed_out(request.peer);
      continue;
    }
    auto now = Clock::now();
    if (now >= deadline()) timed_out(request.peer);
    bool advanced = false;
    for (Transport* other : c_.distinct) advanced |= other->progress(now);
    if (!advanced) advanced = t->progress(std::min(deadline(), now + c_.quiet_slice));
    c_.after_turn(advanced);
  }
  c_.waiting_for.store(-1, std::memory_order_relaxed);
}

void Exchange::wait(const Request& request) {
  drive(request);
  if (request.kind == Request::Kind::view) return;
  if (request.kind == Request::Kind::send)
    std::erase_if(c_.sends, [&](const Request& s) { return s.transport == request.transport && s.id == request.id; });
  release(request);
}

bool Exchange::send_done(const Request& request) {
  Transport* t = request.transport;
  if (!t->is_done(request.id)) {
    for (Transport* each : c_.distinct) each->progress(Clock::time_point::min());
    if (!t->is_done(request.id)) return false;
  }
  wait(request);
  return true;
}

void Exchange::swap_with_all(std::uint32_t step, const void* mine, void* theirs, std::size_t bytes) {
  std::vector<Request> received;
  for (int p = 0; p < c_.size; ++p) {
    if (p == c_.rank) continue;
    send(p, step, 0, mine, bytes);
    received.push_back(recv(p, step, 0, static_cast<std::byte*>(theirs) + p * bytes, bytes));
  }
  for (const Request& r : received) wait(r);
  wait_sends();
}

void Exchange::wait_sends() {
  for (const Request& s : c_.sends) {
    drive(s);
    release(s);
  }
  c_.sends.clear();
}

bool find_region(const ExchangeContext& context, const void* data, std::size_t bytes, RegionRef& ref,
                 runtime::MemoryKind memory) {
  if (memory == runtime::MemoryKind::device)
    return context.device_regions && context.device_regions->find_region(data, bytes, ref);
  return context.distinct.size() == 1 && context.distinct.front()->find_region(data, bytes, ref);
}

bool Exchange::find_region(const void* data, std::size_t bytes, RegionRef& ref) const {
  return comm::find_region(c_, data, bytes, ref, op_.memory.kind);
}

std::span<std::byte> Exchange::peer_region(int peer, const RegionRef& ref, std::size_t bytes) {
  if (ref.bytes != bytes)
    throw RemoteError("rank " + std::to_string(peer) + " named a registered buffer of " + std::to_string(ref.bytes) +
                          " bytes where " + describe(op_) + " needs " + std::to_string(bytes),
                      peer);
  if (op_.memory.kind == runtime::MemoryKind::device) {
    if (!c_.device_regions) throw InvalidUsage("no transport here maps the device memory of rank " + std::to_string(peer));
    return c_.device_regions->map_region(peer, ref);
  }
  return c_.routes.at(static_cast<std::size_t>(peer))->map_region(peer, ref);
}

void Exchange::peer_regions_used() {
  if (op_.memory.kind != runtime::MemoryKind::device || !c_.device_regions) return;
  Stream stream;
  const bool queued = c_.device_reducer && c_.device_reducer->take_queued(stream);
  c_.device_regions->regions_used(queued ? &stream : nullptr);
}

Reducer& Exchange::reducer() {
  if (op_.memory.kind != runtime::MemoryKind::device) return host_reducer();
  if (!c_.device_reducer) throw InvalidUsage(describe(op_) + ": device memory, but no device path to reduce it");
  return *c_.device_reducer;
}

std::array<std::uint8_t, 16> Exchange::device_id() const {
  if (op_.memory.kind != runtime::MemoryKind::device) return {};
  return c_.device_id;
}

std::byte* Exchange::scratch(std::size_t bytes) {
  scratch_asked_ = std::max(scratch_asked_, bytes);
  return c_.scratch.reserve(bytes);
}

std::byte* ScratchMemory::reserve(std::size_t bytes) {
  if (bytes <= bytes_ && data_) return data_;
  release();
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const bool huge = bytes >= kHugePage;
  const std::size_t size = huge ? (bytes + kHugePage - 1) / kHugePage * kHugePage : std::max<std::size_t>(bytes, 1);
  void* memory = huge ? std::aligned_alloc(kHugePage, size) : std::malloc(size);
  if (!memory) throw std::bad_alloc();
  if (huge) ::madvise(memory, size, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
  data_ = static_cast<std::byte*>(memory);
  bytes_ = size;
  return data_;
}

void ScratchMemory::release() {
  std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}

void throw_if_aborted(const ExchangeContext& context, const Op& op) {
  if (!context.aborting.load(std::memory_order_acquire)) return;
  throw AbortedError("rank " + std::to_string(context.rank) + ", " + describe(op) +
                     ": cut short: " + context.abort_reason);
}

void Exchange::timed_out(int peer) {
  throw_if_aborted(c_, op_);  // the wait ended early for it (SharedSlots::cancel)
  std::string where = peer_state_ ? peer_state_(op_, peer) : std::string("in an unknown state");
  throw TimeoutError("rank " + std::to_string(c_.rank) + " waits in " + describe(op_) + " for rank " +
                     std::to_string(peer) + ", which " + where + "; timed out (" + c_.timeout_name + ")");
}

}  // namespace braid::comm
