"""bias_dropout_add cases: the Philox kernel against ``residual + F.dropout(x + bias)`` (eager,
torch.compile).

Goal: forward + backward at least 2x eager.
"""

import torch
import torch.nn.functional as F

from accrewrite.kernels.bias_dropout_add import bias_dropout_add

from . import Case, forward_backward

SHAPES = [((8192, 4096), torch.bfloat16), ((8192, 4096), torch.float32)]
SMOKE_SHAPES = [((4, 3, 17), torch.float32)]
P = 0.1


def eager_bias_dropout_add(x, bias, residual):
    return residual + F.dropout(x + bias, P, training=True)


def ours(x, bias, residual):
    return bias_dropout_add(x, bias, residual, P)


def cases(device, *, smoke=False, compile=torch.compile):
    result = []
    for shape, dtype in SMOKE_SHAPES if smoke else SHAPES:
        x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        bias = torch.randn(shape[-1], device=device, dtype=dtype, requires_grad=True)
        residual = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        inputs = (x, bias, residual)
        grad_out = torch.randn_like(x)
        result.append(Case(
            name=f"bias_dropout_add {str(dtype).removeprefix('torch.')} "
                 f"{'x'.join(map(str, shape))}",
            ours=forward_backward(ours, inputs, grad_out),
            eager=forward_backward(eager_bias_dropout_add, inputs, grad_out),
            compiled=forward_backward(compile(eager_bias_dropout_add), inputs, grad_out),
        ))
    return result
