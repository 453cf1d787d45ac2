"""layer_norm: the Triton kernel (interpreter on CPU, compiled on CUDA) against the reference.

Both compute in float32; the outputs and input gradients are rounded to the input dtype, so they
are compared to about one unit in the last place of that dtype: float32 rtol/atol 1e-5,
float16 1e-3, bfloat16 1.6e-2 (atol 2e-2 for values that cancel). The input gradient is
proportional to 1/std, so its atol is scaled by the rows' largest 1/std (1/sqrt(eps) = 316 at
hidden size 1, where the variance is 0 and both paths return rounding noise). Weight and bias
gradients are float32 sums over rows taken in a different order: rtol/atol 1e-4.
"""

import pytest
import torch

from accrewrite.kernels import layer_norm as ln

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=2e-2),
}
PARAM_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")


def _check(x, normalized_shape, weight, bias, eps=1e-5):
    """Forward and backward of both paths on the same inputs and output gradient."""
    inputs = [t for t in (x, weight, bias) if t is not None]
    for t in inputs:
        t.requires_grad_(True)
    y = ln.layer_norm(x, normalized_shape, weight, bias, eps)
    expected = ln.layer_norm_reference(x, normalized_shape, weight, bias, eps)
    assert y.dtype == expected.dtype == x.dtype and y.shape == x.shape
    torch.testing.assert_close(y, expected, **TOL[x.dtype])
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, inputs, dy)
    expected_grads = torch.autograd.grad(expected, inputs, dy)
    n_dims = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    dims = tuple(range(x.dim() - n_dims, x.dim()))
    rstd_max = 1.0
    if x.numel():
        rstd_max = (x.detach().float().var(dims, unbiased=False) + eps).rsqrt().max().item()
    tol = TOL[x.dtype]
    torch.testing.assert_close(grads[0], expected_grads[0], rtol=tol["rtol"],
                               atol=tol["atol"] * max(1.0, rstd_max))
    for g, e, t in zip(grads[1:], expected_grads[1:], inputs[1:]):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g, e, **PARAM_TOL)


@pytest.mark.parametrize("hidden", [1, 127, 1000, 4096, 8192])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(device, hidden, dtype):
    torch.manual_seed(hidden)
    x = (torch.randn(3, 3, hidden, device=device) * 2 + 0.5).to(dtype)
    weight = torch.randn(hidden, device=device)
    bias = torch.randn(hidden, device=device)
    _check(x, (hidden,), weight, bias)


@pytest.mark.parametrize("affine", ["weight-only", "bias-only", "none"])
@pytest.mark.parametrize("hidden", [1, 127])
def test_without_affine_or_bias(device, affine, hidden):
    torch.manual_seed(0)
    x = torch.randn(7, hidden, device=device)
    weight = torch.randn(hidden, device=device) if affine == "weight-only" else None
    bias = torch.randn(hidden, device=device) if affine == "bias-only" else None
    _check(x, hidden, weight, bias)


def test_low_precision_params_and_several_normalized_dims(device):
    torch.manual_seed(1)
    x = torch.randn(4, 3, 5, device=device, dtype=torch.bfloat16)
    weight = torch.randn(3, 5, device=device, dtype=torch.bfloat16)
    bias = torch.randn(3, 5, device=device, dtype=torch.bfloat16)
    _check(x, (3, 5), weight, bias, eps=1e-3)


def test_strided_input_and_empty_batch(device):
    torch.manual_seed(2)
    x = torch.randn(33, 9, device=device).t()  # last dim not contiguous
    _check(x, (33,), torch.randn(33, device=device), torch.randn(33, device=device))
    _check(torch.randn(0, 4, 16, device=device), 16, torch.randn(16, device=device),
           torch.randn(16, device=device))


def test_rows_too_wide_for_one_program_take_the_reference(monkeypatch):
    def refuse(*args):
        raise AssertionError("the Triton path must not be taken")

    monkeypatch.setattr(ln, "_forward", refuse)
    hidden = ln.MAX_FUSED_SIZE // 4 + 1
    x = torch.randn(2, hidden)
    expected = torch.nn.functional.layer_norm(x, (hidden,))
    torch.testing.assert_close(ln.layer_norm(x, hidden), expected)


def test_reference_is_torch_layer_norm_in_float32():
    torch.manual_seed(3)
    x = torch.randn(4, 10)
    w, b = torch.randn(10), torch.randn(10)
    expected = torch.nn.functional.layer_norm(x, (10,), w, b)
    assert torch.equal(ln.layer_norm_reference(x, (10,), w, b), expected)


def test_bad_shapes_are_reported():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="trailing dims"):
        ln.layer_norm(x, 7)
    with pytest.raises(ValueError, match="trailing dims"):
        ln.layer_norm(x, (2, 2, 8))
    with pytest.raises(ValueError, match="weight has shape"):
        ln.layer_norm(x, 8, torch.ones(4))


def test_float64_takes_the_reference(monkeypatch):
    monkeypatch.setattr(ln, "_forward", None)  # the kernel computes in float32
    x = torch.randn(3, 10, dtype=torch.float64)
    assert torch.equal(ln.layer_norm(x, 10), torch.nn.functional.layer_norm(x, (10,)))


def test_broadcast_output_gradient(device):
    # y.sum().backward() hands the backward an expanded (stride 0) gradient
    x = torch.randn(4, 33, device=device, requires_grad=True)
    weight = torch.randn(33, device=device, requires_grad=True)
    ln.layer_norm(x, 33, weight).sum().backward()
    expected = torch.autograd.grad(ln.layer_norm_reference(x, 33, weight).sum(), [x, weight])
    torch.testing.assert_close(x.grad, expected[0], **TOL[torch.float32])
    torch.testing.assert_close(weight.grad, expected[1], **PARAM_TOL)


@pytest.mark.slow
def test_builds_for_sm90():
    from _gpu_build import build_for_sm90

    variants = [("bf16", 4096, True, True), ("fp32", 1, False, False),
                ("fp16", 8192, True, False), ("bf16", 1000, False, True)]
    builds = []
    for dtype, hidden, has_weight, has_bias in variants:
        flags = dict(HAS_WEIGHT=has_weight, HAS_BIAS=has_bias)
        forward_block, forward_warps = ln._block_settings(hidden)
        backward_block, backward_warps = ln._block_settings(hidden, backward=True)
        x, f32 = f"*{dtype}", "*fp32"
        builds.append(("_layer_norm_forward_kernel",
                       dict(X=x, Y=x, W=x, B=x, Mean=f32, Rstd=f32, stride_row="i32", N="i32",
                            eps="fp32"),
                       dict(flags, BLOCK_N=forward_block), forward_warps))
        builds.append(("_layer_norm_backward_kernel",
                       dict(X=x, W=x, Mean=f32, Rstd=f32, DY=x, DX=x, DW=f32, DB=f32, stride_x="i32",
                            stride_dy="i32", M="i32", N="i32", rows_per_program="i32"),
                       dict(flags, BLOCK_N=backward_block), backward_warps))
    assert build_for_sm90("accrewrite.kernels.layer_norm", builds) == [""] * len(builds)
