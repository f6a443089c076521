"""Every operation of the braid backend against gloo's result on the same
inputs, on however many ranks the launcher starts (tests/torch/meson.build:
2 and 4 under torchrun, 3 under braid-launch).

braid is the default group (dist.init_process_group("braid")); gloo is a
second group over the same ranks. Inputs are small integers, so sums,
products, minima and maxima are exact in every dtype and the results must be
equal; where gloo lacks an operation (bfloat16, AVG, reduce-scatter,
all-gather into one tensor) the reference is gloo's nearest operation
(float32, SUM / size, all-reduce then slice, all-gather then cat), and
dtypes gloo cannot move (bool, int16, complex) go to gloo as their bytes.
"""
import datetime
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist

import braid_torch
from check import Checks, gloo_group

REDUCED = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
           torch.int8, torch.uint8, torch.int32, torch.int64]
MOVED = [torch.float32, torch.bool, torch.int16, torch.complex64]
COUNTS = [1, 13, 4099]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def values(count, rank, dtype, op="sum", salt=0):
    """Small integers that differ per rank and element; 1 or 2 for products."""
    i = torch.arange(count, dtype=torch.int64) + 7 * salt
    v = (i + rank) % 2 + 1 if op == "product" else (i * 3 + rank * 5) % 11
    if dtype == torch.bool:
        return v % 2 == 1
    if dtype.is_complex:
        return torch.complex(v.float(), -v.float()).to(dtype)
    return v.to(dtype)


def gloo_bytes(t):
    """t as gloo can move it: gloo refuses bool, int16 and complex, so those as their bytes."""
    return t.view(torch.uint8) if t.dtype in (torch.bool, torch.int16, torch.complex64) else t


def gloo_all_reduce(t, op):
    """gloo's all-reduce of t; bfloat16 through float32 (exact for these values)."""
    ref = t.float() if t.dtype == torch.bfloat16 else t.clone()
    dist.all_reduce(ref, op=op, group=gloo_group())
    return ref.to(t.dtype)


def within(seconds, rank, what, fn):
    """Runs fn in a thread; a hang fails the rank with `what` (os._exit,
    since a stuck thread cannot be stopped). Returns fn's result."""
    result = []
    waiter = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    waiter.start()
    waiter.join(timeout=seconds)
    if waiter.is_alive():
        print(f"rank {rank}: FAIL {what}: hangs ({seconds} s)", flush=True)
        os._exit(1)
    return result[0] if result else None


def check_all_reduce(c, rank, size):
    for dtype in REDUCED:
        for name, op in OPS.items():
            for count in COUNTS:
                t = values(count, rank, dtype, name)
                want = gloo_all_reduce(t, op)
                dist.all_reduce(t, op=op)
                c.equal(f"all_reduce {name} {dtype} x{count}", t, want)
        if dtype.is_floating_point:
            t = values(4099, rank, dtype)
            want = (gloo_all_reduce(t, dist.ReduceOp.SUM).double() / size).to(dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            c.equal(f"all_reduce avg {dtype}", t, want, rtol=1e-2 if torch.finfo(dtype).bits == 16 else 1e-6)


def check_sparse(c, rank, size):
    """Sparse tensors summed as gloo sums them: ranks holding different
    numbers of entries (rank 1 none), repeated indices, dense trailing
    dimensions; and DDP over nn.Embedding(sparse=True)."""
    def tensors():
        n = 0 if rank == 1 else rank + 2
        idx = torch.tensor([[(3 * i + rank) % 7 for i in range(n)] + [0] * (rank == 0),
                            [i % 2 for i in range(n)] + [1] * (rank == 0)], dtype=torch.int64)
        flat = torch.sparse_coo_tensor(idx, torch.arange(idx.shape[1], dtype=torch.float32) + rank, (7, 2))
        hybrid = torch.sparse_coo_tensor(idx[:1], torch.ones(idx.shape[1], 3) * (rank + 1), (7, 3))
        return flat, hybrid
    for name, (got, want) in zip(("2-d", "hybrid"), zip(tensors(), tensors())):
        dist.all_reduce(want, group=gloo_group())
        dist.all_reduce(got)
        c.equal(f"sparse all_reduce {name}", got.to_dense(), want.to_dense())
        c.true(f"sparse all_reduce {name} stays sparse", got.is_sparse, got.layout)
    models = []
    for group in (gloo_group(), None):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(10, 4, sparse=True), process_group=group)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(torch.tensor([rank + step, 5])).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        models.append(model.module.weight.detach().clone())
    c.equal("DDP over a sparse embedding", models[1], models[0])


def check_coalesced(c, rank, size):
    for dtype in (torch.float32, torch.int64):
        tensors = [values(n, rank, dtype, salt=n) for n in (5, 1, 300)]
        want = [t.clone() for t in tensors]
        dist.all_reduce_coalesced(want, group=gloo_group())
        dist.all_reduce_coalesced(tensors)
        c.equal(f"all_reduce_coalesced {dtype}", tensors, want)
    # Views with gaps and transposed views, as gloo takes them (braid
    # refused them, though they go through a flat copy); the gaps stay.
    backing = values(20, rank, torch.float32)
    views = [backing[::2], values(12, rank, torch.float32, salt=1).reshape(3, 4).t()]
    want = [gloo_all_reduce(v.contiguous(), dist.ReduceOp.SUM) for v in views]
    gaps = backing[1::2].clone()
    dist.all_reduce_coalesced(views)
    c.equal("all_reduce_coalesced of views with gaps", views, want)
    c.equal("all_reduce_coalesced left the gaps alone", backing[1::2], gaps)


def check_broadcast_reduce(c, rank, size):
    for root in sorted({0, size - 1}):
        for dtype in MOVED:
            t = values(4099, rank, dtype).reshape(-1, 1)
            want = t.clone()
            dist.broadcast(gloo_bytes(want), src=root, group=gloo_group())
            dist.broadcast(t, src=root)
            c.equal(f"broadcast root {root} {dtype}", t, want)
        for dtype in (torch.float32, torch.int32):
            for name in ("sum", "max"):
                t = values(4099, rank, dtype)
                want = t.clone()
                dist.reduce(want, dst=root, op=OPS[name], group=gloo_group())
                dist.reduce(t, dst=root, op=OPS[name])
                if rank == root:
                    c.equal(f"reduce root {root} {name} {dtype}", t, want)


