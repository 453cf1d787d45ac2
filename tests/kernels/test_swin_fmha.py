"""swin_fmha: the Triton kernel (interpreter on CPU) against the fp32 PyTorch reference,
probabilities and the gradients of attn, relative position bias and mask."""

import pytest
import torch

from accrewrite.kernels.swin_fmha import swin_fmha, swin_fmha_reference

# Probabilities are in attn's dtype: fp32 to rounding, fp16/bf16 to about one ulp (the kernel
# and the reference both compute in fp32 and round once).
TOLERANCES = {
    torch.float64: dict(atol=1e-12, rtol=1e-10),
    torch.float32: dict(atol=1e-6, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=8e-3, rtol=1.6e-2),
}
# Gradients cancel: the softmax backward subtracts a row sum, and the bias and mask grads sum
# over windows, so summing in another order moves fp32 results by more than one rounding.
GRAD_TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-8),
    torch.float32: dict(atol=1e-5, rtol=1e-4),
    torch.float16: TOLERANCES[torch.float16],
    torch.bfloat16: TOLERANCES[torch.bfloat16],
}
# (images, windows per image, heads, tokens per window): Swin's 7x7 window, odd sizes, N=1,
# windows split over two programs.
SHAPES = [(2, 2, 1, 49), (1, 3, 2, 5), (3, 1, 1, 1), (1, 300, 1, 9)]


@pytest.fixture(autouse=True)
def force_triton_and_seed(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")
    torch.manual_seed(0)


def _inputs(device, shape, dtype, with_mask):
    """attn in ``dtype``; bias and mask fp32 as Swin's parameters and buffers (fp64 for fp64)."""
    images, nw, heads, n = shape
    param_dtype = torch.promote_types(dtype, torch.float32)
    attn = torch.randn(images * nw, heads, n, n, device=device).to(dtype)
    bias = torch.randn(heads, n, n, device=device).to(param_dtype)
    mask = None
    if with_mask:  # Swin's shifted-window mask: 0 inside a region, -100 across regions
        mask = torch.randint(0, 2, (nw, n, n), device=device).to(param_dtype) * -100.0
    return attn, bias, mask


def _run(fn, attn, bias, mask, grad):
    attn = attn.clone().requires_grad_()
    bias = bias.clone().requires_grad_()
    mask = mask.clone().requires_grad_() if mask is not None else None
    probs = fn(attn, bias, mask)
    probs.backward(grad)
    return probs, attn.grad, bias.grad, (mask.grad if mask is not None else None)


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("with_mask", [True, False], ids=["mask", "nomask"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(device, shape, dtype, with_mask):
    attn, bias, mask = _inputs(device, shape, dtype, with_mask)
    grad = torch.randn(attn.shape, device=device).to(dtype)
    ours = _run(swin_fmha, attn, bias, mask, grad)
    ref = _run(swin_fmha_reference, attn, bias, mask, grad)

    assert ours[0].dtype == dtype
    torch.testing.assert_close(ours[0], ref[0], **TOLERANCES[dtype])
    torch.testing.assert_close(ours[1], ref[1], **GRAD_TOLERANCES[dtype])
    assert ours[2].dtype == bias.dtype  # the bias (fp32, or fp64) accumulates in its precision
    torch.testing.assert_close(ours[2], ref[2], **GRAD_TOLERANCES[bias.dtype])
    if with_mask:  # summed from the attn grad, in attn's dtype
        torch.testing.assert_close(ours[3], ref[3], **GRAD_TOLERANCES[dtype])


def test_one_program_loops_over_all_windows(device, monkeypatch):
    import accrewrite.kernels.swin_fmha as module

    monkeypatch.setattr(module, "_TARGET_PROGRAMS", 1)  # no split: each program loops
    attn, bias, mask = _inputs(device, (1, 300, 1, 9), torch.float32, True)
    grad = torch.randn(attn.shape, device=device)
    ours = _run(swin_fmha, attn, bias, mask, grad)
    ref = _run(swin_fmha_reference, attn, bias, mask, grad)
    torch.testing.assert_close(ours[0], ref[0], **TOLERANCES[torch.float32])
    for got, want in zip(ours[1:], ref[1:]):
        torch.testing.assert_close(got, want, **GRAD_TOLERANCES[torch.float32])


def test_reference_is_eager_swin(device):
    """The reference is Swin's WindowAttention code, not just an oracle of itself."""
    images, nw, heads, n = 2, 3, 2, 4
    attn, bias, mask = _inputs(device, (images, nw, heads, n), torch.float32, True)
    eager = attn + bias.unsqueeze(0)
    eager = eager.view(images, nw, heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
    eager = torch.softmax(eager.view(-1, heads, n, n), dim=-1)
    torch.testing.assert_close(swin_fmha(attn, bias, mask), eager)
    torch.testing.assert_close(swin_fmha_reference(attn, bias, mask), eager)


def test_bias_with_leading_one_and_strided_attn(device):
    attn = torch.randn(4, 5, 2, 5, device=device).transpose(1, 2)  # (4, 2, 5, 5), strided
    bias = torch.randn(1, 2, 5, 5, device=device)
    torch.testing.assert_close(swin_fmha(attn, bias), swin_fmha_reference(attn, bias))


def test_empty_batch(device):
    attn = torch.randn(0, 2, 5, 5, device=device, requires_grad=True)
    probs = swin_fmha(attn, torch.randn(2, 5, 5, device=device))
    assert probs.shape == attn.shape
    probs.sum().backward()
    assert attn.grad.shape == attn.shape


def test_bad_shapes_raise(device):
    attn = torch.randn(4, 2, 5, 5, device=device)
    with pytest.raises(ValueError, match="relative_pos_bias"):
        swin_fmha(attn, torch.randn(3, 5, 5, device=device))
    with pytest.raises(ValueError, match="attn_mask"):
        swin_fmha(attn, torch.randn(2, 5, 5, device=device), torch.zeros(3, 5, 5, device=device))
    with pytest.raises(ValueError, match="attn must be"):
        swin_fmha(attn[..., :4], torch.randn(2, 5, 4, device=device))
    with pytest.raises(TypeError, match="floating point"):
        swin_fmha(attn.long(), torch.randn(2, 5, 5, device=device))
