"""PyTorch DDP training tokens/s of the trainer's small GPT shape (4 layers,
4 heads, 128 wide, block 128, global batch 16) on braid and on gloo in the
same run, and of one process alone (issue 16's second target).

  braid-launch --nproc-per-node 2 -- /usr/bin/python3 tests/torch/bench_ddp.py
  /usr/bin/python3 tests/torch/bench_ddp.py --single
      one process, one thread, the per-rank batch (16 / 2): twice its
      tokens/s is what 2 ranks would reach with free communication
(PYTHONPATH=<build>/python.) Each rank computes with one thread, as
braid-launch and torchrun set OMP_NUM_THREADS=1.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from torch_gpt import Gpt  # noqa: E402

L, H, C, T, GLOBAL_BATCH = 4, 4, 128, 128, 16


def tokens_per_second(model, batch, steps, warmup):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * x.numel() / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--single", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    data = torch.randint(0, 256, (GLOBAL_BATCH, T + 1), generator=torch.Generator().manual_seed(7))
    if a.single:
        torch.manual_seed(1337)
        rate = tokens_per_second(Gpt(L, H, C, T, naive=True), data[:GLOBAL_BATCH // 2], a.steps, a.warmup)
        print(f"1 process, batch {GLOBAL_BATCH // 2}: {rate:.0f} tokens/s (x2 = {2 * rate:.0f})")
        return
    import braid_torch  # noqa: F401  registers "braid"
    dist.init_process_group("braid")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    rates = {"braid": [], "gloo": []}
    for _ in range(a.rounds):
        for name, group in (("braid", None), ("gloo", gloo)):
            torch.manual_seed(1337)
            model = DDP(Gpt(L, H, C, T, naive=True), process_group=group)
            local = tokens_per_second(model, data[rank * per_rank:(rank + 1) * per_rank], a.steps, a.warmup)
            total = torch.tensor([local])
            dist.all_reduce(total, group=gloo)
            rates[name].append(float(total))
    if rank == 0:
        for name, values in rates.items():
            print(f"DDP on {name:5}, {size} ranks: {max(values):.0f} tokens/s "
                  f"(rounds: {', '.join(f'{v:.0f}' for v in values)})")
        print(f"braid / gloo: {max(rates['braid']) / max(rates['gloo']):.2f}x")


if __name__ == "__main__":
    main()
