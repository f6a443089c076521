"""braid's errors as Python sees them, on 2 ranks: every failure is a
RuntimeError carrying braid's message.

  - invalid usage (a dtype braid cannot reduce, a tag) fails at once, on the
    calling rank only, naming the operation;
  - rank 0 calling all_reduce while rank 1 calls all_gather fails on both,
    the message naming both calls, and so do all_to_all_single split sizes
    that disagree;
  - a group's `timeout` is honoured where it exceeds BRAID_TIMEOUT (set to
    2 s here): it was cut to BRAID_TIMEOUT; a call that runs past it names
    the group's timeout;
  - braid_torch.abort from a watchdog thread fails the running call at
    once, and the peer's next calls, naming the reason;
  - a peer that dies fails the survivor's call, naming the dead rank.
Each part runs on a group of its own (a failed call aborts its group).
"""
import datetime
import os
import threading
import time

os.environ["BRAID_TIMEOUT"] = "2"  # before braid reads its settings

import torch
import torch.distributed as dist

import braid_torch  # registers "braid"; braid_torch.abort
from check import Checks


def raises(fn):
    """The RuntimeError's message, or None when fn returned."""
    try:
        fn()
    except RuntimeError as error:
        return str(error)
    return None


def check_invalid_usage(c, rank):
    message = raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)))
    c.true("bool all_reduce refused", message is not None and "cannot reduce" in message, message)
    # By torch's name, not its number ("reduce op 8").
    message = raises(lambda: dist.all_reduce(torch.ones(4), op=dist._make_nccl_premul_sum(2.0)))
    c.true("PREMUL_SUM refused by name", message is not None and "PREMUL_SUM is not supported" in message, message)
    message = raises(lambda: dist.send(torch.ones(4), (rank + 1) % 2, tag=3))
    c.true("send tag refused", message is not None and "tag 3" in message, message)
    message = raises(lambda: dist.gather(torch.ones(4), None, dst=2))
    c.true("gather to a root out of range refused", message is not None and "root 2 is out of range" in message,
           message)
    # A transposed view went in memory order: the peer's contiguous tensor
    # got it permuted, with no error (gloo refuses it). channels_last, a
    # memory format of its own, passes.
    message = raises(lambda: dist.send(torch.arange(6.0).reshape(2, 3).t(), (rank + 1) % 2))
    c.true("send of a transposed view refused", message is not None and "contiguous" in message, message)
    message = raises(lambda: dist.recv(torch.empty(2, 3).t(), (rank + 1) % 2))
    c.true("recv into a transposed view refused", message is not None and "contiguous" in message, message)
    nhwc = torch.arange(24.0).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    if rank == 0:
        dist.send(nhwc, 1)
    else:
        got = torch.empty(1, 2, 3, 4).to(memory_format=torch.channels_last)
        dist.recv(got, 0)
        c.true("channels_last send and recv", torch.equal(got, nhwc), str(got))
    dist.barrier()  # the group still works after refusals made before any byte moved


def check_mismatch(c, rank):
    group = dist.new_group(backend="braid")
    t = torch.ones(16)
    if rank == 0:
        message = raises(lambda: dist.all_reduce(t, group=group))
    else:
        message = raises(lambda: dist.all_gather([torch.empty(16), torch.empty(16)], t, group=group))
    c.true("mismatch fails", message is not None, "no error")
    c.true("mismatch names both calls", message is not None and "all_reduce" in message and "all_gather" in message,
           message)


def check_gather_sizes(c, rank):
    """gather and scatter of tensors whose sizes differ across ranks fail,
    saying which braid call they ran as: the message named only braid's
    all_gather and broadcast, with counts the user never passed."""
    group = dist.new_group(backend="braid")
    got = [torch.empty(8) for _ in range(2)] if rank == 0 else None
    message = raises(lambda: dist.gather(torch.ones(8 + rank), got, dst=0, group=group))
    c.true("gather of unequal sizes says it ran as an all_gather",
           message is not None and "gather runs as an all_gather" in message and "count 9" in message, message)
    group = dist.new_group(backend="braid")
    parts = [torch.ones(8) for _ in range(2)] if rank == 0 else None
    message = raises(lambda: dist.scatter(torch.empty(8 + rank), parts, src=0, group=group))
    if rank == 0:  # the root of a one-shot broadcast may leave first: its next call fails
        message = message or raises(lambda: dist.barrier(group=group))
        c.true("scatter of unequal sizes fails the root", message is not None, "no error")
    else:
        c.true("scatter of unequal sizes says it ran as a broadcast of the whole list",
               message is not None and "scatter runs as a broadcast of the root's whole list" in message, message)


def check_unequal_splits(c, rank):
    """all_to_all_single whose split sizes disagree across ranks (rank 0
    sends rank 1 three rows, rank 1 expects one) fails on the receiver,
    naming both counts; the sender, whose own part arrived as it expected,
    fails at its next call on the group at the latest. The extra rows were
    cut off (or the missing ones zero-filled) with no error."""
    group = dist.new_group(backend="braid")
    sends, recvs = ([1, 3], [1, 1]) if rank == 0 else ([1, 1], [1, 1])
    out = torch.full((sum(recvs), 2), -1.0)
    message = raises(lambda: dist.all_to_all_single(out, torch.ones(sum(sends), 2), recvs, sends, group=group))
    if message is None and rank == 0:
        message = raises(lambda: dist.barrier(group=group))
    c.true("unequal splits that disagree fail", message is not None, "no error")
    if rank == 1:
        c.true("the receiver names both counts", message is not None and "count 2" in message and "count 6" in message,
               message)


