"""``amp``: mixed precision for migrated scripts (torch_xla / TorchAcc ``amp`` spellings).

``autocast`` picks the runtime's device and its usual low-precision dtype, ``GradScaler`` is
PyTorch's scaler on that device, and ``syncfree.Adam/AdamW/SGD`` skip an overflow step on the
device, without a host sync, when driven by the scaler.
"""

from . import syncfree
from .autocast_mode import autocast
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "syncfree"]
