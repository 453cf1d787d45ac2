"""dropout_add_fused_train / dropout_add_fused with the call signatures of TorchAcc's migration
guide (CPU: torch's dropout, so under the same torch seed they equal the unfused expression
exactly)."""

import pytest
import torch

from accrewrite.runtime.nn import dropout_add_fused, dropout_add_fused_train


def test_train_is_residual_plus_dropout_of_x():
    x = torch.randn(8, 32, requires_grad=True)
    to_add = torch.randn(8, 32, requires_grad=True)
    torch.manual_seed(0)
    with torch.enable_grad():
        y = dropout_add_fused_train(x, to_add, 0.2)
    torch.manual_seed(0)
    expected = to_add + torch.nn.functional.dropout(x, 0.2, training=True)
    assert torch.equal(y, expected)
    assert (y == to_add).any()  # something was dropped
    dx, dto_add = torch.autograd.grad(y.sum(), [x, to_add])
    assert torch.equal(dto_add, torch.ones_like(to_add))
    assert torch.equal(dx, (expected != to_add).float() / 0.8)


def test_inference_adds_without_dropout():
    x, to_add = torch.randn(4, 6), torch.randn(4, 6)
    assert torch.equal(dropout_add_fused(x, to_add, 0.5), to_add + x)


def test_bad_drop_rate_is_reported():
    x = torch.randn(2, 2)
    for fn in (dropout_add_fused_train, dropout_add_fused):
        with pytest.raises(ValueError, match="probability"):
            fn(x, x, -0.1)
