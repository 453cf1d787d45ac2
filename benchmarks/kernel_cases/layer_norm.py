"""layer_norm cases: FusedLayerNorm's kernel against F.layer_norm (eager, torch.compile) and,
on CUDA where installed, Liger-Kernel's Triton layer norm.

Goal: forward + backward at hidden 4096 in bfloat16 at least 1.3x eager.
"""

import torch
import torch.nn.functional as F

from accrewrite.kernels.layer_norm import layer_norm

from . import Case, forward_backward

try:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
except ImportError:  # an optional comparison, never a requirement
    LigerLayerNormFunction = None

SHAPES = [  # (rows, hidden, dtype): a batch of tokens of transformer widths
    (8192, 4096, torch.bfloat16),
    (8192, 1024, torch.bfloat16),
    (4096, 8192, torch.bfloat16),
    (8192, 4096, torch.float32),
    (8192, 1024, torch.float32),
]
SMOKE_SHAPES = [(6, 127, torch.float32), (4, 64, torch.bfloat16)]


def cases(device, *, smoke=False, compile=torch.compile):
    result = []
    for rows, hidden, dtype in SMOKE_SHAPES if smoke else SHAPES:
        x = torch.randn(rows, hidden, device=device, dtype=dtype, requires_grad=True)
        weight = torch.randn(hidden, device=device, dtype=dtype, requires_grad=True)
        bias = torch.randn(hidden, device=device, dtype=dtype, requires_grad=True)
        inputs = (x, (hidden,), weight, bias)
        grad_out = torch.randn_like(x)
        others = {}
        if LigerLayerNormFunction is not None and device == "cuda":  # its kernels need a GPU
            others["liger"] = forward_backward(LigerLayerNormFunction.apply, (x, weight, bias, 1e-5),
                                               grad_out)
        result.append(Case(
            name=f"layer_norm {str(dtype).removeprefix('torch.')} {rows}x{hidden}",
            ours=forward_backward(layer_norm, inputs, grad_out),
            eager=forward_backward(F.layer_norm, inputs, grad_out),
            compiled=forward_backward(compile(F.layer_norm), inputs, grad_out),
            others=others,
        ))
    return result
