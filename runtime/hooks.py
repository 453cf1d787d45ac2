"""Swap torch's own classes for the fused ones, as the ``hooks`` of TorchAcc's migration guide do::

    from accrewrite.runtime import hooks
    hooks.enable_fused_layer_norm()   # torch.nn.LayerNorm -> FusedLayerNorm
    hooks.enable_fused_adam()         # torch.optim.Adam / AdamW -> FusedAdam / FusedAdamW

Call them before the model and the optimizer are built: they replace the names
(``torch.nn.LayerNorm`` and ``torch.nn.modules.LayerNorm``; ``torch.optim.Adam`` and
``torch.optim.AdamW``), so code that looks the class up afterwards (``nn.LayerNorm(...)``,
``from torch.nn import LayerNorm``) gets the fused one; objects built before are left alone.
``disable_fused_layer_norm()`` / ``disable_fused_adam()`` put torch's classes back. Enabling twice
is harmless. The fused classes subclass torch's, so ``isinstance`` checks keep working.
"""

import torch
import torch.nn.modules
import torch.optim
from torch.nn.modules.normalization import LayerNorm as TorchLayerNorm
from torch.optim.adam import Adam as TorchAdam
from torch.optim.adamw import AdamW as TorchAdamW

from accrewrite.runtime.nn.layer_norm import FusedLayerNorm
from accrewrite.runtime.optim import FusedAdam, FusedAdamW

__all__ = [
    "enable_fused_layer_norm",
    "disable_fused_layer_norm",
    "enable_fused_adam",
    "disable_fused_adam",
]

# (namespace, public name, torch's class, fused class). torch's classes are taken from the modules
# that define them, which are never patched, so disabling restores them whatever ran before.
_LAYER_NORM = (
    (torch.nn, "LayerNorm", TorchLayerNorm, FusedLayerNorm),
    (torch.nn.modules, "LayerNorm", TorchLayerNorm, FusedLayerNorm),
)
_ADAM = (
    (torch.optim, "Adam", TorchAdam, FusedAdam),
    (torch.optim, "AdamW", TorchAdamW, FusedAdamW),
)


def enable_fused_layer_norm() -> None:
    """Make ``torch.nn.LayerNorm`` build ``FusedLayerNorm`` modules."""
    _patch(_LAYER_NORM, fused=True)


def disable_fused_layer_norm() -> None:
    """Undo ``enable_fused_layer_norm``: ``torch.nn.LayerNorm`` is torch's again."""
    _patch(_LAYER_NORM, fused=False)


def enable_fused_adam() -> None:
    """Make ``torch.optim.Adam`` / ``AdamW`` build ``FusedAdam`` / ``FusedAdamW`` optimizers."""
    _patch(_ADAM, fused=True)


def disable_fused_adam() -> None:
    """Undo ``enable_fused_adam``: ``torch.optim.Adam`` / ``AdamW`` are torch's again."""
    _patch(_ADAM, fused=False)


def _patch(table, fused: bool) -> None:
    for namespace, name, original, replacement in table:
        setattr(namespace, name, replacement if fused else original)
