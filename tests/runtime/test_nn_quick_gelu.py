"""QuickGelu, the module TorchAcc's migration guide puts in place of nn.GELU (on the CPU: the
reference path)."""

import pytest
import torch

from accrewrite.runtime.nn import QuickGelu
from accrewrite.runtime.nn.quick_gelu import QuickGelu as QuickGeluFromSeedPath


def test_is_x_times_sigmoid_1702x_with_its_gradient():
    assert QuickGelu is QuickGeluFromSeedPath
    x = torch.linspace(-5, 5, 41, requires_grad=True)
    y = QuickGelu()(x)
    expected = x * torch.sigmoid(1.702 * x)
    torch.testing.assert_close(y, expected)
    (dx,) = torch.autograd.grad(y.sum(), x)
    (expected_dx,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(dx, expected_dx)


def test_replaces_nn_gelu_call_sites():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), QuickGelu(approximate="tanh"))
    assert m(torch.randn(3, 4)).shape == (3, 4)
    assert not list(QuickGelu().parameters()) and QuickGelu().state_dict() == {}
    with pytest.raises(ValueError, match="approximate"):
        QuickGelu(approximate="erf")
