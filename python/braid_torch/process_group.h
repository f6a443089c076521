// ProcessGroupBraid: braid as a torch.distributed backend (c10d::ProcessGroup
// of torch 1.13), registered from Python as "braid" (braid_torch/__init__.py).
//
// Each process group owns one braid Communicator, created at construction
// through torch's store (rendezvous.h). Every operation validates its
// tensors, issues one braid call (in issue order; a collective may be held
// back a moment, process_group.cc: Issuer) and
// returns a Work whose future completes when braid's call has (work.h).
// Where torch's layout differs from braid's (a list of per-rank tensors, a
// coalesced list) the call goes through one contiguous staging tensor,
// reused from call to call (staging.h), unless the list's tensors already
// lie one after another in one tensor's memory (list(t.chunk(n))): braid
// then reads or writes that memory in place. Gather and scatter are an
// all-gather and a broadcast. Tensors must be dense, in any memory format for the calls
// that take one tensor (tensors.h: check_dense), contiguous for the flat
// _base calls and alltoall_base; CPU tensors of every dtype move,
// and float32/64, float16, bfloat16, int8, uint8, int32 and int64 reduce
// with SUM, AVG, PRODUCT, MIN and MAX. CUDA tensors go through braid's
// device path on the device's default stream (braid's CUDA builds).
// While the process has two or more groups no call runs in the caller's
// thread (Communicator::set_inline), so async calls on two groups may be
// issued in different orders on different ranks, as gloo allows.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "braid/communicator.h"
#include "rendezvous.h"
#include "staging.h"
#include "work.h"

namespace braid::torch_backend {

struct Buffer;  // tensors.h

// Issues a group's calls in order, holding back a collective for a moment
// while the group is the process's only one, and deferring a call that must
// wait for earlier ones (`hazards`) until they have finished, with every
// later call behind it (process_group.cc says why).
class Issuer final : public CallRelease {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kHoldTime{1};
  using Hazards = std::vector<std::shared_ptr<Completion>>;

  // `timeout` bounds a device call's wait for deferred calls (issue()).
  Issuer(comm::Communicator& comm, Completer& completer, std::chrono::milliseconds timeout);
  Issuer(const Issuer&) = delete;
  Issuer& operator=(const Issuer&) = delete;

  // Whether this is the process's only group: calls may then run in the
  // caller's thread, and collectives are held.
  void set_alone(bool alone);
  Completer& completer() { return completer_; }
  // Issues the held call, if any.
  void release_held();
  // Issues the call (after the held one); holds it instead when it may be,
  // and defers it while any of its hazards has not finished or an earlier
  // call is deferred. `find_hazards` names them, and enters the call among
  // the calls in flight, under the issue lock: so the calls a call waits
  // for are always before it in issue order (two threads issuing on one
  // group each found the other's call first, and both waited for good). A
  // device call (`on_device`: braid takes its stream's order as it is
  // issued) is never deferred: it waits here instead.
  void issue(std::function<comm::Work()> issue, Pending pending, bool holdable, bool on_device,
             std::function<Hazards()> find_hazards);
  void run_here(const std::shared_ptr<Completion>& completion) override;
  void release(const std::shared_ptr<Completion>& completion) override;
  // Waits, up to `limit`, until no call is deferred; whether it got there.
  bool wait_undeferred(std::chrono::milliseconds limit);
  // Issues the held call and the deferred ones (as their hazards finish),
  // then ends the holding thread; later calls are issued at once.
  void stop();

 private:
  struct Held {
    std::function<comm::Work()> issue;
    Pending pending;
    Clock::time_point due;
  };
  struct Deferred {
    std::function<comm::Work()> issue;
    Pending pending;
    Hazards hazards;
  };
  // The issue closures the issue lock's holder let go of, dropped once it
  // is let go (a Spent declared before the lock dies after it): a copy-in
  // closure may hold the last reference to a Python tensor, whose release
  // takes the GIL, which a thread waiting for mutex_ may hold
  // (is_completed() polled in another thread hung).
  class Spent {
   public:
    Spent() = default;
    ~Spent() { let_go(); }
    Spent(const Spent&) = delete;
    Spent& operator=(const Spent&) = delete;
    void drop(std::function<comm::Work()> closure) { closures_.push_back(std::move(closure)); }
    bool empty() const { return closures_.empty(); }
    void let_go() { closures_.clear(); }