def check_all_gather(c, rank, size):
    for dtype in MOVED:
        for count in (1, 13):
            t = values(count, rank, dtype)
            want = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather([gloo_bytes(w) for w in want], gloo_bytes(t), group=gloo_group())
            got = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(got, t)
            c.equal(f"all_gather {dtype} x{count}", got, want)
            out = torch.empty(size * count, dtype=dtype)
            dist.all_gather_into_tensor(out, t)
            c.equal(f"all_gather_into_tensor {dtype} x{count}", out, torch.cat(want))
    # The input inside the output, at another rank's part than its own (not
    # braid's in-place form, which is each rank's own): read from a copy on
    # every rank. Refused on some ranks only, it left the others waiting.
    count = 5
    t = values(count, rank, torch.float32)
    want = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(want, t, group=gloo_group())
    out = torch.empty(size * count)
    at = (rank + 1) % size * count
    out[at:at + count] = t
    dist.all_gather_into_tensor(out, out[at:at + count])
    c.equal("all_gather_into_tensor with the input at another rank's part", out, torch.cat(want))


def check_gather_scatter(c, rank, size):
    # 13 elements: as an all_gather or a broadcast; from 256 KiB per rank on,
    # as messages between the root and each rank (process_group.cc).
    for root, dtype, n in [(r, d, n) for r in sorted({0, size - 1}) for d in (torch.float32, torch.bool)
                           for n in (13, 70001 if d == torch.float32 else 270001)]:
        if True:
            t = values(n, rank, dtype)
            want = [torch.empty_like(t) for _ in range(size)] if rank == root else None
            dist.gather(gloo_bytes(t), [gloo_bytes(w) for w in want] if want else None, dst=root,
                        group=gloo_group())
            got = [torch.empty_like(t) for _ in range(size)] if rank == root else None
            dist.gather(t, got, dst=root)
            if rank == root:
                c.equal(f"gather root {root} {dtype} x{n}", got, want)
            parts = [values(n, rank, dtype, salt=p) for p in range(size)] if rank == root else None
            want, got = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.scatter(gloo_bytes(want), [gloo_bytes(p) for p in parts] if parts else None, src=root,
                         group=gloo_group())
            dist.scatter(got, parts, src=root)
            c.equal(f"scatter root {root} {dtype} x{n}", got, want)
    # Large, through staging: results and parts as views with gaps.
    n = 70001
    root = size - 1
    t = values(n, rank, torch.float32)
    want = [torch.empty(n) for _ in range(size)] if rank == root else None
    dist.gather(t, want, dst=root, group=gloo_group())
    got = [torch.empty(2 * n)[::2] for _ in range(size)] if rank == root else None
    dist.gather(t, got, dst=root)
    if rank == root:
        c.equal("gather x70001 views with gaps", [g.contiguous() for g in got], want)
    parts = [values(2 * n, rank, torch.float32, salt=p)[::2] for p in range(size)] if rank == root else None
    want = torch.empty(n)
    dist.scatter(want, [p.contiguous() for p in parts] if parts else None, src=root, group=gloo_group())
    got = torch.empty(n)
    dist.scatter(got, parts, src=root)
    c.equal("scatter x70001 views with gaps", got, want)


def check_reduce_scatter(c, rank, size):
    for dtype in (torch.float32, torch.float16, torch.int64):
        for name, op in OPS.items():
            count = 13
            whole = values(size * count, rank, dtype, name)
            want = gloo_all_reduce(whole, op).narrow(0, rank * count, count)
            got = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(got, list(whole.split(count)), op=op)
            c.equal(f"reduce_scatter {name} {dtype}", got, want)
            got = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(got, whole, op=op)
            c.equal(f"reduce_scatter_tensor {name} {dtype}", got, want)
    # The output at the next rank's part of the input: not braid's in-place
    # forms (this rank's part, or the start) except where that part is the
    # start, so some ranks refused it and the others waited. Read from a copy.
    count = 7
    whole = values(size * count, rank, torch.float32)
    want = gloo_all_reduce(whole, dist.ReduceOp.SUM).narrow(0, rank * count, count)
    at = (rank + 1) % size * count
    dist.reduce_scatter_tensor(whole[at:at + count], whole)
    c.equal("reduce_scatter_tensor with the output at another rank's part", whole[at:at + count], want)


