"""braid's errors as Python sees them, on 2 ranks: every failure is a
RuntimeError carrying braid's message.

  - invalid usage (a dtype braid cannot reduce, a tag) fails at once, on the
    calling rank only, naming the operation;
  - rank 0 calling all_reduce while rank 1 calls all_gather fails on both,
    the message naming both calls;
  - a peer that dies fails the survivor's call, naming the dead rank.
Each part runs on a group of its own (a failed call aborts its group).
"""
import os
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  registers "braid"
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
    message = raises(lambda: dist.send(torch.ones(4), (rank + 1) % 2, tag=3))
    c.true("send tag refused", message is not None and "tag 3" in message, message)
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
    check_dead_peer(c, rank)  # rank 1 exits here
    # Each rank reports for itself: rank 1 is gone, so no collective.
    for failure in c.failures:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    print(f"rank {rank}: {c.count} checks, {len(c.failures)} failed", flush=True)
    os._exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
