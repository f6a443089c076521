// The arithmetic of the direct collectives, wherever their buffers live.
//
// A direct collective (direct.h) reads its peers' buffers and writes into
// them in place, so one fused step does all its work: reduce n sources and
// write the result to several destinations. On host memory that is
// kernels::cpu; on CUDA device memory it is kernels::cuda's reduce_multi on
// a stream of the device path, which algorithms cannot name (they build
// without CUDA headers: boundary.h). The Exchange hands an algorithm the
// Reducer for the call's memory (Exchange::reducer), so one schedule serves
// host registered memory and device memory mapped through CUDA IPC.
#pragma once

#include <cstddef>
#include <span>

#include "comm/types.h"

namespace braid::comm {

// Most sources or destinations of one step on a device
// (kernels::cuda::kMaxMulti), and so the most ranks a direct collective on
// device memory runs on (select.cc). The host takes any number.
inline constexpr int kMaxDirectRanks = 8;

// What a reduce step does for an avg: the sum divided by `divisor` (0: no
// divide); for f16 and bf16 on the host, each source scaled by
// 2^source_shift as it is read and the quotient scaled by 2^scale_up
// (Op::avg_inputs_unscaled and Op::avg_scale_up). All 0: a plain reduce.
struct Averaging {
  int divisor = 0;
  int scale_up = 0;
  int source_shift = 0;
};

class Reducer {
 public:
  virtual ~Reducer() = default;
  // For i < count: r = op(srcs[0][i], ..., srcs[n-1][i]), reduced in the
  // sources' order and averaged as `avg` says, written to every dsts[k][i].
  // One source is a copy (pass ReduceOp::sum and no Averaging). At least
  // one source and one destination (on a device at most kMaxDirectRanks);
  // a destination may be one of the sources (the same pointer): every
  // source of an element is read before it is written.
  // Asynchronous on device memory until finish().
  virtual void reduce_multi(std::span<void* const> dsts, std::span<const void* const> srcs, std::size_t count,
                            DataType dtype, ReduceOp op, Averaging avg) = 0;
  // Returns once every step issued so far has written its destinations:
  // at once on the host; on a device when its kernels have finished
  // (TimeoutError at `deadline`, SystemError on a device fault).
  virtual void finish(Clock::time_point deadline) = 0;

  // Stream order across processes (gate `event`, comm/device.h; a device
  // Reducer alone does anything here). wait_for: the steps issued after it
  // start on the device once each set event has completed (the ranks'
  // inputs, recorded on their streams), without the host waiting; unset
  // ones are skipped (that rank waited for its input on the host).
  // done_event: the event finish_queued records, for peers' streams to wait
  // for (unset: none). finish_queued: finish() for readers that wait on the
  // device: records done_event() after every step issued so far and
  // returns at once; where there is no such event it finishes on the host
  // and returns false.
  virtual void wait_for(std::span<const DeviceEventRef> events) { (void)events; }
  virtual DeviceEventRef done_event() { return {}; }
  virtual bool finish_queued(Clock::time_point deadline) {
    finish(deadline);
    return false;
  }

  // Stream order by flags (gate `flag`, comm/device.h; a device Reducer
  // alone does anything here). order_by_flags: queues on the call's own
  // `stream` a wait until every rank's stream has reached this call
  // (flags[r]: rank r's block and the call's number, the same in each; `me`
  // this rank), and issues the steps after it on that stream, not the
  // Reducer's. finish_flagged: queues after the steps the signal to every
  // rank that this rank's share is written and the wait for every rank's,
  // and returns the steps to the Reducer's stream; nothing waits on the host.
  virtual void order_by_flags(std::span<const DeviceFlagsRef> flags, int me, Stream stream) {
    (void)flags, (void)me, (void)stream;
  }
  virtual void finish_flagged() {}

  // Whether the steps of the call just closed were left queued on the
  // device (finish_queued returned true, or finish_flagged queued them),
  // and the stream they are on; once per call (a device Reducer alone
  // leaves any). The peers' buffers they use stay mapped until they are
  // done (Transport::regions_used).
  virtual bool take_queued(Stream& stream) {
    (void)stream;
    return false;
  }
};

// kernels::cpu, in blocks that stay in L1/L2 between the reduction and the
// copies to the other destinations. Stateless apart from a per-thread
// block of scratch; one instance serves every communicator.
Reducer& host_reducer();

}  // namespace braid::comm
