"""A process that exits (sys.exit) while a future callback of a braid group
still runs ends with its own status: CPython ends a thread that takes the
GIL during finalization with pthread_exit, and a completion thread doing so
aborted the process ("terminate called without an active exception", exit
134 after a job that had finished). braid_torch drains its groups at exit
(gloo's groups still abort so).
"""
import sys
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  registers "braid"


def main():
    dist.init_process_group("braid")
    rank = dist.get_rank()
    done = []
    dist.all_reduce(torch.ones(4), async_op=True).get_future().then(lambda fut: (time.sleep(0.5), done.append(1)))
    dist.all_reduce(torch.ones(4), async_op=True)  # held back, never waited for
    print(f"rank {rank}: exiting with a callback still running", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
