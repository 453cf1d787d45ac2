"""Layer normalization over the trailing dimensions: Triton forward and backward, and the reference.

``layer_norm(x, normalized_shape, weight, bias, eps)`` has ``torch.nn.functional.layer_norm``'s
signature and semantics, with one deliberate difference in dtypes (as apex's FusedLayerNorm): the
statistics are computed in float32 and the output has ``x``'s dtype whatever the weight's dtype,
so a bfloat16 activation with float32 parameters gives a bfloat16 output.

Triton path: the forward normalizes one row per program and keeps the row's mean and 1/std
(float32, one value per row) for the backward. The backward gives each program a band of rows:
it writes their input gradients and accumulates its band's weight and bias gradients in float32
registers, which are then summed over the programs (the layout of Liger-Kernel's layer norm).
Rows wider than ``MAX_FUSED_SIZE`` bytes do not fit one program's registers and take the
reference, as does float64 (the kernel computes in float32).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from accrewrite.kernels.dispatch import KERNEL_DTYPES, triton_available, use_triton
from accrewrite.runtime import accelerator

if triton_available():
    import triton
    import triton.language as tl

MAX_FUSED_SIZE = 65536  # bytes of one row, as in Triton's layer-norm tutorial


def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Normalize ``x`` over its trailing ``normalized_shape`` dims, then scale and shift."""
    normalized_shape = _check_shapes(x, normalized_shape, weight, bias)
    n = math.prod(normalized_shape)
    params = [t for t in (weight, bias) if t is not None]
    fits = 0 < n * x.element_size() <= MAX_FUSED_SIZE
    if fits and all(t.dtype in KERNEL_DTYPES for t in (x, *params)) and use_triton(x, *params):
        return _LayerNormFunction.apply(x, weight, bias, n, eps)
    return layer_norm_reference(x, normalized_shape, weight, bias, eps)


def layer_norm_reference(x, normalized_shape, weight=None, bias=None, eps=1e-5) -> torch.Tensor:
    """``F.layer_norm`` computed in float32 (float64 for float64 input), returned in ``x``'s
    dtype."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    out = F.layer_norm(
        x.to(dtype),
        _as_shape(normalized_shape),
        None if weight is None else weight.to(dtype),
        None if bias is None else bias.to(dtype),
        eps,
    )
    return out.to(x.dtype)


def _as_shape(normalized_shape) -> tuple[int, ...]:
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _check_shapes(x, normalized_shape, weight, bias) -> tuple[int, ...]:
    shape = _as_shape(normalized_shape)
    if not shape or tuple(x.shape[-len(shape):]) != shape or x.dim() < len(shape):
        raise ValueError(
            f"layer_norm: normalized_shape {shape} must be the trailing dims of the input, "
            f"whose shape is {tuple(x.shape)}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(
                f"layer_norm: {name} has shape {tuple(t.shape)}, expected normalized_shape {shape}"
            )
    return shape


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, n, eps):
        x2d = x.reshape(-1, n)
        if x2d.stride(-1) != 1:
            x2d = x2d.contiguous()
        rows = x2d.shape[0]
        y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block, num_warps = _block_settings(n)
        if rows:
            _layer_norm_forward_kernel[(rows,)](
                x2d, y, weight, bias, mean, rstd, x2d.stride(0), n, eps,
                HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                BLOCK_N=block, num_warps=num_warps,
            )
        ctx.save_for_backward(x2d, weight, mean, rstd)
        ctx.x_shape = x.shape
        ctx.bias_like = None if bias is None else (bias.shape, bias.dtype)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, weight, mean, rstd = ctx.saved_tensors
        rows, n = x2d.shape
        dy2d = dy.reshape(rows, n)
        if dy2d.stride(-1) != 1:
            dy2d = dy2d.contiguous()
        programs = _backward_programs(x2d.device, rows)
        dx = torch.empty_like(x2d)
        # float32 partial sums, one row per program, reduced below
        dw_partial = torch.zeros((programs, n), dtype=torch.float32, device=x2d.device)
        db_partial = torch.zeros((programs, n), dtype=torch.float32, device=x2d.device)
        block, num_warps = _block_settings(n, backward=True)
        if rows:
            _layer_norm_backward_kernel[(programs,)](
                x2d, weight, mean, rstd, dy2d, dx, dw_partial, db_partial,
                x2d.stride(0), dy2d.stride(0), rows, n, triton.cdiv(rows, programs),
                HAS_WEIGHT=weight is not None, HAS_BIAS=ctx.bias_like is not None,
                BLOCK_N=block, num_warps=num_warps,
            )
        dw = None if weight is None else dw_partial.sum(0).to(weight.dtype).view(weight.shape)
        db = None
        if ctx.bias_like is not None:
            shape, dtype = ctx.bias_like
            db = db_partial.sum(0).to(dtype).view(shape)
        return dx.view(ctx.x_shape), dw, db, None, None


def _block_settings(n: int, backward: bool = False) -> tuple[int, int]:
    """The power-of-two block that holds a row, and the warps to spread it over.

    The backward keeps about five float32 values per element live (x, dy, weight and the two
    gradient accumulators), so it spreads a row over more warps, 8 elements per thread: its
    sm_90 build needs 185 registers per thread at block 4096 with 8 warps, 103 with 16.
    """
    block = triton.next_power_of_2(n)
    if backward:
        return block, min(32, max(4, block // 256))
    return block, 4 if block < 2048 else 8 if block < 8192 else 16 if block < 32768 else 32


def _backward_programs(device: torch.device, rows: int) -> int:
    # One band of rows per SM keeps the float32 partial sums small; on the CPU (the interpreter)
    # a few bands still exercise the band logic and the final reduction.
    slots = 4
    if accelerator.supports_triton(device):
        slots = accelerator.multiprocessor_count(device)
    return max(1, min(rows, slots))


if triton_available():

    @triton.jit
    def _layer_norm_forward_kernel(
        X, Y, W, B, Mean, Rstd, stride_row, N, eps,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(X + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / N + eps)
        y = centered * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=mask).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=mask).to(tl.float32)
        tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(Mean + row, mean)
        tl.store(Rstd + row, rstd)

    @triton.jit
    def _layer_norm_backward_kernel(
        X, W, Mean, Rstd, DY, DX, DW, DB, stride_x, stride_dy, M, N, rows_per_program,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
        db = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        row_start = pid * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, M)
        for row in range(row_start, row_end):
            row64 = tl.cast(row, tl.int64)
            x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(Rstd + row64)
            x_hat = tl.where(mask, (x - tl.load(Mean + row64)) * rstd, 0.0)
            w_dy = dy
            if HAS_WEIGHT:
                w_dy = dy * w
            # dx = rstd * (w_dy - mean(w_dy) - x_hat * mean(w_dy * x_hat))
            c1 = tl.sum(x_hat * w_dy, axis=0) / N
            c2 = tl.sum(w_dy, axis=0) / N
            dx = (w_dy - (x_hat * c1 + c2)) * rstd
            tl.store(DX + row64 * N + cols, dx.to(DX.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                dw += dy * x_hat
            if HAS_BIAS:
                db += dy
        if HAS_WEIGHT:
            tl.store(DW + pid * N + cols, dw, mask=mask)
        if HAS_BIAS:
            tl.store(DB + pid * N + cols, db, mask=mask)
