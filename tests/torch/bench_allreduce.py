"""torch.distributed.all_reduce of 64 MiB float32 on braid and on gloo in the
same run (issue 16's first target), printed as nccl-tests' bus bandwidth
(2 (n-1)/n x bytes / time). braid is the default group, gloo a second one;
the two alternate in rounds so that both see the same machine.

  braid-launch --nproc-per-node 2 -- /usr/bin/python3 tests/torch/bench_allreduce.py
  (PYTHONPATH=<build>/python; --mib and --iters change the size and count)
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  registers "braid"


def seconds_per_call(tensor, group, iters):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    return (time.perf_counter() - start) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    dist.init_process_group("braid")
    gloo = dist.new_group(backend="gloo")
    n = dist.get_world_size()
    tensor = torch.ones(a.mib * 2**20 // 4)
    nbytes = tensor.numel() * 4
    busbw = {"braid": [], "gloo": []}
    for name, group in (("braid", None), ("gloo", gloo)):
        seconds_per_call(tensor, group, 2)  # warm-up: connections, buffers
    for _ in range(a.rounds):
        for name, group in (("braid", None), ("gloo", gloo)):
            busbw[name].append(2 * (n - 1) / n * nbytes / seconds_per_call(tensor, group, a.iters) / 1e9)
    if dist.get_rank() == 0:
        for name, values in busbw.items():
            print(f"{name:5} all_reduce {a.mib} MiB float32 on {n} ranks: busbw median "
                  f"{statistics.median(values):.2f} GB/s (rounds: {', '.join(f'{v:.2f}' for v in values)})")
        ratio = statistics.median(busbw["braid"]) / statistics.median(busbw["gloo"])
        print(f"braid / gloo busbw: {ratio:.2f}x (transports: {braid_torch.transport_summary()})")


if __name__ == "__main__":
    main()
