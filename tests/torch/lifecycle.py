"""A braid group's life around torch's own objects, on 2 ranks:
- destroy_process_group() while a Python .then() callback of a call is still
  to run returns (it hung for good: the group joined its completion thread
  while holding the GIL, which the callback needed to run);
- a group made by new_group() outlives the default group's destruction (the
  TCPStore server went with the default group, held by nothing of braid's,
  and a rank still in new_group's store barrier failed with a broken pipe);
- twelve callbacks that each wait for a call they issue all finish (the
  eight completion threads all waited, none was left to take a call, and
  the job hung for good, past the group's timeout);
- a group ended while another thread waits for its call, whose peer is
  late, ends once that call has (the waiting thread ran the call held back
  for it, and the group's end freed the communicator under it: SIGSEGV);
- a group whose last reference a callback of its own call holds ends on
  the completion thread that ran the callback (the process aborted).
A hang fails the rank (faulthandler) rather than the test's timeout.
"""
import faulthandler
import gc
import os
import threading
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  registers "braid"


def main():
    faulthandler.dump_traceback_later(60, exit=True)
    dist.init_process_group("braid")
    rank, size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="braid")
    last = dist.new_group(backend="braid")  # its last reference goes in a callback (below)
    t = torch.ones(1 << 16) * (rank + 1)
    summed = dist.all_reduce(t, async_op=True).get_future().then(lambda fut: fut.value()[0].sum().item())
    dist.destroy_process_group()  # the default group; `group` is still held
    failures = []
    want = float(sum(range(1, size + 1)) * (1 << 16))
    if summed.wait() != want:
        failures.append(f"the callback's sum is {summed.wait()}, not {want}")
    u = torch.ones(3) * (rank + 1)
    dist.all_reduce(u, group=group)
    if u.tolist() != [float(sum(range(1, size + 1)))] * 3:
        failures.append(f"all_reduce on the new group after the default group's end gave {u.tolist()}")

    def issue_and_wait(_):
        x = torch.ones(4)
        dist.all_reduce(x, group=group)
        return x[0].item()

    chained = [dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().then(issue_and_wait)
               for _ in range(12)]
    values = [f.wait() for f in chained]
    if values != [float(size)] * 12:
        failures.append(f"twelve callbacks that each wait for a call gave {values}")
    # A group whose last reference a callback of its own call holds ends on
    # the completion thread that ran it: it joined that very thread, and
    # the process aborted ("terminate called without an active exception";
    # a review helper's find).
    work = dist.all_reduce(torch.ones(4), group=last, async_op=True)
    if rank == 0:
        time.sleep(0.5)  # rank 1's callback then runs on a completion thread
    ran = []

    def keeping(grp):
        def callback(_):
            time.sleep(0.3)
            ran.append(grp.rank())
        return callback
    after = work.get_future().then(keeping(last))
    del last, work  # torch let go of it with the default group
    gc.collect()
    after.wait()
    time.sleep(0.5)  # the group ends meanwhile, on that thread
    if ran != [rank]:
        failures.append(f"a callback holding its group's last reference ran {ran}")
    v = torch.ones(16) * (rank + 1)
    if rank == 0:
        work = dist.all_reduce(v, group=group, async_op=True)
        waited = []
        waiter = threading.Thread(target=lambda: waited.append(work.wait()))
        waiter.start()
        time.sleep(0.5)  # the waiter runs the call, which waits for rank 1
        del group  # torch let it go with the default group: this ends it
        gc.collect()
        waiter.join(30)
        if not waited or v.tolist() != [float(sum(range(1, size + 1)))] * 16:
            failures.append(f"a call waited for in another thread as its group ended gave {v.tolist()}")
    else:
        time.sleep(2)
        dist.all_reduce(v, group=group)
    for failure in failures:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    print(f"rank {rank}: {5 - len(failures)} of 5 checks passed", flush=True)
    faulthandler.cancel_dump_traceback_later()
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    main()
