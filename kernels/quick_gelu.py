"""QuickGELU, ``x * sigmoid(1.702 * x)`` (the GELU approximation of CLIP and OpenAI's GPT-2 code).

Triton path: one elementwise kernel forward, one backward that recomputes the sigmoid from the
saved input instead of storing it. Both compute in float32 and store in the input's dtype.
"""

from __future__ import annotations

import torch

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
    if x.dtype in KERNEL_DTYPES and use_triton(x):
        return _QuickGeluFunction.apply(x)
    return quick_gelu_reference(x)


def quick_gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """The PyTorch reference, computed in float32 (or float64) and returned in ``x``'s dtype."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.sigmoid(ALPHA * wide)).to(x.dtype)


class _QuickGeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        if n:
            _quick_gelu_forward_kernel[(triton.cdiv(n, _BLOCK),)](x, y, n, ALPHA, BLOCK=_BLOCK)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        n = x.numel()
        if n:
            grid = (triton.cdiv(n, _BLOCK),)
            _quick_gelu_backward_kernel[grid](x, dy, dx, n, ALPHA, BLOCK=_BLOCK)
        return dx


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
