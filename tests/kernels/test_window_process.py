"""window_process: the Triton kernel (interpreter on CPU) against torch.roll + window_partition.

Pure data movement, so every comparison is exact (torch.equal) for every dtype, gradients too.
"""

import pytest
import torch

from accrewrite.kernels.window_process import (
    window_process,
    window_process_reference,
    window_process_reverse,
    window_process_reverse_reference,
    window_shuffle_op,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (B, H, W, C, window_size): Swin's 7x7 windows, non-square maps, odd and >128 channel counts.
SHAPES = [(2, 14, 21, 3, 7), (1, 8, 8, 130, 4), (3, 6, 4, 1, 2), (1, 5, 5, 7, 5)]
# Signed shifts as given to torch.roll: Swin's -ws//2 / +ws//2, zero, and shifts beyond H or W.
SHIFTS = [0, -3, 2, 9, -17]


@pytest.fixture(autouse=True)
def force_triton(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_partition_and_merge_are_bit_exact(device, shape, dtype):
    B, H, W, C, ws = shape
    x = torch.randn(B, H, W, C, device=device).to(dtype)
    for shift in SHIFTS:
        windows = window_process(x, shift, ws)
        assert windows.shape == (B * (H // ws) * (W // ws), ws, ws, C)
        assert torch.equal(windows, window_process_reference(x, shift, ws)), shift
        merged = window_process_reverse(windows, H, W, -shift, ws)
        assert torch.equal(merged, window_process_reverse_reference(windows, H, W, -shift, ws))
        assert torch.equal(merged, x), shift


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_gradients_are_bit_exact(device, shape, dtype):
    B, H, W, C, ws = shape
    shift = -(ws // 2)
    x = torch.randn(B, H, W, C, device=device).to(dtype)
    windows = torch.randn(B * (H // ws) * (W // ws), ws, ws, C, device=device).to(dtype)
    grad_w = torch.randn_like(windows)
    grad_x = torch.randn_like(x)
    cases = [
        (window_process, window_process_reference, x, (shift, ws), grad_w),
        (window_process_reverse, window_process_reverse_reference, windows, (H, W, -shift, ws),
         grad_x),
    ]
    for fused, reference, inp, args, grad in cases:
        a = inp.clone().requires_grad_()
        b = inp.clone().requires_grad_()
        fused(a, *args).backward(grad)
        reference(b, *args).backward(grad)
        assert torch.equal(a.grad, b.grad), fused.__name__


def test_non_contiguous_input_and_flat_windows(device):
    x = torch.randn(2, 8, 12, 6, device=device).transpose(1, 2)  # (2, 12, 8, 6), strided
    assert torch.equal(window_process(x, -2, 4), window_process_reference(x, -2, 4))
    flat = window_process_reference(x, -2, 4).reshape(-1, 16, 6)  # Swin's (B*nW, N, C) view
    assert torch.equal(window_process_reverse(flat, 12, 8, 2, 4), x)


def test_empty_batch(device):
    x = torch.randn(0, 4, 4, 3, device=device, requires_grad=True)
    windows = window_process(x, 1, 2)
    assert windows.shape == (0, 2, 2, 3)
    windows.sum().backward()
    assert x.grad.shape == x.shape
    assert window_process_reverse(windows, 4, 4, -1, 2).shape == (0, 4, 4, 3)


def test_bad_input_raises(device):
    x = torch.randn(1, 6, 6, 2, device=device)
    with pytest.raises(ValueError, match="divide"):
        window_process(x, 0, 4)
    with pytest.raises(ValueError, match=r"\(B, H, W, C\)"):
        window_process(x[0], 0, 3)
    with pytest.raises(ValueError, match="whole"):
        window_process_reverse(torch.randn(5, 3, 3, 2, device=device), 6, 6, 0, 3)


def test_reference_env_bypasses_triton(monkeypatch):
    import accrewrite.kernels.window_process as module

    monkeypatch.setenv("ACCREWRITE_KERNELS", "reference")
    monkeypatch.setattr(module, "_launch", None)  # any use of the kernel would fail
    x = torch.randn(1, 4, 4, 3)
    assert torch.equal(window_process(x, 1, 2), window_process_reference(x, 1, 2))


@pytest.mark.parametrize("to_windows", [True, False])
def test_operator_registration(to_windows):
    """Schema, fake implementation and autograd (the op in the other direction)."""
    src = torch.randn(2, 4, 6, 3, requires_grad=True)
    torch.library.opcheck(window_shuffle_op, (src, [2, 4, 6, 3], -1, 2, to_windows))