def check_list_forms(c, rank, size):
    """The list forms through their two paths: outputs or inputs that lie one
    after another in one tensor (list(t.chunk(n))) are written or read in
    place, in place too where the input is this rank's part; other lists go
    through a staging block (over 64 KiB: from a pool, reused). Eight async
    calls in flight at once each need their own block, and a second round
    reuses the first's: a block handed out twice, or back on the shelf while
    its call still ran, mixes their values. Inputs are left as they were."""
    big = 20000  # 80 KB of float32 per rank: staged through the pool
    for count in (13, big):
        t = values(count, rank, torch.float32)
        want = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(want, t, group=gloo_group())
        whole = torch.zeros(size * count)
        dist.all_gather(list(whole.chunk(size)), t)
        c.equal(f"all_gather into one tensor's chunks x{count}", list(whole.chunk(size)), want)
        whole = torch.zeros(size * count)
        whole.chunk(size)[rank].copy_(t)
        dist.all_gather(list(whole.chunk(size)), whole.chunk(size)[rank])
        c.equal(f"all_gather in place into one tensor's chunks x{count}", list(whole.chunk(size)), want)
        if rank == 0:
            whole = torch.zeros(size * count)
            dist.gather(t, list(whole.chunk(size)), dst=0)
            c.equal(f"gather into one tensor's chunks x{count}", list(whole.chunk(size)), want)
        else:
            dist.gather(t, None, dst=0)
        for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
            whole = values(size * count, rank, torch.float32, name)
            kept = whole.clone()
            want = gloo_all_reduce(whole, op).narrow(0, rank * count, count)
            got = torch.empty(count)
            dist.reduce_scatter(got, list(whole.chunk(size)), op=op)
            c.equal(f"reduce_scatter {name} from one tensor's chunks x{count}", got, want)
            c.equal(f"reduce_scatter {name} left its inputs' chunks alone x{count}", whole, kept)
            dist.reduce_scatter(whole.chunk(size)[rank], list(whole.chunk(size)), op=op)
            c.equal(f"reduce_scatter {name} in place into one tensor's chunks x{count}",
                    whole.chunk(size)[rank], want)
            c.equal(f"reduce_scatter {name} in place left the other chunks alone x{count}",
                    torch.cat([p for i, p in enumerate(kept.chunk(size)) if i != rank] or [torch.empty(0)]),
                    torch.cat([p for i, p in enumerate(whole.chunk(size)) if i != rank] or [torch.empty(0)]))
        parts = list(values(size * count, rank, torch.float32, salt=3).chunk(size))
        want, got = torch.empty(count), torch.empty(count)
        dist.scatter(want, parts if rank == 0 else None, src=0, group=gloo_group())
        dist.scatter(got, parts if rank == 0 else None, src=0)
        c.equal(f"scatter from one tensor's chunks x{count}", got, want)
        coalesced = values(3 * count, rank, torch.float32)
        want = [gloo_all_reduce(p, dist.ReduceOp.SUM) for p in coalesced.chunk(3)]
        dist.all_reduce_coalesced(list(coalesced.chunk(3)))
        c.equal(f"all_reduce_coalesced of one tensor's chunks x{count}", list(coalesced.chunk(3)), want)
    for round_ in range(2):
        inputs = [values(big, rank, torch.float32, salt=k + 10 * round_) for k in range(8)]
        want = []
        for t in inputs:
            want.append([torch.empty_like(t) for _ in range(size)])
            dist.all_gather(want[-1], t, group=gloo_group())
        # Separate tensors (written one by one, Communicator::all_gather's
        # list form) and views with gaps (staged), alternately.
        got = [[torch.full_like(t, -1) if k % 2 == 0 else torch.full((2 * t.numel(),), -1.0)[::2]
                for _ in range(size)] for k, t in enumerate(inputs)]
        works = [dist.all_gather(g, t, async_op=True) for g, t in zip(got, inputs)]
        for work in works:
            work.wait()
        for k in range(8):
            form = "separate" if k % 2 == 0 else "staged"
            c.equal(f"8 async list all_gathers in flight, round {round_}, call {k} ({form})", got[k], want[k])
        # Separate tensors (read one by one, Communicator::reduce_scatter's
        # list form) and views with gaps (staged), alternately.
        lists = [[values(big, rank, torch.float32, salt=k + p + 10 * round_) for p in range(size)] for k in range(8)]
        lists = [parts if k % 2 == 0 else [torch.stack([p, p], 1)[:, 0] for p in parts] for k, parts in enumerate(lists)]
        kept = [[p.clone() for p in parts] for parts in lists]
        want = [gloo_all_reduce(torch.cat(parts), dist.ReduceOp.SUM).narrow(0, rank * big, big) for parts in lists]
        got = [torch.empty(big) for _ in lists]
        works = [dist.reduce_scatter(g, parts, async_op=True) for g, parts in zip(got, lists)]
        for work in works:
            work.wait()
        for k in range(8):
            form = "separate" if k % 2 == 0 else "staged"
            c.equal(f"8 async list reduce_scatters in flight, round {round_}, call {k} ({form})", got[k], want[k])
        c.equal(f"list reduce_scatters left their inputs alone, round {round_}",
                [p for parts in lists for p in parts], [p for parts in kept for p in parts])
    # A staged all_gather (views with gaps, copied out once it completes)
    # followed, without a wait, by a coalesced all_reduce of its outputs
    # (copied in as it is issued): the second waits for the first's copy.
    for late in range(size):
        gaps = [torch.zeros(2 * 8)[::2] for _ in range(size)]
        if rank == late:
            time.sleep(0.3)
        works = [dist.all_gather(gaps, torch.full((8,), float(rank + 1)), async_op=True),
                 dist.all_reduce_coalesced(gaps, async_op=True)]
        for work in works:
            work.wait()
        c.equal(f"a coalesced all_reduce of a staged all_gather's outputs in flight, rank {late} late", gaps,
                [torch.full((8,), float(size * (p + 1))) for p in range(size)])
    # Calls one after another take the block the last one gave back: one
    # block for six (3 MiB per rank: larger than any kept so far). The
    # finishing step held its block until after the caller was told, so the
    # next call could map a second.
    t = values(3 * 2**18, rank, torch.float32)
    mapped = braid_torch.staging_blocks()
    for _ in range(6):
        dist.all_gather([torch.empty(2 * t.numel())[::2] for _ in range(size)], t)
    blocks = braid_torch.staging_blocks() - mapped
    c.true("six list all_gathers into views with gaps one after another map one staging block", blocks == 1,
           f"they mapped {blocks}")
    # Into separate tensors braid writes each rank's part where it belongs:
    # no staging block, no copy (5 MiB per rank: staged, it would need a
    # block larger than any kept so far).
    t = values(5 * 2**18, rank, torch.float32)
    mapped = braid_torch.staging_blocks()
    separate = [torch.full_like(t, -1) for _ in range(size)]
    dist.all_gather(separate, t)
    want = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(want, t, group=gloo_group())
    c.equal("a list all_gather into separate tensors", separate, want)
    blocks = braid_torch.staging_blocks() - mapped
    c.true("a list all_gather into separate tensors maps no staging block", blocks == 0, f"it mapped {blocks}")
    # Likewise a reduce_scatter reads each separate input where it is, in
    # place too (the output is this rank's input): partial sums go to the
    # ring's scratch, and the other inputs are left alone.
    for in_place in (False, True):
        parts = [values(5 * 2**18, rank, torch.float32, salt=40 + p) for p in range(size)]
        kept = [p.clone() for p in parts]
        want = gloo_all_reduce(torch.cat(parts), dist.ReduceOp.SUM).narrow(0, rank * parts[0].numel(), parts[0].numel())
        got = parts[rank] if in_place else torch.empty_like(parts[0])
        mapped = braid_torch.staging_blocks()
        dist.reduce_scatter(got, parts)
        blocks = braid_torch.staging_blocks() - mapped
        form = "in place" if in_place else "out of place"
        c.equal(f"a list reduce_scatter from separate tensors ({form})", got, want)
        c.equal(f"a list reduce_scatter from separate tensors ({form}) left the other inputs alone",
                [p for i, p in enumerate(parts) if i != rank], [p for i, p in enumerate(kept) if i != rank])
        c.true(f"a list reduce_scatter from separate tensors ({form}) maps no staging block", blocks == 0,
               f"it mapped {blocks}")
    dist.barrier()


