"""quick_gelu: the Triton kernel (interpreter on CPU, compiled on CUDA) against the reference.

Both compute in float32 and round to the input dtype, so outputs and gradients agree to about
one unit in the last place: float32 rtol/atol 1e-5 (the sigmoids may differ in the last bit),
float16 1e-3, bfloat16 1.6e-2.
"""

import pytest
import torch

from accrewrite.kernels import quick_gelu as qg

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")


@pytest.mark.parametrize("shape", [(1,), (1023,), (3, 1025), (2, 3, 5, 7), (0, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(device, shape, dtype):
    torch.manual_seed(0)
    x = (torch.randn(shape, device=device) * 4).to(dtype).requires_grad_()
    y = qg.quick_gelu(x)
    expected = qg.quick_gelu_reference(x)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, expected, **TOL[dtype])
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    (expected_dx,) = torch.autograd.grad(expected, x, dy)
    torch.testing.assert_close(dx, expected_dx, **TOL[dtype])


def test_reference_is_the_quick_gelu_formula():
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)  # float64 stays float64
    expected = x * torch.sigmoid(1.702 * x)
    torch.testing.assert_close(qg.quick_gelu_reference(x), expected)
    # and an approximation of GELU, not GELU itself
    assert 0 < (expected - torch.nn.functional.gelu(x)).abs().max() < 0.03


def test_strided_input(device):
    x = torch.randn(17, 6, device=device).t()
    torch.testing.assert_close(qg.quick_gelu(x), qg.quick_gelu_reference(x), **TOL[torch.float32])


def test_integer_input_is_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        qg.quick_gelu(torch.arange(3))


def test_float64_takes_the_reference(monkeypatch):
    monkeypatch.setattr(qg, "_launch", None)  # the kernel computes in float32
    x = torch.randn(9, dtype=torch.float64)
    assert torch.equal(qg.quick_gelu(x), x * torch.sigmoid(1.702 * x))


@pytest.mark.slow
def test_builds_for_sm90():
    from _gpu_build import build_for_sm90

    builds = []
    for dtype in ("fp32", "bf16", "fp16"):
        x = f"*{dtype}"
        builds.append(("_quick_gelu_forward_kernel", dict(X=x, Y=x, n="i32", alpha="fp32"),
                       dict(BLOCK=qg._BLOCK), 4))
        builds.append(("_quick_gelu_backward_kernel", dict(X=x, DY=x, DX=x, n="i32", alpha="fp32"),
                       dict(BLOCK=qg._BLOCK), 4))
    assert build_for_sm90("accrewrite.kernels.quick_gelu", builds) == [""] * len(builds)
