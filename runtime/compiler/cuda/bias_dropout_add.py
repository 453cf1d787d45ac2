"""bias_dropout_add's Triton kernel (``accrewrite.kernels.bias_dropout_add``) as its
implementation "triton". Inductor draws its dropout mask inside its fused kernel as well, so the
rule leaves it to inductor, as for a pointwise kernel."""

import torch

from accrewrite.kernels.bias_dropout_add import bias_dropout_add_op
from accrewrite.runtime.compiler.core.registry import register
from accrewrite.runtime.compiler.core.triton_kernels import left_to_inductor, triton_implementation


def _unsupported(args):
    x, bias, residual = args["x"], args.get("bias"), args["residual"]
    if residual.shape != x.shape:
        return f"residual {list(residual.shape)} is broadcast to x {list(x.shape)}"
    if bias is not None and bias.shape != x.shape[-1:]:
        return f"bias {list(bias.shape)} is not over x's last dimension only"
    return None


def _bias_dropout_add(x, residual, p, bias=None):
    # The graph draws the seed at every call, on x's device (no host sync); the op's backward
    # draws the same mask again from it.
    seed = torch.randint(2**31 - 1, (), device=x.device)
    return bias_dropout_add_op(x, bias, residual, p, seed)


register(triton_implementation(
    "bias_dropout_add", "x", _bias_dropout_add, left_to_inductor, _unsupported
))