   private:
    std::vector<std::function<comm::Work()>> closures_;
  };
  void release_locked(Spent& spent);
  // On the progress thread; one that fails goes to the completion threads
  // failed (CompletionQueue::push_failed).
  void issue_off_thread(std::function<comm::Work()> issue, Pending pending, Spent& spent);
  [[noreturn]] void refuse_locked(Pending& pending, std::exception_ptr error);
  bool front_ready_locked();
  void issue_ready_locked(Spent& spent);
  void call_finished();  // a completion thread finished a call
  std::exception_ptr issue_unlocked(std::unique_lock<std::mutex>& lock, const std::function<comm::Work()>& issue,
                                    Pending& pending);
  void hold_loop();

  comm::Communicator& comm_;
  Completer& completer_;
  const std::chrono::milliseconds timeout_;
  std::atomic<bool> alone_{false};
  std::mutex mutex_;  // with issuing_, the issue lock: calls reach braid and the completer in order
  std::condition_variable hold_cv_;
  std::condition_variable issued_cv_;  // issuing_ went false
  std::condition_variable undeferred_cv_;  // deferred_ may have emptied, or a hazard finished
  std::optional<Held> held_;
  std::deque<Deferred> deferred_;  // in issue order
  std::size_t waiting_callers_ = 0;  // threads waiting on undeferred_cv_
  // A call is being issued with mutex_ let go (issue_unlocked), or a device
  // call waits for the deferred ones: later callers wait behind it.
  bool issuing_ = false;
  bool stopping_ = false;
  bool hold_thread_idle_ = false;  // in its untimed wait: a held call must wake it
  std::thread thread_;  // last: started once the rest is made
};

class ProcessGroupBraid : public c10d::ProcessGroup {
 public:
  // Host bytes, from the first to past the last (InFlight).
  using Span = std::pair<const std::byte*, const std::byte*>;
  // Blocks until every rank of the group has connected (at most `timeout`,
  // which every later wait of the group takes too; BRAID_TIMEOUT where it
  // is 0).
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  ~ProcessGroupBraid() override;

