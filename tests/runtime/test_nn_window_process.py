"""WindowProcess / WindowProcessReverse with the call signatures and sign conventions of
TorchAcc's migration guide.

These run the reference path (the CPU path); tests/kernels/test_window_process.py checks the
Triton kernel against it.
"""

import pytest
import torch

from accrewrite.runtime.nn import WindowProcess, WindowProcessReverse
from accrewrite.kernels.window_process import window_partition, window_reverse


def test_swin_block_round_trip_matches_unfused():
    B, H, W, C, ws, shift = 2, 14, 14, 5, 7, 3
    x = torch.randn(B, H, W, C, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()

    # The migration guide's unfused Swin code ...
    shifted = torch.roll(x_ref, shifts=(-shift, -shift), dims=(1, 2))
    windows_ref = window_partition(shifted, ws)
    out_ref = torch.roll(window_reverse(windows_ref * 2, ws, H, W), (shift, shift), (1, 2))
    # ... and its fused replacement.
    windows = WindowProcess.apply(x, B, H, W, C, -shift, ws)
    out = WindowProcessReverse.apply(windows * 2, B, H, W, C, shift, ws)

    assert torch.equal(windows, windows_ref)
    assert torch.equal(out, out_ref)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_ref.backward(grad)
    assert torch.equal(x.grad, x_ref.grad)


def test_shape_arguments_are_checked():
    x = torch.randn(1, 4, 4, 2)
    with pytest.raises(ValueError, match="B, H, W, C"):
        WindowProcess.apply(x, 1, 4, 4, 3, 0, 2)
    with pytest.raises(ValueError, match="B, H, W, C"):
        WindowProcessReverse.apply(torch.randn(4, 2, 2, 2), 2, 4, 4, 2, 0, 2)
