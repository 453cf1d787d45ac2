"""Layer normalization over the trailing dimensions: Triton forward and backward, and the reference.

``layer_norm(x, normalized_shape, weight, bias, eps)`` has ``torch.nn.functional.layer_norm``'s
signature and semantics, with one deliberate difference in dtypes (as apex's FusedLayerNorm): the
statistics are computed in float32 and the output has ``x``'s dtype whatever the weight's dtype,
so a bfloat16 activation with float32 parameters gives a bfloat16 output.

One operator, ``accrewrite::layer_norm`` (``layer_norm_op``), that eager code, the nn module and
compiled graphs all call; it returns the row statistics beside the output, which its backward
(``accrewrite::layer_norm_backward``) takes. Triton path: the forward normalizes one row per
program and keeps the row's mean and 1/std (float32, one value per row) for the backward. The
backward gives each program a band of rows: it writes their input gradients and accumulates its
band's weight and bias gradients in float32 registers, which are then summed over the programs
(the layout of Liger-Kernel's layer norm). Rows wider than ``MAX_FUSED_SIZE`` bytes do not fit
one program's registers and take the reference, as does float64 (the kernel computes in float32):
eager calls run ``layer_norm_reference``, compiled graphs the operator, which then computes the
same with ``F.layer_norm``'s own backward.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from accrewrite.base import accelerator
from accrewrite.kernels.compiler_op import CompilerOp, Cost, Pattern, never
from accrewrite.kernels.dispatch import KERNEL_DTYPES, triton_available, use_triton

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
    if not (_fits(x, math.prod(normalized_shape)) and _triton(x, weight, bias)):
        return layer_norm_reference(x, normalized_shape, weight, bias, eps)
    return layer_norm_op(x, normalized_shape, weight, bias, eps)[0]


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


def _fits(x, n: int) -> bool:
    return 0 < n * x.element_size() <= MAX_FUSED_SIZE


def _triton(x, weight, bias) -> bool:
    params = [t for t in (weight, bias) if t is not None]
    return all(t.dtype in KERNEL_DTYPES for t in (x, *params)) and use_triton(x, *params)


def _wide(dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _stats_shape(x, normalized_shape):
    return x.shape[: x.dim() - len(normalized_shape)]


@torch.library.custom_op("accrewrite::layer_norm", mutates_args=())
def layer_norm_op(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the output, each row's mean, each row's 1 / std), the statistics in float32 (float64 for
    float64 input) with the shape of ``x``'s leading dims."""
    n = math.prod(normalized_shape)
    stats = _stats_shape(x, normalized_shape)
    if _fits(x, n) and _triton(x, weight, bias):
        y, mean, rstd = _forward(x, weight, bias, n, eps)
        return y, mean.view(stats), rstd.view(stats)
    wide = _wide(x.dtype)
    y, mean, rstd = torch.native_layer_norm(
        x.to(wide), normalized_shape, _to(weight, wide), _to(bias, wide), eps
    )
    return y.to(x.dtype), mean.view(stats), rstd.view(stats)


@layer_norm_op.register_fake
def _(x, normalized_shape, weight, bias, eps):
    stats = _stats_shape(x, normalized_shape)
    wide = _wide(x.dtype)
    return torch.empty_like(x), x.new_empty(stats, dtype=wide), x.new_empty(stats, dtype=wide)


@torch.library.custom_op("accrewrite::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> list[torch.Tensor]:
    """The gradients of ``x`` and of those of ``weight`` and ``bias`` that are given (``bias``
    is there for its shape and dtype)."""
    n = math.prod(normalized_shape)
    if _fits(x, n) and _triton(x, weight, bias):
        return _present(*_backward(dy, x, weight, bias, mean, rstd, n))
    wide = _wide(x.dtype)
    stats = (*mean.shape, *(1 for _ in normalized_shape))
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        dy.to(wide), x.to(wide), normalized_shape, mean.view(stats), rstd.view(stats),
        _to(weight, wide), _to(bias, wide), [True, weight is not None, bias is not None],
    )
    return _present(dx.to(x.dtype), _like(dw, weight), _like(db, bias))


@layer_norm_backward_op.register_fake
def _(dy, x, normalized_shape, weight, bias, mean, rstd):
    return [torch.empty_like(t) for t in (x, weight, bias) if t is not None]


def _setup_context(ctx, inputs, output):
    x, ctx.normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)


def _grads(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    grads = iter(layer_norm_backward_op(dy, x, ctx.normalized_shape, weight, bias, mean, rstd))
    dx = next(grads)
    return dx, None, *(None if t is None else next(grads) for t in (weight, bias)), None


layer_norm_op.register_autograd(_grads, setup_context=_setup_context)


def _to(t, dtype):
    return None if t is None else t.to(dtype)


def _like(grad, param):
    return None if param is None else grad.to(param.dtype)


def _present(*grads) -> list[torch.Tensor]:
    return [g for g in grads if g is not None]


def _forward(x, weight, bias, n, eps):
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
    return y.view(x.shape), mean, rstd


def _backward(dy, x, weight, bias, mean, rstd, n):
    x2d = x.reshape(-1, n)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    rows = x2d.shape[0]
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
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            BLOCK_N=block, num_warps=num_warps,
        )
    dw = None if weight is None else dw_partial.sum(0).to(weight.dtype).view(weight.shape)
    db = None if bias is None else db_partial.sum(0).to(bias.dtype).view(bias.shape)
    return dx.view(x.shape), dw, db


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


# The op as a compiled graph has it (``F.layer_norm`` over the last dimension, with a weight and
# a bias), which the compiler replaces by the operator where the cost rule says so.


def _written(x, weight, bias, eps):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _example_inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
    ]


_MIN_HIDDEN = 4096


def _cost(args) -> Cost:
    hidden = args["x"].shape[-1]
    if hidden >= _MIN_HIDDEN:
        return Cost(0.9, f"hidden size {hidden} >= {_MIN_HIDDEN}")
    return never(f"hidden size {hidden} < {_MIN_HIDDEN}")


def _compiled(x, weight, bias, eps):
    return layer_norm_op(x, list(x.shape[-1:]), weight, bias, eps)[0]


COMPILER_OP = CompilerOp(
    "layer_norm", "x", _written,
    patterns=(Pattern("layer_norm", _written, _example_inputs, scalars={"eps": 1e-5}),),
    kernel=_compiled, cost=_cost,
)


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
