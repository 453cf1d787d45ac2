"""The ``'xla'`` backend of torch.distributed, as ``import torch_xla.distributed.xla_backend``
registers it: a script migrated to an XLA target calls ``dist.init_process_group('xla', ...)``,
and here that group is the backend torch registers for the runtime's device (NCCL on CUDA,
XCCL on XPU, a vendor's registered backend elsewhere, gloo on the CPU; ``xm.dist_backend()``).

Importing this module registers the backend name with torch.distributed, which is what the
import is for; nothing else in torch is changed. (torch_xla also replaces ``dist.new_group``;
here ``new_xla_process_group`` is a function of its own.)
"""

import torch.distributed as dist

from accrewrite.base import torch_compat as compat
from accrewrite.base import accelerator
from .. import xla_model as xm


def _create_process_group(store, rank, size, timeout):
    name = xm.dist_backend()
    if name == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    plugin = compat.backend_plugins().get(name.upper())
    if plugin is not None:  # a backend a vendor's package registered (hccl, ...)
        if plugin.extended_api:
            raise RuntimeError(
                f"the 'xla' process group cannot create {name!r} (registered with extended_api); "
                f"call dist.init_process_group(backend={name!r}) instead"
            )
        return plugin.creator_fn(store, rank, size, timeout)
    return compat.builtin_backend(name, store, rank, size, timeout)  # nccl, xccl


def new_xla_process_group(ranks=None, timeout=dist.default_pg_timeout, backend=None, pg_options=None):
    """A process group of ``ranks`` (``dist.new_group``); ``pg_options`` of torch_xla's SPMD
    mesh form are not supported."""
    if isinstance(pg_options, dict) and "xla_pg_options" in pg_options:
        raise ValueError("new_xla_process_group: xla_pg_options (an SPMD mesh) is not supported")
    return dist.new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options)


def _register():
    kind = accelerator.device_type()
    defaults = dist.Backend.default_device_backend_map
    before = defaults.get(kind)
    dist.Backend.register_backend("xla", _create_process_group, devices=[kind])
    # Registering claims a device that has no backend yet; 'xla' only stands for the device's
    # backend, so the claim is undone and a vendor's backend registered later still gets it.
    if before is None:
        defaults.pop(kind, None)
    else:
        defaults[kind] = before


if "xla" not in dist.Backend.backend_list:
    _register()
