"""quick_gelu cases: QuickGelu's kernel against ``x * sigmoid(1.702 x)`` (eager, torch.compile)."""

import torch

from accrewrite.kernels.quick_gelu import quick_gelu

from . import Case, forward_backward

SHAPES = [((8192, 16384), torch.bfloat16), ((8192, 4096), torch.float32)]  # MLP activations
SMOKE_SHAPES = [((5, 33), torch.float32)]


def eager_quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def cases(device, *, smoke=False, compile=torch.compile):
    result = []
    for shape, dtype in SMOKE_SHAPES if smoke else SHAPES:
        x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        grad_out = torch.randn_like(x)
        result.append(Case(
            name=f"quick_gelu {str(dtype).removeprefix('torch.')} {'x'.join(map(str, shape))}",
            ours=forward_backward(quick_gelu, (x,), grad_out),
            eager=forward_backward(eager_quick_gelu, (x,), grad_out),
            compiled=forward_backward(compile(eager_quick_gelu), (x,), grad_out),
        ))
    return result
