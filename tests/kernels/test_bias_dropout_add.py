"""bias_dropout_add: the Triton kernel (interpreter on CPU, compiled on CUDA) against the reference.

The kernel draws its mask from Philox and torch's dropout from torch's generator, so the two
never drop the same elements. The tests therefore recover the kernel's own mask (the same seed
applied to x = 1, residual = 0 gives mask / (1 - p)) and check:
- the forward against ``bias_dropout_add_reference(..., mask=that mask)``, and the backward
  against autograd through that reference: the backward must regenerate exactly the forward's
  mask;
- the mask's statistics: the kept fraction is 1 - p within 5 binomial standard deviations;
- determinism: one seed gives one mask, torch.manual_seed makes the default seed repeatable.
The kernel computes in float32 and rounds once to the output dtype; the reference computes in
the input dtype: float32 rtol/atol 1e-6, float16 rtol 1e-3, bfloat16 rtol 1.6e-2, with an atol of
a few units in the last place of values of size 2 (float16 4e-3, bfloat16 3e-2), because the
bias gradient sums rows that can cancel.
"""

import pytest
import torch

from accrewrite.kernels import bias_dropout_add as bda

TOL = {
    torch.float32: dict(rtol=1e-6, atol=1e-6),
    torch.float16: dict(rtol=1e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=3e-2),
}


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")


def _kernel_mask(shape, p, seed, device):
    """The keep mask the kernel draws for this shape, p and seed."""
    ones = torch.ones(shape, device=device)
    return bda.bias_dropout_add(ones, None, torch.zeros_like(ones), p, seed=seed) != 0


@pytest.mark.parametrize("shape", [(1,), (3, 1025), (2, 3, 127)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_matches_reference_with_the_kernels_mask(device, shape, dtype, with_bias):
    torch.manual_seed(0)
    p, seed = 0.3, 1234
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    bias = None
    if with_bias:
        bias = torch.randn(shape[-1], device=device, dtype=dtype, requires_grad=True)
    residual = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    inputs = [t for t in (x, bias, residual) if t is not None]
    mask = _kernel_mask(shape, p, seed, device)
    if mask.numel() > 100:  # the mask is not trivially all-kept or all-dropped
        assert mask.any() and not mask.all()

    out = bda.bias_dropout_add(x, bias, residual, p, seed=seed)
    expected = bda.bias_dropout_add_reference(x, bias, residual, p, mask=mask)
    assert out.dtype == expected.dtype == dtype
    torch.testing.assert_close(out, expected, **TOL[dtype])

    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, dout)
    expected_grads = torch.autograd.grad(expected, inputs, dout)
    for g, e in zip(grads, expected_grads):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, **TOL[dtype])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_scaling(device, p):
    n = 1 << 14
    mask = _kernel_mask((n,), p, seed=7, device=device)
    kept = mask.float().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept - (1 - p)) < 5 * sigma
    # kept elements are scaled by exactly 1 / (1 - p)
    x = torch.full((n,), 2.0, device=device)
    out = bda.bias_dropout_add(x, None, torch.zeros_like(x), p, seed=7)
    torch.testing.assert_close(out[mask], torch.full_like(out[mask], 2.0 / (1 - p)))


def test_seeds(device):
    shape = (4, 300)
    a = _kernel_mask(shape, 0.5, seed=1, device=device)
    assert torch.equal(a, _kernel_mask(shape, 0.5, seed=1, device=device))
    assert not torch.equal(a, _kernel_mask(shape, 0.5, seed=2, device=device))
    x = torch.randn(shape, device=device)
    torch.manual_seed(5)
    first = bda.bias_dropout_add(x, None, x, 0.5)
    second = bda.bias_dropout_add(x, None, x, 0.5)
    torch.manual_seed(5)
    assert torch.equal(first, bda.bias_dropout_add(x, None, x, 0.5))
    assert not torch.equal(first, second)  # a fresh seed per call


def test_scalar_input(device):
    x = torch.tensor(3.0, device=device)
    out = bda.bias_dropout_add(x, None, torch.zeros_like(x), 0.5, seed=3)
    assert out.shape == () and out.item() in (0.0, 6.0)


def test_no_dropout_cases(device):
    x, residual = torch.randn(3, 8, device=device), torch.randn(3, 8, device=device)
    bias = torch.randn(8, device=device)
    torch.testing.assert_close(bda.bias_dropout_add(x, bias, residual, 0.0), residual + x + bias)
    torch.testing.assert_close(bda.bias_dropout_add(x, bias, residual, 0.7, training=False),
                               residual + x + bias)
    x.requires_grad_()
    out = bda.bias_dropout_add(x, bias, residual, 1.0)
    torch.testing.assert_close(out, residual)
    (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert not dx.any()


def test_reference_path_is_torch_dropout(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "reference")
    x, residual, bias = torch.randn(64, 16), torch.randn(64, 16), torch.randn(16)
    torch.manual_seed(3)
    out = bda.bias_dropout_add(x, bias, residual, 0.25)
    torch.manual_seed(3)
    assert torch.equal(out, residual + torch.nn.functional.dropout(x + bias, 0.25))


def test_bad_input_is_reported():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        bda.bias_dropout_add(x, None, x, 1.5)
    with pytest.raises(ValueError, match="residual has shape"):
        bda.bias_dropout_add(x, None, torch.randn(4, 2), 0.1)
    with pytest.raises(ValueError, match="bias must have shape"):
        bda.bias_dropout_add(x, torch.randn(2), x, 0.1)


def test_float64_takes_the_reference(monkeypatch):
    monkeypatch.setattr(bda, "bias_dropout_add_op", None)  # float32 kernel
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.manual_seed(0)
    out = bda.bias_dropout_add(x, None, x, 0.5)
    torch.manual_seed(0)
    assert torch.equal(out, x + torch.nn.functional.dropout(x, 0.5))


@pytest.mark.slow
def test_builds_for_sm90():
    from _gpu_build import build_for_sm90

    builds = []
    for dtype, has_bias in [("bf16", True), ("fp32", False), ("fp16", True)]:
        x = f"*{dtype}"
        builds.append(("_forward_kernel",
                       dict(X=x, Bias=x, Residual=x, Out=x, n="i32", n_cols="i32", p="fp32",
                            scale="fp32", seed="*i64"),
                       dict(HAS_BIAS=has_bias, BLOCK=bda._BLOCK), 4))
        builds.append(("_backward_kernel",
                       dict(DOut=x, DX=x, n="i64", p="fp32", scale="fp32", seed="*i64"),
                       dict(BLOCK=bda._BLOCK), 4))
    assert build_for_sm90("accrewrite.kernels.bias_dropout_add", builds) == [""] * len(builds)
