"""QuickGELU, ``x * sigmoid(1.702 * x)`` (the GELU approximation of CLIP and OpenAI's GPT-2 code).

One operator, ``accrewrite::quick_gelu`` (``quick_gelu_op``), that eager code, the nn module and
compiled graphs all call. Triton path: one elementwise kernel forward, one backward
(``accrewrite::quick_gelu_backward``) that recomputes the sigmoid from the saved input instead
of storing it. Both compute in float32 and store in the input's dtype. Elsewhere (see
``dispatch.use_triton``) the operator computes the same in PyTorch, for compiled graphs; eager
calls there run the reference directly.
"""

from __future__ import annotations

import torch

from accrewrite.kernels.compiler_op import CompilerOp, Pattern, left_to_inductor
from accrewrite.kernels.dispatch import KERNEL_DTYPES, triton_available, use_triton

if triton_available():
    import triton
    import triton.language as tl

ALPHA = 1.702
_BLOCK = 1024


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(1.702 * x)``, elementwise."""
    if not x.is_floating_point():
        raise TypeError(f"quick_gelu: expected a floating-point tensor, got {x.dtype}")
    if not _kernel_takes(x):
        return quick_gelu_reference(x)  # without the operator's dispatch cost
    return quick_gelu_op(x)


def quick_gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """The PyTorch reference, computed in float32 (or float64) and returned in ``x``'s dtype."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.sigmoid(ALPHA * wide)).to(x.dtype)


def _kernel_takes(x: torch.Tensor) -> bool:
    # float64 takes the reference, which keeps its precision
    return x.dtype in KERNEL_DTYPES and use_triton(x)


@torch.library.custom_op("accrewrite::quick_gelu", mutates_args=())
def quick_gelu_op(x: torch.Tensor) -> torch.Tensor:
    if _kernel_takes(x):
        return _launch(_quick_gelu_forward_kernel, x)
    return quick_gelu_reference(x)


@torch.library.custom_op("accrewrite::quick_gelu_backward", mutates_args=())
def quick_gelu_backward_op(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if _kernel_takes(x):
        return _launch(_quick_gelu_backward_kernel, x, dy)
    wide = torch.promote_types(x.dtype, torch.float32)
    xw, dyw = x.to(wide), dy.to(wide)
    s = torch.sigmoid(ALPHA * xw)
    return (dyw * (s + ALPHA * xw * s * (1 - s))).to(x.dtype)


@quick_gelu_op.register_fake
def _(x):
    return torch.empty_like(x)


@quick_gelu_backward_op.register_fake
def _(dy, x):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dy):
    return quick_gelu_backward_op(dy, *ctx.saved_tensors)


quick_gelu_op.register_autograd(_backward, setup_context=_setup_context)


def _launch(kernel, x, dy=None):
    """The forward kernel on ``x``, or with ``dy`` the backward one: the output (``x``'s
    dtype)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        grid = (triton.cdiv(n, _BLOCK),)
        if dy is None:
            kernel[grid](x, out, n, ALPHA, BLOCK=_BLOCK)
        else:
            kernel[grid](x, dy.contiguous(), out, n, ALPHA, BLOCK=_BLOCK)
    return out


# The op as a compiled graph has it (CLIP's ``x * sigmoid(1.702 * x)``), which the compiler
# leaves to inductor's fused code unless asked for the operator.


def _written(x):
    return x * torch.sigmoid(1.702 * x)


def _example_inputs(dtype, grad):
    return [torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad)]


COMPILER_OP = CompilerOp(
    "quick_gelu", "x", _written, patterns=(Pattern("quick_gelu", _written, _example_inputs),),
    kernel=quick_gelu_op, cost=left_to_inductor,
)


if triton_available():

    @triton.jit
    def _quick_gelu_forward_kernel(X, Y, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + offs, mask=mask).to(tl.float32)
        y = x * tl.sigmoid(alpha * x)
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _quick_gelu_backward_kernel(X, DY, DX, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + offs, mask=mask).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask).to(tl.float32)
        s = tl.sigmoid(alpha * x)
        # d/dx [x * s(a x)] = s + a x s (1 - s)
        dx = dy * (s + alpha * x * s * (1.0 - s))
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