BITWISE = {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def bits(count, rank, dtype):
    """Random bits of every width, the same on every run, different per rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-2**62, 2**62, (count,), generator=g, dtype=torch.int64).to(dtype)


def check_bitwise(c, rank, size):
    """BAND, BOR and BXOR of the integer dtypes as gloo computes them, through
    all_reduce, reduce and reduce_scatter; a floating-point tensor is
    refused naming the operator, as gloo refuses it."""
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        for name, op in BITWISE.items():
            for count in COUNTS:
                t = bits(count, rank, dtype)
                want = gloo_all_reduce(t, op)
                dist.all_reduce(t, op=op)
                c.equal(f"all_reduce {name} {dtype} x{count}", t, want)
            t = bits(4099, rank, dtype)
            want = gloo_all_reduce(t, op)
            dist.reduce(t, dst=size - 1, op=op)
            if rank == size - 1:
                c.equal(f"reduce {name} {dtype}", t, want)
            whole = bits(size * 13, rank, dtype)
            want = gloo_all_reduce(whole, op).narrow(0, rank * 13, 13)
            got = torch.empty(13, dtype=dtype)
            dist.reduce_scatter_tensor(got, whole, op=op)
            c.equal(f"reduce_scatter_tensor {name} {dtype}", got, want)
    for dtype in (torch.float32, torch.bfloat16):
        try:
            dist.all_reduce(torch.ones(3, dtype=dtype), op=dist.ReduceOp.BXOR)
            c.true(f"all_reduce bxor {dtype} refused", False, "it ran")
        except RuntimeError as e:
            c.true(f"all_reduce bxor {dtype} refused", "bxor is a bitwise operator, for the integer types" in str(e),
                   str(e))
    dist.barrier()  # the group still works after the refusals


def check_all_to_all(c, rank, size):
    for dtype in (torch.float32, torch.bool):
        t = values(size * 5, rank, dtype).reshape(size * 5, 1)
        want, got = torch.empty_like(t), torch.empty_like(t)
        dist.all_to_all_single(gloo_bytes(want), gloo_bytes(t), group=gloo_group())
        dist.all_to_all_single(got, t)
        c.equal(f"all_to_all_single equal {dtype}", got, want)
    # Unequal splits: rank r sends (r + p) % 3 + 1 rows of 2 to peer p.
    sends = [(rank + p) % 3 + 1 for p in range(size)]
    recvs = [(p + rank) % 3 + 1 for p in range(size)]
    t = values(2 * sum(sends), rank, torch.int32).reshape(-1, 2)
    want, got = torch.empty(sum(recvs), 2, dtype=torch.int32), torch.empty(sum(recvs), 2, dtype=torch.int32)
    dist.all_to_all_single(want, t, recvs, sends, group=gloo_group())
    dist.all_to_all_single(got, t, recvs, sends)
    c.equal("all_to_all_single unequal", got, want)
    # In place (these splits are symmetric: as many rows out as in).
    both = t.clone()
    dist.all_to_all_single(both, both, recvs, sends)
    c.equal("all_to_all_single unequal in place", both, want)
    # Input and output sharing part of one tensor, equal splits: the input
    # is read from a copy (braid refused it, in its C++ API's terms).
    for splits in (None, [3] * size):
        big = values(3 * size + 3, rank, torch.float32)
        want = torch.empty(3 * size)
        dist.all_to_all_single(want, big[:3 * size].clone(), group=gloo_group())
        dist.all_to_all_single(big[3:], big[:3 * size], splits, splits)
        c.equal(f"all_to_all_single with input and output overlapping, splits {splits}", big[3:], want)
    # The list form (gloo has none): rank r sends peer p r + 2p + 1 elements,
    # so every pair's sizes differ, each part a value of its own.
    def part(src, dst, dtype, salt=0):
        return values(src + 2 * dst + 1, 10 * src + dst, dtype, salt=salt)
    for dtype in (torch.float32, torch.int64, torch.bool):
        inputs = [part(rank, p, dtype) for p in range(size)]
        kept = [t.clone() for t in inputs]
        outputs = [torch.zeros(p + 2 * rank + 1, dtype=dtype) for p in range(size)]
        dist.all_to_all(outputs, inputs)
        c.equal(f"all_to_all of lists, sizes differing per pair, {dtype}", outputs,
                [part(p, rank, dtype) for p in range(size)])
        c.equal(f"all_to_all of lists left its inputs alone, {dtype}", inputs, kept)
    # Views with gaps in and out, outputs in one tensor, and in place (one
    # list as both: equal sizes), four calls in flight at once.
    gaps_in = [torch.stack([t, t], 1)[:, 0] for t in (part(rank, p, torch.float32, 1) for p in range(size))]
    gaps_out = [torch.zeros(2 * (p + 2 * rank + 1))[::2] for p in range(size)]
    block = torch.zeros(sum(p + 2 * rank + 1 for p in range(size)))
    block_out = list(block.split([p + 2 * rank + 1 for p in range(size)]))
    same = [values(6, 10 * rank + p, torch.float32, salt=2) for p in range(size)]
    works = [dist.all_to_all(gaps_out, gaps_in, async_op=True),
             dist.all_to_all(block_out, [part(rank, p, torch.float32, 3) for p in range(size)], async_op=True),
             dist.all_to_all(same, same, async_op=True)]
    for work in works:
        work.wait()
    c.equal("all_to_all of lists from and into views with gaps", gaps_out,
            [part(p, rank, torch.float32, 1) for p in range(size)])
    c.equal("all_to_all of lists into one tensor's parts", block_out, [part(p, rank, torch.float32, 3) for p in range(size)])
    c.equal("all_to_all of one list as input and output", same,
            [values(6, 10 * p + rank, torch.float32, salt=2) for p in range(size)])
    # Calls in flight on the same tensors keep their order, for the copies
    # braid_torch makes itself too: the second all_to_all reads this
    # rank's own part from what the first is still receiving (one rank is
    # late), and the third writes its own part over what the second still
    # sends; so do unequal all_to_all_singles. Each own part was copied as
    # the call was issued: stale, or torn for the peer (a review helper's
    # find).
    for late in range(size):
        first = [torch.full((4,), float(100 * rank + p)) for p in range(size)]
        mid = [torch.zeros(4) for _ in range(size)]
        out = [torch.zeros(4) for _ in range(size)]
        if rank == late:
            time.sleep(0.3)
        works = [dist.all_to_all(mid, first, async_op=True),
                 dist.all_to_all(out, [mid[(p + 1) % size] for p in range(size)], async_op=True),
                 dist.all_to_all(mid, [torch.full((4,), -1.0) for _ in range(size)], async_op=True)]
        for work in works:
            work.wait()
        c.equal(f"chained async all_to_alls of lists, rank {late} late", out,
                [torch.full((4,), float(100 * ((rank + 1) % size) + p)) for p in range(size)])
        splits = [1] * size
        flat_in = torch.tensor([float(100 * rank + p) for p in range(size)])
        flat_mid, flat_out = torch.zeros(size), torch.zeros(size)
        if rank == late:
            time.sleep(0.3)
        works = [dist.all_to_all_single(flat_mid, flat_in, splits, splits, async_op=True),
                 dist.all_to_all_single(flat_out, flat_mid, splits, splits, async_op=True)]
        for work in works:
            work.wait()
        c.equal(f"chained async unequal all_to_all_singles, rank {late} late", flat_out,
                torch.tensor([float(100 * rank + p) for p in range(size)]))
    for name, outs, ins, says in (
            ("a list of the wrong length", [torch.zeros(1)], [torch.zeros(1)] * size, "one output and one input tensor per rank"),
            ("outputs sharing memory", [torch.zeros(4)] * size, [torch.zeros(4) for _ in range(size)], "share memory")):
        if size == 1:
            continue
        try:
            dist.all_to_all(outs, ins)
            c.true(f"all_to_all of {name} refused", False, "it ran")
        except RuntimeError as e:
            c.true(f"all_to_all of {name} refused", says in str(e), str(e))


def check_memory_formats(c, rank, size):
    """channels_last tensors (dense in another memory order), which gloo
    takes too, give gloo's results; so do the lists of all_gather, gather and
    reduce_scatter made of views with gaps (they go through a flat copy);
    a single tensor with gaps, and an output list's tensor that overlaps
    itself, are refused by name."""
    def image(salt=0):
        return values(2 * 3 * 4 * 5, rank, torch.float32, salt=salt).reshape(2, 3, 4, 5).contiguous(
            memory_format=torch.channels_last)
    t, want = image(), image()
    dist.all_reduce(want, group=gloo_group())
    dist.all_reduce(t)
    c.equal("all_reduce channels_last", t, want)
    t, want = image(), image()
    dist.broadcast(want, src=size - 1, group=gloo_group())
    dist.broadcast(t, src=size - 1)
    c.equal("broadcast channels_last", t, want)
    t = image()
    want = [torch.empty(2, 3, 4, 5) for _ in range(size)]
    dist.all_gather(want, t, group=gloo_group())
    got = [torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last) for _ in range(size)]
    dist.all_gather(got, t)
    c.equal("all_gather channels_last", got, want)
    backing = [torch.zeros(2, 3, 4, 10) for _ in range(size)]
    got = [b[..., ::2] for b in backing]  # every other element: a view with gaps
    dist.all_gather(got, t)
    c.equal("all_gather into views with gaps", got, want)
    c.true("all_gather left the gaps alone", all(float(b[..., 1::2].abs().sum()) == 0 for b in backing))
    root = size - 1
    got = [torch.zeros(2, 3, 4, 10)[..., ::2] for _ in range(size)] if rank == root else None
    dist.gather(t, got, dst=root)
    if rank == root:
        c.equal("gather into views with gaps", got, want)
    try:  # gloo refuses it too; braid reshaped the elements, without a word
        dist.all_gather([torch.empty(5, 4, 3, 2) for _ in range(size)], t)
        c.true("an output of another shape is refused", False, "it was accepted")
    except RuntimeError as e:
        c.true("an output of another shape is refused", "shape" in str(e), str(e))
    try:
        dist.all_gather([torch.zeros(1).expand(2, 3, 4, 5) for _ in range(size)], t)
        c.true("an output that overlaps itself is refused", False, "it was accepted")
    except RuntimeError as e:
        c.true("an output that overlaps itself is refused", "overlaps itself" in str(e), str(e))
    parts = [image(salt=p) for p in range(size)]  # gloo has no reduce_scatter: an all_reduce, sliced
    whole = torch.cat([p.contiguous().reshape(-1) for p in parts])
    want = gloo_all_reduce(whole, dist.ReduceOp.SUM).narrow(0, rank * 120, 120).reshape(2, 3, 4, 5)
    got = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    dist.reduce_scatter(got, parts)
    c.equal("reduce_scatter channels_last", got, want)
    gapped = [torch.stack([p, p], dim=-1)[..., 0] for p in parts]  # the same values, with gaps
    got = torch.empty(2, 3, 4, 5)
    dist.reduce_scatter(got, gapped)
    c.equal("reduce_scatter of views with gaps", got, want)
    if size >= 2 and rank < 2:
        t = image() if rank == 0 else torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        if rank == 0:
            dist.send(t, dst=1)
        else:
            dist.recv(t, src=0)
            want = values(120, 0, torch.float32).reshape(2, 3, 4, 5)
            c.equal("send/recv channels_last", t, want)
    # A view with gaps: refused before, where gloo takes it (a review
    # helper's case); now through a flat copy, the gaps left alone.
    for root in sorted({0, size - 1}):
        backing = values(24, rank, torch.float32).reshape(4, 6)
        view, gaps = backing[:, ::2], backing[:, 1::2].clone()
        want = gloo_all_reduce(view.contiguous(), dist.ReduceOp.SUM)
        dist.all_reduce(view)
        c.equal("all_reduce of a view with gaps", view, want)
        c.equal("all_reduce of a view with gaps left the gaps alone", backing[:, 1::2], gaps)
        backing = values(24, rank, torch.float32).reshape(4, 6)
        view, gaps = backing[:, ::2], backing[:, 1::2].clone()
        want = view.contiguous()
        dist.broadcast(want, src=root, group=gloo_group())
        dist.broadcast(view, src=root)
        c.equal(f"broadcast root {root} of a view with gaps", view, want)
        c.equal(f"broadcast root {root} of a view with gaps left the gaps alone", backing[:, 1::2], gaps)
        backing = values(24, rank, torch.int32).reshape(4, 6)
        view = backing[:, ::2]
        want = view.contiguous()
        dist.reduce(want, dst=root, op=dist.ReduceOp.MAX, group=gloo_group())
        dist.reduce(view, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            c.equal(f"reduce root {root} of a view with gaps", view, want)
    try:
        dist.all_reduce(torch.zeros(1).expand(4))
        c.true("an output that overlaps itself is refused", False, "it was accepted")
    except RuntimeError as e:
        c.true("an output that overlaps itself is refused", "overlaps itself" in str(e), str(e))
    dist.barrier()


def check_send_recv(c, rank, size):
    """A ring: rank r sends to r + 1 and receives from r - 1; even ranks send first."""
    for dtype in (torch.float64, torch.bool):
        t = values(4099, rank, dtype)
        got = torch.empty_like(t)
        to, frm = (rank + 1) % size, (rank - 1) % size
        if rank % 2 == 0:
            dist.send(t, to)
            dist.recv(got, frm)
        else:
            dist.recv(got, frm)
            dist.send(t, to)
        c.equal(f"send/recv ring {dtype}", got, values(4099, frm, dtype))
    # A receive's Work names its peer, as gloo's does.
    t, got = values(5, rank, torch.float32), torch.empty(5)
    send = dist.isend(t, to)
    receive = dist.irecv(got, frm)
    send.wait()
    receive.wait()
    c.true("an irecv's Work names its source", receive._source_rank() == frm, str(receive._source_rank()))
    # batch_isend_irecv, sends first or receives first on every rank: the
    # engine runs them together (each waited for its peer's other half until
    # BRAID_TIMEOUT before, large or small).
    for count in (3, 1 << 20):
        for receive_first in (False, True):
            t = values(count, rank, torch.float32)
            got = torch.zeros_like(t)
            ops = [dist.P2POp(dist.isend, t, to), dist.P2POp(dist.irecv, got, frm)]
            for work in dist.batch_isend_irecv(ops[::-1] if receive_first else ops):
                work.wait()
            order = "receive first" if receive_first else "send first"
            c.equal(f"batch_isend_irecv ring of {count}, {order}", got, values(count, frm, torch.float32))


def check_deferred(c, rank, size):
    """Calls deferred behind earlier ones on shared tensors (the Issuer's
    queue), as threads and callbacks meet them; each hung for good where a
    review helper found it."""
    # Two threads issuing on one group, each on the tensors the other's call
    # still copies: a call found the other thread's call first and was
    # queued ahead of it, and waited for it forever.
    base = torch.arange(64, dtype=torch.float32) + 100 * rank
    gaps = [base[16 * p: 16 * (p + 1): 2] for p in range(4)]
    want = [g + 100 * (size - 1 - rank) for g in gaps]
    errors = []

    def worker():
        try:
            for _ in range(500):
                dist.all_reduce_coalesced(gaps, op=dist.ReduceOp.MAX, async_op=True).wait()
        except Exception as e:  # noqa: BLE001  reported below
            errors.append(str(e))

    def two_threads():
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    within(60, rank, "two threads issuing on one group on shared tensors", two_threads)
    c.true("two threads issuing on one group on shared tensors", not errors, "; ".join(errors[:2]))
    c.equal("two threads issuing on one group on shared tensors", gaps, want)
    dist.barrier()
    # A thread polling a finished Work's is_completed() (with the GIL held)
    # beside calls whose issue holds the last reference to a temporary
    # input (a transposed one, which the backend copies): the reference was
    # let go under the issue lock, and took the GIL the poller held while it
    # waited for that lock.
    old = dist.all_reduce(torch.ones(1), async_op=True)
    old.wait()
    stop = []

    def poll():
        while not stop:
            old.is_completed()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    outs = [torch.zeros(4, 4) for _ in range(size)]

    def gathers():
        for i in range(300):
            work = dist.all_gather(outs, torch.full((4, 4), float(rank)).t(), async_op=True)
            if i % 4 == 0:
                time.sleep(0.0015)  # past the hold time: the progress thread issues it
            work.wait()
    within(60, rank, "calls on temporary inputs beside a thread polling is_completed()", gathers)
    stop.append(True)
    poller.join()
    c.equal("calls on temporary inputs beside a thread polling is_completed()", outs,
            [torch.full((4, 4), float(p)) for p in range(size)])
    # A deferred call refused as it is issued (a root out of range) fails
    # its Work, and a callback on its future that issues a call of the
    # group and waits for it, behind another call still deferred,
    # completes. The callback ran on the Issuer's own thread, first with the
    # issue lock held (the call waited for the lock) and then without it
    # (the call was deferred behind the other, which only that thread
    # issues): both hung for good.
    base = torch.zeros(16 * size)
    gaps = [base[16 * p: 16 * (p + 1): 2] for p in range(size)]
    gaps2 = [torch.zeros(16)[::2] for _ in range(size)]
    t = values(4, rank, torch.float32)
    want = gloo_all_reduce(t, dist.ReduceOp.SUM)
    issued = []

    def issue_and_wait(fut=None):
        work = dist.all_reduce(t, async_op=True)
        issued.append(work)
        work.wait()

    def refused_then_callback():
        if rank == 0:
            time.sleep(0.3)  # so that every other rank's broadcast is deferred
        first = dist.all_gather(gaps, torch.full((8,), float(rank + 1)), async_op=True)
        if rank == 0:
            time.sleep(1.0)  # and the fourth call behind the third, still deferred as the broadcast fails
        late = dist.all_gather(gaps2, torch.full((8,), float(rank + 1)), async_op=True)
        try:
            second = dist.broadcast(base, src=size + 5, async_op=True)  # deferred behind the first
        except RuntimeError:  # refused at once (rank 0): nothing was in flight any more
            second = None
        third = dist.all_reduce_coalesced(gaps2, async_op=True)  # deferred behind the late one
        if second is None:
            issue_and_wait()
        else:  # after the third on every rank
            second.get_future().then(issue_and_wait)
        for work in (first, late, third):
            work.wait()
        if second is not None:
            try:
                second.wait()
                c.true("a deferred call refused as it is issued fails", False, "it ran")
            except RuntimeError as e:
                c.true("a deferred call refused as it is issued fails", "out of range" in str(e), str(e))
        while not issued:
            time.sleep(0.001)
        issued[0].wait()
    within(30, rank, "a deferred call refused as it is issued, with a callback that issues a call and waits",
           refused_then_callback)
    c.equal("a deferred call refused as it is issued, and a call deferred behind another", gaps2,
            [torch.full((8,), float(size * (p + 1))) for p in range(size)])
    c.equal("a call issued by the callback of a deferred call that failed", t, want)
    # A call refused as it is issued says so at once, though earlier calls
    # are still in flight (its future fails in issue order): a wait with a
    # deadline said it had timed out, the call still queued.
    x = torch.ones(4)
    if rank == 0:
        time.sleep(0.5)  # the others' first call is in flight meanwhile
    first = dist.all_reduce(x, async_op=True)
    try:
        refused = dist.broadcast(torch.zeros(4), src=size + 3, async_op=True)  # held back, then refused
        refused.wait(datetime.timedelta(milliseconds=200))
        said = "it ran"
    except RuntimeError as e:
        said = str(e)
    c.true("a call refused as it is issued behind one in flight says so at once", "out of range" in said, said)
    first.wait()
    c.equal("a call in flight before one refused", x, torch.full((4,), float(size)))
    dist.barrier()


def check_async(c, rank, size):
    """Work handles and their futures, as DDP's comm hooks chain them."""
    t = values(1000, rank, torch.float32)
    want = gloo_all_reduce(t, dist.ReduceOp.SUM) * 2
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2)
    c.equal("future then", doubled.wait(), want)
    work.wait()
    c.true("work completed", work.is_completed() and work.is_success())
    # A synchronous collective of the same group inside a callback: the
    # callback runs on the group's completion thread, which must not wait
    # for itself (it hung for good before, past BRAID_TIMEOUT).
    for count in (4, 100000):
        a, b = values(count, rank, torch.float32), values(count, rank, torch.float32, salt=1)
        want = gloo_all_reduce(a, dist.ReduceOp.SUM) + gloo_all_reduce(b, dist.ReduceOp.SUM)

        def then(fut, b=b):
            dist.all_reduce(b)
            return fut.value()[0] + b
        result = within(30, rank, f"collective in a future callback x{count}",
                        lambda: dist.all_reduce(a, async_op=True).get_future().then(then).wait())
        c.equal(f"collective in a future callback x{count}", result, want)
        # The same through the inner call's future (DDP's PowerSGD hook):
        # Future.wait, not Work.wait, so only another completion thread can
        # finish it (it hung for good before).
        b = values(count, rank, torch.float32, salt=1)

        def then_future(fut, b=b):
            inner = dist.all_reduce(b, async_op=True).get_future().wait()[0]
            return fut.value()[0] + inner
        a = values(count, rank, torch.float32)
        result = within(30, rank, f"collective waited through its future in a callback x{count}",
                        lambda: dist.all_reduce(a, async_op=True).get_future().then(then_future).wait())
        c.equal(f"collective waited through its future in a callback x{count}", result, want)
    # Async calls on temporaries, each asked for its future: a completion
    # thread let go of a finished call's tensors (their last owner, which
    # takes the GIL) while holding its queue's lock, which get_future(),
    # holding the GIL, waited for: both hung for good within a few thousand.
    def temporaries():
        for _ in range(5000):
            last = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        return last.wait()[0]
    result = within(60, rank, "5000 async calls on temporaries asked for their futures", temporaries)
    c.equal("5000 async calls on temporaries asked for their futures", result, torch.full((4,), float(size)))
    dist.barrier()


