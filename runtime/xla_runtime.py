"""``torch_xla.runtime`` (imported as ``xr``): where this process stands in the job.

One process drives one device (torchrun style), so a process's ordinal is its rank, and the
device counts are process counts: ``global_ordinal()`` is the global rank, ``local_ordinal()``
the rank on this machine, ``world_size()`` the number of processes. They read the process group
where there is one and torchrun's environment otherwise, as ``xla_model`` does.
"""

import torch

from . import xla_model as xm


def device_type():
    """``'CUDA'`` where CUDA is present, else ``'CPU'`` (torch_xla's PJRT device names)."""
    return "CUDA" if torch.cuda.is_available() else "CPU"


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
