"""Run a function on N real processes, set up as torchrun would set them up (gloo on the CPU).

``run_ranks(fn, nprocs, *args)`` spawns ``nprocs`` processes with ``MASTER_ADDR``,
``MASTER_PORT`` (a free port), ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` in their environment,
calls ``fn(rank, *args)`` in each (``fn`` must be a module-level function) and returns the
per-rank return values. The process group is left to ``fn`` (or to the runtime's lazy init).
An exception in a rank fails the caller with that rank's traceback.
"""

import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank, fn, nprocs, port, outdir, args):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(nprocs),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    try:
        result = fn(rank, *args)
        torch.save(result, os.path.join(outdir, f"{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, nprocs, *args):
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_entry, args=(fn, nprocs, free_port(), outdir, args), nprocs=nprocs)
        return [torch.load(os.path.join(outdir, f"{r}.pt"), weights_only=False) for r in range(nprocs)]
