"""The ``'xla'`` backend of torch.distributed, as ``import torch_xla.distributed.xla_backend``
registers it: a script migrated to an XLA target calls ``dist.init_process_group('xla', ...)``,
and here that group is NCCL where CUDA is present and gloo otherwise (``xm.dist_backend()``).

Importing this module registers the backend name with torch.distributed, which is what the
import is for; nothing else in torch is changed. (torch_xla also replaces ``dist.new_group``;
here ``new_xla_process_group`` is a function of its own.)
"""

import torch
import torch.distributed as dist

from .. import xla_model as xm


def _create_process_group(store, rank, size, timeout):
    group = dist.ProcessGroupNCCL if xm.dist_backend() == "nccl" else dist.ProcessGroupGloo
    return group(store, rank, size, timeout)


def new_xla_process_group(ranks=None, timeout=dist.default_pg_timeout, backend=None, pg_options=None):
    """A process group of ``ranks`` (``dist.new_group``); ``pg_options`` of torch_xla's SPMD
    mesh form are not supported."""
    if isinstance(pg_options, dict) and "xla_pg_options" in pg_options:
        raise ValueError("new_xla_process_group: xla_pg_options (an SPMD mesh) is not supported")
    return dist.new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options)


if "xla" not in dist.Backend.backend_list:
    dist.Backend.register_backend(
        "xla", _create_process_group, devices=["cuda"] if torch.cuda.is_available() else ["cpu"]
    )
