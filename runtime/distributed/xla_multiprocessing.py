"""``xmp.spawn`` (``torch_xla.distributed.xla_multiprocessing``): one process per device, each
told its device as torchrun tells it.

``torch.multiprocessing.spawn`` starts ``fn(index, *args)`` in ``nprocs`` processes but says
nothing else about where they stand, so ``xm.xla_device()`` (the accelerator's device
``LOCAL_RANK``) would put every one of them on the first device. Here each process gets
``LOCAL_RANK`` (its index) and ``LOCAL_WORLD_SIZE`` before ``fn`` runs. The process group stays the script's own
(``dist.init_process_group(..., rank=index, world_size=nprocs)``).
"""

import os

import torch.multiprocessing

from .. import xla_runtime


class _Launched:
    """``fn`` with the process's place set first (a class, so that it pickles by reference)."""

    def __init__(self, fn, nprocs):
        self.fn = fn
        self.nprocs = nprocs

    def __call__(self, index, *args):
        os.environ["LOCAL_RANK"] = str(index)
        os.environ["LOCAL_WORLD_SIZE"] = str(self.nprocs)
        return self.fn(index, *args)


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    """``fn(index, *args)`` in ``nprocs`` processes (None: one per device,
    ``xla_runtime.global_runtime_device_count()``); as ``torch.multiprocessing.spawn`` it
    returns None when joined, else the processes' context."""
    if nprocs is None:
        nprocs = xla_runtime.global_runtime_device_count()
    return torch.multiprocessing.start_processes(
        _Launched(fn, nprocs), args=args, nprocs=nprocs, join=join, daemon=daemon, start_method=start_method,
    )
