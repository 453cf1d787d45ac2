"""``torch_xla.runtime`` (imported as ``xr``): where this process stands in the job.

One process drives one device (torchrun style), so a process's ordinal is its rank, and the
device counts are process counts: ``global_ordinal()`` is the global rank, ``local_ordinal()``
the rank on this machine, ``world_size()`` the number of processes. They read the process group
where there is one and torchrun's environment otherwise, as ``xla_model`` does.
``global_runtime_device_count()`` is also known before any process starts: the devices one
process each would train on.
"""

import os

import torch.distributed as dist

from accrewrite.base import accelerator
from . import xla_model as xm


def device_type():
    """The device's type as torch_xla's PJRT names devices: ``'CUDA'``, ``'XPU'``, ... where an
    accelerator is available, else ``'CPU'``."""
    return accelerator.device_type().upper()


def world_size():
    return xm.world_size()


def global_ordinal():
    return xm.get_ordinal()


def local_ordinal():
    return xm.get_local_ordinal()


def process_index():
    return xm.get_ordinal()


def process_count():
    return xm.world_size()


def local_process_count():
    return xm._env_int("LOCAL_WORLD_SIZE", 1)


def addressable_device_count():
    return 1


def global_device_count():
    return xm.world_size()


def local_device_count():
    return local_process_count()


def global_runtime_device_count():
    """The devices the job trains on, one process each: the process group's size, else
    torchrun's ``WORLD_SIZE``; before any process starts, this machine's: the accelerator's
    device count, or on the CPU ``CPU_NUM_DEVICES`` (torch_xla's variable for its CPU devices;
    1 when unset)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    if os.environ.get("WORLD_SIZE"):
        return xm._env_int("WORLD_SIZE", 1)
    return accelerator.device_count() or xm._env_int("CPU_NUM_DEVICES", 1)
