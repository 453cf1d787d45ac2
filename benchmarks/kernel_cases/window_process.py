"""window_process cases: the fused shift + partition kernel (and merge + reverse shift) against
``torch.roll`` + ``window_partition`` (eager, torch.compile), Swin-T shapes at batch 128.

Goal: forward + backward at least 2x eager (Swin's published fused kernel: 2.0x).
"""

import torch

from accrewrite.kernels.window_process import (
    window_process,
    window_process_reference,
    window_process_reverse,
    window_process_reverse_reference,
)

from . import Case, forward_backward

WINDOW, SHIFT = 7, 3
# (B, H, W, C, dtype): Swin-T stages 1 and 2 (56x56x96, 28x28x192) at batch 128
SHAPES = [(128, 56, 56, 96, torch.bfloat16), (128, 28, 28, 192, torch.bfloat16),
          (128, 56, 56, 96, torch.float32)]
SMOKE_SHAPES = [(2, 14, 14, 5, torch.float32)]


def cases(device, *, smoke=False, compile=torch.compile):
    result = []
    for B, H, W, C, dtype in SMOKE_SHAPES if smoke else SHAPES:
        result += _cases_for(B, H, W, C, dtype, device, compile)
    return result


def _cases_for(B, H, W, C, dtype, device, compile):
    label = f"{str(dtype).removeprefix('torch.')} {B}x{H}x{W}x{C} ws{WINDOW}"
    x = torch.randn(B, H, W, C, device=device, dtype=dtype, requires_grad=True)
    windows = torch.randn(B * (H // WINDOW) * (W // WINDOW), WINDOW, WINDOW, C, device=device,
                          dtype=dtype, requires_grad=True)

    def partition(fn):  # a shifted block's way in: shift by -s, then partition
        return forward_backward(lambda t: fn(t, -SHIFT, WINDOW), (x,), torch.randn_like(windows))

    def merge(fn):  # and its way out: merge, then shift by +s
        return forward_backward(lambda t: fn(t, H, W, SHIFT, WINDOW), (windows,),
                                torch.randn_like(x))

    return [
        Case(name=f"window_process {label}",
             ours=partition(window_process),
             eager=partition(window_process_reference),
             compiled=partition(compile(window_process_reference))),
        Case(name=f"window_process_reverse {label}",
             ours=merge(window_process_reverse),
             eager=merge(window_process_reverse_reference),
             compiled=merge(compile(window_process_reverse_reference))),
    ]
