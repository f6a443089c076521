"""PyTorch's own DistributedDataParallel (plain, and with the PowerSGD comm
hook, whose callbacks wait on the futures of collectives they issue) and
ZeroRedundancyOptimizer train the same model from the same seed to the same
losses on braid as on gloo.

The default group is braid (dist.init_process_group("braid")); gloo is a
second group over the same ranks. Each run builds the GPT of
scripts/torch_gpt.py (a small shape, for time) from one seed, feeds every
rank its slice of one global batch at every step, and records each step's loss;
then the final parameters are compared too. braid and gloo sum the same
gradients in possibly different orders, hence a float tolerance.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import braid_torch  # noqa: F401  registers "braid"
from check import Checks, gloo_group

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from torch_gpt import Gpt  # noqa: E402

L, H, C, T = 2, 2, 32, 32   # layers, heads, width, block
GLOBAL_BATCH, STEPS = 8, 6


def train(group, how, rank, size):
    """Losses of STEPS steps on `group`, and the final parameters as one vector."""
    torch.manual_seed(1337)
    model = DDP(Gpt(L, H, C, T, naive=True), process_group=group, bucket_cap_mb=1)
    zero = how == "ZeroRedundancyOptimizer"
    if how == "DDP with PowerSGD":
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      process_group=group, lr=3e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    per_rank = GLOBAL_BATCH // size
    data = torch.randint(0, 256, (GLOBAL_BATCH, T + 1), generator=torch.Generator().manual_seed(7))
    batch = data[rank * per_rank:(rank + 1) * per_rank]  # one batch, again each step: the loss must fall
    losses = []
    for _ in range(STEPS):
        loss = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    dist.init_process_group("braid")
    rank, size = dist.get_rank(), dist.get_world_size()
    c = Checks(rank)
    for name in ("DDP", "DDP with PowerSGD", "ZeroRedundancyOptimizer"):
        braid_losses, braid_params = train(None, name, rank, size)
        gloo_losses, gloo_params = train(gloo_group(), name, rank, size)
        c.equal(f"{name} losses", braid_losses, gloo_losses, rtol=1e-5, atol=1e-6)
        c.equal(f"{name} final parameters", braid_params, gloo_params, rtol=1e-4, atol=1e-6)
        c.true(f"{name} learns", bool(braid_losses[-1] < braid_losses[0]), f"losses {braid_losses.tolist()}")
        print(f"rank {rank}: {name} losses braid {[round(x, 5) for x in braid_losses.tolist()]} "
              f"max |braid - gloo| {float((braid_losses - gloo_losses).abs().max()):.2e}", flush=True)
    c.finish()


if __name__ == "__main__":
    main()