def check_async_returns(c, rank, size):
    """An async call returns before its peers join it, as under gloo. A small
    call ran in the caller's thread until every peer had joined it, so rank 0,
    which then told the others through the store and a gloo barrier to go
    on, deadlocked with them until the group's timeout (30 min)."""
    store = dist.distributed_c10d._get_default_store()
    for count in (4, 100000):
        t = values(count, rank, torch.float32)
        want = gloo_all_reduce(t, dist.ReduceOp.SUM)

        def run(t=t, count=count):
            if rank == 0:
                work = dist.all_reduce(t, async_op=True)
                store.set(f"braid-test/async-go/{count}", "1")
                dist.barrier(group=gloo_group())
                work.wait()
            else:
                store.wait([f"braid-test/async-go/{count}"])
                dist.barrier(group=gloo_group())
                dist.all_reduce(t)
        within(30, rank, f"async all_reduce x{count} then a handshake through the store", run)
        c.equal(f"async all_reduce x{count} then a handshake through the store", t, want)
    # While one thread waits in a call run in its own thread, another asking
    # about a finished Work is answered at once: it waited for the call (with
    # the GIL held, as torch's is_completed keeps it), so rank 0 never gave
    # the others their go-ahead.
    done = dist.all_reduce(torch.ones(4), async_op=True)
    done.wait()
    t = values(4, rank, torch.float32)
    want = gloo_all_reduce(t, dist.ReduceOp.SUM)
    if rank == 0:
        inside = threading.Thread(target=lambda: dist.all_reduce(t), daemon=True)
        inside.start()
        time.sleep(0.3)  # inside its call, waiting for the others
        c.true("is_completed() while another thread waits in a call", within(30, rank, "is_completed() while "
               "another thread waits in a call", done.is_completed), "False")
        store.set("braid-test/async-go/other-thread", "1")
        within(30, rank, "a call in another thread", inside.join)
    else:
        store.wait(["braid-test/async-go/other-thread"])
        dist.all_reduce(t)
    c.equal("a call while another thread asked about its Work", t, want)
    # A chain of async calls that share tensors through braid_torch's own
    # copies (a staged all_gather into views with gaps, then a coalesced
    # all_reduce of those views, which copies them in only once the first
    # has copied its result out) returns at once too: the second call is
    # deferred until the first has finished. It waited there as it was
    # made, and rank 0 never gave the others their go-ahead (a review
    # helper's find).
    gaps = [torch.zeros(16)[::2] for _ in range(size)]

    def chain():
        return [dist.all_gather(gaps, torch.full((8,), float(rank + 1)), async_op=True),
                dist.all_reduce_coalesced(gaps, async_op=True)]

    def run_chain():
        if rank == 0:
            works = chain()
            store.set("braid-test/async-go/chain", "1")
            dist.barrier(group=gloo_group())
        else:
            store.wait(["braid-test/async-go/chain"])
            dist.barrier(group=gloo_group())
            works = chain()
        for work in works:
            work.wait()
    within(30, rank, "a chain of async calls on shared tensors, then a handshake through the store", run_chain)
    c.equal("a chain of async calls on shared tensors, then a handshake through the store", gaps,
            [torch.full((8,), float(size * (p + 1))) for p in range(size)])
    # Not waited for at all: it still runs, and is_completed() turns true.
    t = values(4, rank, torch.float32)
    want = gloo_all_reduce(t, dist.ReduceOp.SUM)
    work = dist.all_reduce(t, async_op=True)
    deadline = time.monotonic() + 30
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    c.true("an async call never waited for completes", work.is_completed())
    c.equal("an async call never waited for", t, want)
    dist.barrier()


