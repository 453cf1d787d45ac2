"""Fused bias + dropout + residual add: ``residual + dropout(x + bias, p)``.

One operator, ``accrewrite::bias_dropout_add`` (``bias_dropout_add_op``), that eager code, the
nn functions and compiled graphs all call, with its backward
``accrewrite::bias_dropout_add_backward``. It takes the mask's seed as a one-element integer
tensor on ``x``'s device. Triton path: the keep mask is never stored. Each element's uniform
number comes from Philox, ``tl.rand(seed, index)``; the kernels read the seed on the device, so
a fresh mask per call costs no host sync, and the backward regenerates the same numbers from the
saved seed. An element is kept when its number is >= p and then scaled by 1 / (1 - p), as
``torch.nn.functional.dropout`` does. Eager calls draw the seed with ``torch.randint`` on the
device (``torch.manual_seed`` makes runs repeatable), compiled graphs inside the graph at every
call.

Reference path: ``torch.nn.functional.dropout``, which draws from torch's own generator, so the
two paths drop different elements (the same distribution). ``bias_dropout_add_reference`` also
takes an explicit ``mask``, which the tests use to check the Triton path against the reference
with the very mask the kernel drew.

An explicit ``seed`` fixes the mask on both paths (each its own mask): the Triton path's Philox
stream, and on the reference path a ``torch.Generator`` seeded with it (the same in the operator,
where compiled graphs run it, with a backward of the same mask).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from accrewrite.kernels.compiler_op import CompilerOp, Pattern, left_to_inductor
from accrewrite.kernels.dispatch import KERNEL_DTYPES, triton_available, use_triton

if triton_available():
    import triton
    import triton.language as tl

_BLOCK = 1024


def bias_dropout_add(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    p: float,
    training: bool = True,
    *,
    seed: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + dropout(x + bias, p, training)``; ``bias`` (over the last dim) may be None.

    ``seed`` (an int, or a one-element integer tensor on ``x``'s device) fixes the dropout mask.
    Without it the Triton path draws one and the reference path is torch's dropout.
    """
    _check(x, bias, residual, p)
    if training and p > 0 and _kernel_takes(x, bias, residual):
        if seed is None:
            seed = torch.randint(2**31 - 1, (), device=x.device)
        elif not isinstance(seed, torch.Tensor):
            seed = torch.tensor(int(seed), device=x.device)
        return bias_dropout_add_op(x, bias, residual, float(p), seed)
    mask = _seeded_mask(x, p, seed) if training and seed is not None else None
    return bias_dropout_add_reference(x, bias, residual, p, training, mask)


def bias_dropout_add_reference(x, bias, residual, p, training=True, mask=None) -> torch.Tensor:
    """The PyTorch reference. With ``mask`` (boolean, ``x``'s shape: True = keep) it applies that
    mask instead of drawing one, with the same 1 / (1 - p) scaling."""
    h = x if bias is None else x + bias
    if mask is None:
        return residual + F.dropout(h, p, training)
    return residual + h * mask * _keep_scale(p)


def _seeded_mask(x, p, seed) -> torch.Tensor:
    """The reference path's keep mask for ``seed``: as in the kernel, an element is kept when its
    uniform number is >= p; the numbers come from a generator on ``x``'s device."""
    generator = torch.Generator(x.device).manual_seed(int(seed))
    return torch.rand(x.shape, generator=generator, device=x.device) >= p


def _keep_scale(p: float) -> float:
    """What a kept element is multiplied by (p = 1 keeps nothing)."""
    return 1.0 / (1.0 - p) if p < 1 else 0.0


def _check(x, bias, residual, p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"bias_dropout_add: dropout probability must be in [0, 1], got {p}")
    if residual.shape != x.shape:
        raise ValueError(
            f"bias_dropout_add: residual has shape {tuple(residual.shape)}, x has {tuple(x.shape)}"
        )
    if bias is not None and (x.dim() == 0 or tuple(bias.shape) != tuple(x.shape[-1:])):
        raise ValueError(
            f"bias_dropout_add: bias must have shape (x.shape[-1],) = {tuple(x.shape[-1:])}, "
            f"got {tuple(bias.shape)}"
        )


def _kernel_takes(*tensors) -> bool:
    tensors = [t for t in tensors if t is not None]
    return all(t.dtype in KERNEL_DTYPES for t in tensors) and use_triton(*tensors)


def _out_dtype(*tensors) -> torch.dtype:
    return functools.reduce(torch.promote_types, [t.dtype for t in tensors if t is not None])


@torch.library.custom_op("accrewrite::bias_dropout_add", mutates_args=())
def bias_dropout_add_op(
    x: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: torch.Tensor,
    p: float,
    seed: torch.Tensor,
) -> torch.Tensor:
    if _kernel_takes(x, bias, residual):
        x = x.contiguous()
        out = torch.empty_like(x, dtype=_out_dtype(x, bias, residual))
        n = x.numel()
        if n:
            _forward_kernel[(triton.cdiv(n, _BLOCK),)](
                x, bias, residual.contiguous(), out, n, x.shape[-1] if x.dim() else 1, p,
                _keep_scale(p), seed, HAS_BIAS=bias is not None, BLOCK=_BLOCK,
            )
        return out
    return bias_dropout_add_reference(x, bias, residual, p, mask=_seeded_mask(x, p, seed))


@bias_dropout_add_op.register_fake
def _(x, bias, residual, p, seed):
    return torch.empty_like(x, dtype=_out_dtype(x, bias, residual))