  const std::string getBackendName() const override { return "braid"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  // braid has no gather or scatter: gather is an all-gather whose result
  // only the root keeps, scatter a broadcast of the root's whole list of
  // which each rank keeps its part (N times the bytes; rarely hot).
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // braid's view of the group: "shm", "tcp", "shm+tcp".
  std::string transport_summary() const { return comm_->transport_summary(); }
  // Communicator::abort: the call running fails at its next wait, queued
  // and later ones at once, the peers at their next wait on this rank; any
  // thread (a watchdog's).
  void abort(const std::string& reason) { comm_->abort(reason); }
  // Host staging blocks the group has mapped so far (staging.h).
  std::size_t staging_blocks_mapped() const { return staging_.blocks_mapped(); }

 private:
  // One call: copy_in() then issue() run braid's call under the issue lock
  // (so the completion thread sees calls in braid's issue order); finish()
  // runs on the completion thread after it succeeded.
  struct Call {
    c10d::OpType type;
    std::function<comm::Work()> issue;
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> keep_alive;
    std::function<void()> finish;
    // For a call braid runs as another (gather as an all_gather): said in
    // front of its errors, which name braid's call and its counts.
    std::string runs_as;
    int source_rank = -1;  // a receive's peer (Work::sourceRank)
    // The backend's own copies of host tensors the call reads (into staging,
    // a copy of an input, all_to_all's part for this rank), made as the
    // call is issued, just before braid's call (copies_in sets it).
    std::function<void()> copy_in;
    // Sets copy_in, which reads `read` (those not already in `outputs`):
    // they join keep_alive, so that they live until it has run and their
    // bytes count among the call's (its hazards).
    void copies_in(std::function<void()> copy, const std::vector<at::Tensor>& read) {
      copy_in = std::move(copy);
      keep_alive.insert(keep_alive.end(), read.begin(), read.end());
    }
  };
  c10::intrusive_ptr<c10d::Work> enqueue(Call call);
  // A call (`reduces`: one that reduces) on `tensors` that are views with
  // gaps, as gloo takes them (allreduce_coalesced's, or the one tensor of
  // allreduce, broadcast or reduce): run(buffer) on a flat copy of them,
  // copied in as the call is issued and back once it has run.
  c10::intrusive_ptr<c10d::Work> through_flat_copy(c10d::OpType type, const std::vector<at::Tensor>& tensors,
                                                   const char* op, bool reduces,
                                                   const std::function<std::function<comm::Work()>(Buffer)>& run);
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  bool by_messages(const at::Tensor& tensor);
  c10::intrusive_ptr<c10d::Work> gather_by_messages(const at::Tensor& input, std::vector<at::Tensor> results, int root);
  c10::intrusive_ptr<c10d::Work> scatter_by_messages(const at::Tensor& output, std::vector<at::Tensor> parts, int root);
  c10::intrusive_ptr<c10d::Work> gather_list(c10d::OpType type, const char* op, const at::Tensor& input,
                                             std::vector<at::Tensor> results, std::string runs_as);
  c10::intrusive_ptr<c10d::Work> alltoall_unequal(at::Tensor& output, at::Tensor& input,
                                                  const std::vector<int64_t>& output_splits,
                                                  const std::vector<int64_t>& input_splits);
  // One peer's part of an all_to_all run as sends and receives (exchange):
  // the bytes sent to it and where its bytes land, in counts of the call's
  // dtype.
  struct Part {
    const std::byte* from = nullptr;
    std::byte* into = nullptr;
    std::size_t send_count = 0, recv_count = 0;
  };
  std::function<comm::Work()> exchange(std::vector<Part> parts, DataType dtype);
  static void copy_own(const Part& own, std::size_t unit_bytes) {
    if (own.send_count) std::memcpy(own.into, own.from, own.send_count * unit_bytes);
  }
  // The backend's own copies (Call::copy_in, and copies out in `finish`,
  // made on the completion thread once braid's call has completed) run
  // outside braid's order. So a call waits, deferred by the Issuer, for
  // the earlier calls in flight on the same host bytes (its hazards): every
  // one where it copies in, those that copy out otherwise. braid orders its
  // own reads and writes.
  struct InFlight {
    std::shared_ptr<Completion> completion;
    std::vector<Span> spans;  // host bytes its tensors lie in
    bool copies_out = false;
  };
  // Enters `call` among the calls in flight; its hazards (called under the
  // issue lock: Issuer::issue).
  Issuer::Hazards enter_in_flight(InFlight call, bool copies_in);
  std::mutex in_flight_mu_;
  std::vector<InFlight> in_flight_;

  // Destroyed in reverse: the completer drains first, then the
  // communicator closes, then rank 0's store stops, and last torch's store
  // is let go: held as gloo's group holds it, since the default group's
  // TCPStore server dies with its last holder, and ranks still in
  // new_group's store barrier failed with a broken pipe once rank 0 had
  // destroyed the default group.
  c10::intrusive_ptr<c10d::Store> torch_store_;
  StagingPool staging_;  // its blocks outlive it where a Work does
  std::unique_ptr<runtime::StoreServer> store_server_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<Completer> completer_;
  std::shared_ptr<Issuer> issuer_;  // Works keep it; stopped by the destructor
};

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout);

// At the interpreter's exit (atexit, __init__.py), without the GIL: waits,
// up to `limit` in all, until no group of the process has a call in flight
// or a future callback running. A callback that still ran (or let go of its
// Python objects) as the interpreter finalized took the GIL from a thread
// CPython then ends with pthread_exit, which aborts the process ("terminate
// called without an active exception", exit 134 after a job that had
// finished); gloo's worker threads do the same.
void quiesce(std::chrono::milliseconds limit);

}  // namespace braid::torch_backend
