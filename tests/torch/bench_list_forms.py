"""The list forms of all_gather, reduce_scatter and (braid only) all_to_all
against the flat forms (all_gather_into_tensor, _reduce_scatter_base,
all_to_all_single), in ms per call, for lists of
separate tensors (staged through a reused block) and lists that are chunks of
one tensor (read or written in place). Run on braid or, for comparison, on
another backend that has the flat forms.

  braid-launch --nproc-per-node 2 -- /usr/bin/python3 tests/torch/bench_list_forms.py [braid]
  (PYTHONPATH=<build>/python)
"""
import sys
import time
import warnings

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  registers "braid"


def ms_per_call(fn, iters=5):
    # Two calls first: the first form timed at a size used to carry that
    # size's first-use costs (fresh pages; until f506162 the pool could map
    # a second staging block on the second call), which read as a 64 MiB
    # list all_gather 4-7x the flat form, where it costs the flat form plus
    # a copy.
    fn()
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier()
    return (time.perf_counter() - start) / iters * 1e3


def main():
    warnings.filterwarnings("ignore", message=".*_reduce_scatter_base is a private function")
    backend = sys.argv[1] if len(sys.argv) > 1 else "braid"
    dist.init_process_group(backend)
    n, rank = dist.get_world_size(), dist.get_rank()
    for mib in (1, 16, 64):
        e = mib * 2**20 // 4
        x = torch.full((e,), float(rank + 1))
        separate = [torch.empty(e) for _ in range(n)]
        whole = torch.empty(n * e)
        chunks = list(whole.chunk(n))
        inputs = [torch.ones(e) for _ in range(n)]
        whole_in = torch.ones(n * e)
        chunks_in = list(whole_in.chunk(n))
        out = torch.empty(e)
        row = {
            "all_gather list": ms_per_call(lambda: dist.all_gather(separate, x)),
            "chunks": ms_per_call(lambda: dist.all_gather(chunks, x)),
            "flat": ms_per_call(lambda: dist.all_gather_into_tensor(whole, x)),
            "reduce_scatter list": ms_per_call(lambda: dist.reduce_scatter(out, inputs)),
            "chunks ": ms_per_call(lambda: dist.reduce_scatter(out, chunks_in)),
            "flat ": ms_per_call(lambda: dist._reduce_scatter_base(out, whole_in)),
        }
        if backend == "braid":  # gloo has no all_to_all of lists
            a2a_in = [torch.ones(e // n) for _ in range(n)]
            a2a_out = [torch.empty(e // n) for _ in range(n)]
            a2a_flat_out = torch.empty(e)
            row["all_to_all list"] = ms_per_call(lambda: dist.all_to_all(a2a_out, a2a_in))
            row["single"] = ms_per_call(lambda: dist.all_to_all_single(a2a_flat_out, x))
        if rank == 0:
            print(f"{backend} {mib} MiB per rank, {n} ranks: " +
                  "; ".join(f"{k.strip()} {v:.1f} ms" for k, v in row.items()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