@torch.library.custom_op("accrewrite::bias_dropout_add_backward", mutates_args=())
def bias_dropout_add_backward_op(
    dout: torch.Tensor, p: float, seed: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The gradient of ``x`` (of ``dtype``): ``dout`` where the forward kept an element, scaled,
    else 0."""
    if _kernel_takes(dout) and dtype in KERNEL_DTYPES:
        dout = dout.contiguous()
        dx = torch.empty_like(dout, dtype=dtype)
        n = dout.numel()
        if n:
            _backward_kernel[(triton.cdiv(n, _BLOCK),)](
                dout, dx, n, p, _keep_scale(p), seed, BLOCK=_BLOCK,
            )
        return dx
    return (dout * _seeded_mask(dout, p, seed) * _keep_scale(p)).to(dtype)


@bias_dropout_add_backward_op.register_fake
def _(dout, p, seed, dtype):
    return torch.empty_like(dout, dtype=dtype)


def _setup_context(ctx, inputs, output):
    x, bias, residual, ctx.p, seed = inputs
    ctx.dtypes = x.dtype, None if bias is None else bias.dtype, residual.dtype
    ctx.save_for_backward(seed)


def _grads(ctx, dout):
    (seed,) = ctx.saved_tensors
    x_dtype, bias_dtype, residual_dtype = ctx.dtypes
    dx = bias_dropout_add_backward_op(dout, ctx.p, seed, x_dtype)
    dbias = None
    if bias_dtype is not None:
        dbias = dx.reshape(-1, dx.shape[-1]).sum(0, dtype=torch.float32).to(bias_dtype)
    # The residual's gradient is the incoming one, passed on here rather than by the op (whose
    # outputs may not alias its inputs: it would have to copy it).
    return dx, dbias, dout.to(residual_dtype), None, None


bias_dropout_add_op.register_autograd(_grads, setup_context=_setup_context)


# The op as a compiled graph has it: ``residual + dropout(x + bias, p)``, with a bias and without
# (a Linear's bias is inside its matmul: most models write residual + dropout(proj(h))), and with
# the residual on either side of the sum (the matcher does not take the sum as commutative);
# with its bias first, so that a match is the longest one. The residual is traced without a
# gradient: its gradient is the incoming one, which the pattern then need not contain, so it
# matches either way. Inductor draws its dropout mask inside its fused kernel as well, so the
# cost rule leaves it to inductor, as for a pointwise kernel.


def _written(x, residual, p, bias=None):
    return residual + F.dropout(x if bias is None else x + bias, p, training=True)


def _dropout_add_search(residual_first: bool):
    def search(x, residual, p):
        dropped = F.dropout(x, p, training=True)
        return residual + dropped if residual_first else dropped + residual

    return search


def _bias_dropout_add_search(residual_first: bool):
    dropout_add = _dropout_add_search(residual_first)

    def search(x, bias, residual, p):
        return dropout_add(x + bias, residual, p)

    return search


def _dropout_add_inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(2, 3, 8, dtype=dtype),
    ]


def _bias_dropout_add_inputs(dtype, grad):
    x, residual = _dropout_add_inputs(dtype, grad)
    return [x, torch.empty(8, dtype=dtype, requires_grad=grad), residual]


def _compiled_unsupported(args):
    x, bias, residual = args["x"], args.get("bias"), args["residual"]
    if residual.shape != x.shape:
        return f"residual {list(residual.shape)} is broadcast to x {list(x.shape)}"
    if bias is not None and bias.shape != x.shape[-1:]:
        return f"bias {list(bias.shape)} is not over x's last dimension only"
    return None


def _compiled(x, residual, p, bias=None):
    # The graph draws the seed at every call, on x's device (no host sync); the op's backward
    # draws the same mask again from it.
    seed = torch.randint(2**31 - 1, (), device=x.device)
    return bias_dropout_add_op(x, bias, residual, p, seed)


COMPILER_OP = CompilerOp(
    "bias_dropout_add", "x", _written,
    patterns=tuple(
        Pattern("bias_dropout_add", search(residual_first), inputs, scalars={"p": 0.113377})
        for search, inputs in (
            (_bias_dropout_add_search, _bias_dropout_add_inputs),
            (_dropout_add_search, _dropout_add_inputs),
        )
        for residual_first in (True, False)
    ),
    kernel=_compiled, cost=left_to_inductor, unsupported=_compiled_unsupported,
    default="inductor's code, the mask drawn inside its fused kernel",
)


if triton_available():

    @triton.jit
    def _forward_kernel(X, Bias, Residual, Out, n, n_cols, p, scale, seed,
                        HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        h = tl.load(X + offs, mask=mask).to(tl.float32)
        if HAS_BIAS:
            h += tl.load(Bias + offs % n_cols, mask=mask).to(tl.float32)
        keep = tl.rand(tl.load(seed), offs) >= p
        out = tl.load(Residual + offs, mask=mask).to(tl.float32) + tl.where(keep, h * scale, 0.0)
        tl.store(Out + offs, out.to(Out.dtype.element_ty), mask=mask)

    @triton.jit
    def _backward_kernel(DOut, DX, n, p, scale, seed, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dout = tl.load(DOut + offs, mask=mask).to(tl.float32)
        keep = tl.rand(tl.load(seed), offs) >= p  # the forward's mask, drawn again
        tl.store(DX + offs, tl.where(keep, dout * scale, 0.0).to(DX.dtype.element_ty), mask=mask)