def check_group_timeout(c, rank):
    group = dist.new_group(backend="braid", timeout=datetime.timedelta(seconds=10))
    if rank == 1:
        time.sleep(4)  # past BRAID_TIMEOUT, within the group's timeout
    message = raises(lambda: dist.all_reduce(torch.ones(4), group=group))
    c.true("a group timeout past BRAID_TIMEOUT is honoured", message is None, message)
    # The error names the timeout that ran out (it said BRAID_TIMEOUT).
    short = dist.new_group(backend="braid", timeout=datetime.timedelta(seconds=3))
    if rank == 1:
        time.sleep(5)
    message = raises(lambda: dist.all_reduce(torch.ones(4), group=short))
    if rank == 0:
        c.true("a timed-out call names the group's timeout", message is not None and
               "timed out (the process group's timeout)" in message, message)


def check_endless_timeout(c, rank):
    """A timeout of a thousand years, meant as "never", overflowed every
    deadline computed from it: the group's set-up failed at once."""
    message = raises(lambda: dist.all_reduce(
        torch.ones(4), group=dist.new_group(backend="braid", timeout=datetime.timedelta(days=365 * 1000))))
    c.true("a group timeout of a thousand years works", message is None, message)


def check_late_group(c, rank):
    """Rank 1 creates a group 4 s after rank 0, whose timeout for it is 2 s:
    each error says what happened under torch.distributed, not what to set
    under a launcher (MASTER_PORT, job tokens, --nproc-per-node)."""
    if rank == 1:
        time.sleep(4)
    message = raises(lambda: dist.new_group(backend="braid", timeout=datetime.timedelta(seconds=2)))
    if rank == 0:
        c.true("group rank 0 says the late rank has not reached new_group",
               message is not None and "not reached this init_process_group or new_group yet" in message and
               "--nproc-per-node" not in message, message)
    else:
        c.true("the late rank says group rank 0 gave up on the group",
               message is not None and "group rank 0 served it" in message and "MASTER_PORT" not in message,
               message)
    dist.barrier()


def check_abort(c, rank):
    """braid_torch.abort from a watchdog thread cuts rank 0's all_reduce
    short while rank 1 has not joined it (for 1.5 s; the group's timeout is
    20 s): rank 0's call fails within a second naming the reason, and rank
    1's next calls fail naming it too."""
    group = dist.new_group(backend="braid", timeout=datetime.timedelta(seconds=20))
    reason = "the watchdog gave up"
    if rank == 0:
        started = time.monotonic()
        work = dist.all_reduce(torch.ones(1 << 20), group=group, async_op=True)
        watchdog = threading.Timer(0.3, braid_torch.abort, args=(group, reason))
        watchdog.start()
        message = raises(work.wait)
        took = time.monotonic() - started
        watchdog.join()
        c.true("abort cuts the running call short",
               message is not None and "cut short: rank 0 aborted the communicator" in message and reason in message,
               message)
        c.true("abort acts within a second", took < 1.3, f"{took:.2f} s")
        message = raises(lambda: dist.barrier(group=group))
        c.true("a call after the abort fails", message is not None and reason in message, message)
    else:
        time.sleep(1.5)
        message = raises(lambda: [dist.all_reduce(torch.ones(1 << 20), group=group) for _ in range(2)])
        c.true("the peer's call names the abort", message is not None and
               "rank 0 aborted the communicator (Communicator::abort): " + reason in message, message)


def check_dead_peer(c, rank):
    group = dist.new_group(backend="braid")
    dist.barrier(group=group)
    if rank == 1:
        for failure in c.failures:
            print(f"rank {rank}: FAIL {failure}", flush=True)
        os._exit(1 if c.failures else 0)  # dies without a word to its peers
    started = time.monotonic()
    message = raises(lambda: dist.all_reduce(torch.ones(1 << 20), group=group))
    c.true("dead peer fails the call", message is not None, "no error")
    c.true("dead peer named", message is not None and "rank 1" in message, message)
    print(f"rank 0: dead peer noticed after {time.monotonic() - started:.2f} s: {message}", flush=True)


def main():
    dist.init_process_group("braid")
    rank = dist.get_rank()
    assert dist.get_world_size() == 2, "errors.py runs on 2 ranks"
    c = Checks(rank)
    check_invalid_usage(c, rank)
    check_mismatch(c, rank)
    check_gather_sizes(c, rank)
    check_unequal_splits(c, rank)
    check_group_timeout(c, rank)
    check_endless_timeout(c, rank)
    check_late_group(c, rank)
    check_abort(c, rank)
    check_dead_peer(c, rank)  # rank 1 exits here
    # Each rank reports for itself: rank 1 is gone, so no collective.
    for failure in c.failures:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    print(f"rank {rank}: {c.count} checks, {len(c.failures)} failed", flush=True)
    os._exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
