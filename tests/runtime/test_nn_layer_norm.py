"""FusedLayerNorm as a drop-in for nn.LayerNorm (on the CPU: the reference path)."""

import pytest
import torch

from accrewrite.runtime.nn import FusedLayerNorm


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(elementwise_affine=False), dict(bias=False), dict(eps=1e-3)],
    ids=["affine", "no-affine", "no-bias", "eps"],
)
def test_same_init_state_dict_and_results_as_nn_layer_norm(kwargs):
    torch.manual_seed(0)
    ours, theirs = FusedLayerNorm((3, 8), **kwargs), torch.nn.LayerNorm((3, 8), **kwargs)
    assert isinstance(ours, torch.nn.LayerNorm)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs.state_dict()[key])
    assert repr(ours).replace("FusedLayerNorm", "LayerNorm") == repr(theirs)

    # a trained nn.LayerNorm checkpoint loads, and both give the same output and gradients
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 3, 8, requires_grad=True)
    y, expected = ours(x), theirs(x)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *ours.parameters()], dy)
    expected_grads = torch.autograd.grad(expected, [x, *theirs.parameters()], dy)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_device_and_dtype_arguments():
    m = FusedLayerNorm(4, device="cpu", dtype=torch.float64)
    assert m.weight.dtype == torch.float64
    assert m(torch.randn(2, 4, dtype=torch.float64)).dtype == torch.float64


def test_output_keeps_the_input_dtype_under_autocast():
    m = FusedLayerNorm(16)
    x = torch.randn(4, 16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16  # nn.LayerNorm would give float32 here (see the module doc)
    torch.testing.assert_close(y.float(), torch.nn.functional.layer_norm(x.float(), (16,)),
                               rtol=1.6e-2, atol=1e-2)


def test_wrong_input_shape_is_reported():
    with pytest.raises(ValueError, match="trailing dims"):
        FusedLayerNorm(8)(torch.randn(2, 7))
