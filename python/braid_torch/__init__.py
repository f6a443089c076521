"""braid as a torch.distributed backend.

    import braid_torch  # registers the backend "braid"
    torch.distributed.init_process_group("braid")

works under torchrun and under braid-launch (any init_method: braid meets
through the store torch passes to the backend, see rendezvous.h). Every
process group, new_group ones included, is one braid communicator.
"""
import atexit
import datetime

import torch.distributed as dist

from . import _C

__all__ = ["transport_summary", "staging_blocks", "abort"]


def _create_process_group(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


def transport_summary(group=None):
    """The transports braid chose for `group` (default: the world): "shm", "tcp", "shm+tcp"."""
    return _C.transport_summary(group if group is not None else dist.distributed_c10d._get_default_group())


def staging_blocks(group=None):
    """Host staging blocks `group` (default: the world) has mapped so far for
    its list-form and coalesced calls; a block is reused once its call is done."""
    return _C.staging_blocks(group if group is not None else dist.distributed_c10d._get_default_group())


def abort(group=None, reason=""):
    """Fails `group` (default: the world) now, from any thread, as a watchdog
    would (ncclCommAbort): its running call fails at its next wait, within
    milliseconds, queued and later calls at once, and the peers at their next
    wait on this rank, each with a RuntimeError naming `reason`. A group
    cannot be used after it; make a new one."""
    _C.abort(group if group is not None else dist.distributed_c10d._get_default_group(), reason)


if "BRAID" not in dist.Backend._plugins:
    dist.Backend.register_backend("braid", _create_process_group)
    # Before the interpreter finalizes: a future callback still running on a
    # group's completion thread then aborted the process (_C.quiesce says why).
    atexit.register(_C.quiesce, datetime.timedelta(seconds=10))
