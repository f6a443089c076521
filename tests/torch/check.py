"""Small helpers the torch backend tests share: comparing braid with gloo
and reporting every failed check at the end instead of at the first."""
import gc
import sys

import torch
import torch.distributed as dist


class Checks:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.count = 0

    def equal(self, name, got, want, rtol=0.0, atol=0.0):
        """Exact where rtol and atol are 0 (the tests choose inputs whose results are exact)."""
        self.count += 1
        got = got if isinstance(got, (list, tuple)) else [got]
        want = want if isinstance(want, (list, tuple)) else [want]
        for g, w in zip(got, want, strict=True):
            same = g.dtype == w.dtype and g.shape == w.shape and (
                torch.equal(g, w) if rtol == 0 and atol == 0 else torch.allclose(g.double(), w.double(), rtol, atol))
            if not same:
                self.failures.append(f"{name}: braid {g.dtype} {tuple(g.shape)} {g.flatten()[:8].tolist()} != "
                                     f"gloo {w.dtype} {tuple(w.shape)} {w.flatten()[:8].tolist()}")
                return

    def true(self, name, condition, detail=""):
        self.count += 1
        if not condition:
            self.failures.append(f"{name}: {detail}")

    def finish(self):
        """Prints every failure of this rank; exits 1 if any rank failed (gathered over gloo)."""
        for failure in self.failures:
            print(f"rank {self.rank}: FAIL {failure}", flush=True)
        failed = torch.tensor([len(self.failures)])
        dist.all_reduce(failed, group=gloo_group())
        print(f"rank {self.rank}: {self.count} checks, {len(self.failures)} failed here, "
              f"{int(failed)} on all ranks", flush=True)
        end_gloo_group()
        sys.exit(1 if int(failed) else 0)


_gloo = None


def end_gloo_group():
    """Ends the reference group while the interpreter is whole. Gloo's worker
    threads let a finished call's tensors go a moment after the call completes,
    and one that does so after the interpreter began to finalize takes the GIL
    and aborts the process ("terminate called without an active exception", as
    PyTorch's tracker describes). A rank of train.py aborted so once at its
    exit in the suite under load, after its checks had passed; the cause was
    not caught in the act (40 runs of a gloo-only script under load did not
    abort). The group's end joins those threads, with the GIL let go (torch
    does that)."""
    global _gloo
    if _gloo is not None:
        gc.collect()  # models and optimizers of the tests that still hold the group
        dist.destroy_process_group(_gloo)
        _gloo = None


def gloo_group():
    """A gloo group over every rank: the reference."""
    global _gloo
    if _gloo is None:
        _gloo = dist.new_group(backend="gloo")
    return _gloo
