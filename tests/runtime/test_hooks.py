"""hooks.enable_fused_layer_norm / enable_fused_adam and their undo."""

import pytest
import torch

from accrewrite.runtime import hooks
from accrewrite.runtime.nn import FusedLayerNorm
from accrewrite.runtime.optim import FusedAdam, FusedAdamW

TORCH_LAYER_NORM = torch.nn.LayerNorm
TORCH_ADAM, TORCH_ADAMW = torch.optim.Adam, torch.optim.AdamW


@pytest.fixture(autouse=True)
def _restore():
    """Whatever a test does, torch's classes are back afterwards (other tests share torch)."""
    yield
    hooks.disable_fused_layer_norm()
    hooks.disable_fused_adam()
    assert torch.nn.LayerNorm is TORCH_LAYER_NORM and torch.optim.Adam is TORCH_ADAM


def test_fused_layer_norm_hook():
    hooks.enable_fused_layer_norm()
    hooks.enable_fused_layer_norm()  # twice is harmless
    from torch.nn import LayerNorm

    class Block(torch.nn.Module):  # as model code would: the class is looked up at build time
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)

    assert type(Block().norm) is FusedLayerNorm
    assert LayerNorm is FusedLayerNorm and torch.nn.modules.LayerNorm is FusedLayerNorm
    hooks.disable_fused_layer_norm()
    assert type(Block().norm) is TORCH_LAYER_NORM
    assert torch.nn.modules.LayerNorm is TORCH_LAYER_NORM


def test_fused_adam_hook():
    params = [torch.nn.Parameter(torch.randn(3))]
    hooks.enable_fused_adam()
    hooks.enable_fused_adam()
    assert type(torch.optim.Adam(params)) is FusedAdam
    assert type(torch.optim.AdamW(params, lr=1e-2)) is FusedAdamW
    assert torch.nn.LayerNorm is TORCH_LAYER_NORM  # each hook patches only its own names
    hooks.disable_fused_adam()
    assert type(torch.optim.Adam(params)) is TORCH_ADAM
    assert type(torch.optim.AdamW(params)) is TORCH_ADAMW


def test_hooked_classes_still_subclassable_and_isinstance():
    hooks.enable_fused_adam()

    class MyAdam(torch.optim.Adam):
        pass

    optimizer = MyAdam([torch.nn.Parameter(torch.randn(2))])
    assert isinstance(optimizer, TORCH_ADAM) and isinstance(optimizer, FusedAdam)
