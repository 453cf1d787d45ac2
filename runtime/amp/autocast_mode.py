"""Device-aware ``autocast``: the runtime device unless told otherwise, in that device's default
low-precision dtype (``torch.autocast``'s: float16 on CUDA, bfloat16 on the CPU) unless ``dtype``
says otherwise (torch_xla's ``autocast`` with the device optional, as TorchAcc scripts call it:
``with autocast():``)."""

import torch

from .. import xla_model as xm


def device_type(device=None) -> str:
    """The torch device type for ``device``: None or ``"xla"`` mean the runtime's device."""
    if device is None or device == "xla":
        return xm.xla_device().type
    return torch.device(device).type


class autocast(torch.autocast):  # noqa: N801 - the torch_xla name
    """``torch.autocast`` on the runtime device (or ``device``); usable as a context manager
    or a decorator."""

    def __init__(self, device=None, enabled=True, dtype=None, cache_enabled=True):
        super().__init__(device_type(device), dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