def check_two_groups(c, rank, size):
    """Async calls on two braid groups (the default one and a new one),
    issued in opposite orders on even and odd ranks, complete as under gloo.
    A small call run in the caller's thread returned only once its peers had
    joined it, and they first waited for their own first call, on the other
    group: both waited until BRAID_TIMEOUT."""
    other = dist.new_group(backend="braid")
    for count in (4, 100000):
        a, b = values(count, rank, torch.float32), values(count, rank, torch.float32, salt=1)
        want_a, want_b = gloo_all_reduce(a, dist.ReduceOp.SUM), gloo_all_reduce(b, dist.ReduceOp.SUM)
        calls = [(a, None), (b, other)] if rank % 2 == 0 else [(b, other), (a, None)]

        def issue_and_wait():
            for work in [dist.all_reduce(t, group=g, async_op=True) for t, g in calls]:
                work.wait()
        within(30, rank, f"async calls on two groups in opposite orders x{count}", issue_and_wait)
        c.equal(f"async calls on two groups in opposite orders x{count}, default group", a, want_a)
        c.equal(f"async calls on two groups in opposite orders x{count}, new group", b, want_b)
    # The same with all_to_all_single of unequal splits, whose issue agreed
    # on a slot size with a blocking all_reduce first: it hung.
    sends = [(rank + p) % 3 + 1 for p in range(size)]
    recvs = [(p + rank) % 3 + 1 for p in range(size)]
    a, b = values(sum(sends), rank, torch.float32), values(sum(sends), rank, torch.float32, salt=1)
    want_a, want_b = torch.empty(sum(recvs)), torch.empty(sum(recvs))
    dist.all_to_all_single(want_a, a, recvs, sends, group=gloo_group())
    dist.all_to_all_single(want_b, b, recvs, sends, group=gloo_group())
    got_a, got_b = torch.empty(sum(recvs)), torch.empty(sum(recvs))
    calls = [(got_a, a, None), (got_b, b, other)] if rank % 2 == 0 else [(got_b, b, other), (got_a, a, None)]

    def issue_and_wait_unequal():
        works = [dist.all_to_all_single(out, t, recvs, sends, group=g, async_op=True) for out, t, g in calls]
        for work in works:
            work.wait()
    # A group of the last two ranks only: its ranks keep the launcher's
    # local ranks (up to size - 1) in a world of two.
    last_two = dist.new_group([size - 2, size - 1], backend="braid")
    if rank >= size - 2:
        t = values(7, rank, torch.float32)
        want = values(7, size - 2, torch.float32) + values(7, size - 1, torch.float32)
        dist.all_reduce(t, group=last_two)
        c.equal("all_reduce on a group of the last two ranks", t, want)
    within(30, rank, "unequal all_to_all_single on two groups in opposite orders", issue_and_wait_unequal)
    c.equal("unequal all_to_all_single on two groups in opposite orders, default group", got_a, want_a)
    c.equal("unequal all_to_all_single on two groups in opposite orders, new group", got_b, want_b)
    # A chain on shared tensors (deferred until the call before it has
    # finished) on one group, a call on the other, in opposite orders.
    gaps = [torch.zeros(16)[::2] for _ in range(size)]
    t = values(4, rank, torch.float32)
    want = gloo_all_reduce(t, dist.ReduceOp.SUM)

    def chain_then_call():
        if rank % 2 == 0:
            works = [dist.all_gather(gaps, torch.full((8,), float(rank + 1)), group=other, async_op=True),
                     dist.all_reduce_coalesced(gaps, group=other, async_op=True)]
            dist.all_reduce(t)
        else:
            dist.all_reduce(t)
            works = [dist.all_gather(gaps, torch.full((8,), float(rank + 1)), group=other, async_op=True),
                     dist.all_reduce_coalesced(gaps, group=other, async_op=True)]
        for work in works:
            work.wait()
    within(30, rank, "a chain on shared tensors and a call on two groups in opposite orders", chain_then_call)
    c.equal("a chain on shared tensors and a call on two groups in opposite orders, the chain", gaps,
            [torch.full((8,), float(size * (p + 1))) for p in range(size)])
    c.equal("a chain on shared tensors and a call on two groups in opposite orders, the call", t, want)
    dist.barrier()


def main():
    warnings.filterwarnings("ignore", message=".*all_reduce_coalesced will be deprecated")
    dist.init_process_group("braid")
    rank, size = dist.get_rank(), dist.get_world_size()
    c = Checks(rank)
    for check in (check_all_reduce, check_sparse, check_bitwise, check_coalesced, check_broadcast_reduce, check_all_gather,
                  check_gather_scatter, check_reduce_scatter, check_list_forms, check_all_to_all, check_memory_formats,
                  check_send_recv, check_async, check_async_returns, check_deferred, check_two_groups):
        check(c, rank, size)
    if rank == 0:
        print(f"braid transports: {braid_torch.transport_summary()}", flush=True)
    c.finish()


if __name__ == "__main__":
    main()
