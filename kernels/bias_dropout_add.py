"""Fused bias + dropout + residual add: ``residual + dropout(x + bias, p)``.

Triton path: the keep mask is never stored. Each element's uniform number comes from Philox,
``tl.rand(seed, index)``, with one seed drawn per call from torch's CPU generator (so
``torch.manual_seed`` makes runs repeatable, and drawing it needs no device sync); the backward
regenerates the same numbers from the saved seed. An element is kept when its number is >= p and
then scaled by 1 / (1 - p), as ``torch.nn.functional.dropout`` does.

Reference path: ``torch.nn.functional.dropout``, which draws from torch's own generator, so the
two paths drop different elements (the same distribution). ``bias_dropout_add_reference`` also
takes an explicit ``mask``, which the tests use to check the Triton path against the reference
with the very mask the kernel drew.

An explicit ``seed`` fixes the mask on both paths (each its own mask): the Triton path's Philox
stream, and on the reference path a ``torch.Generator`` seeded with it. Compiled graphs
(``accrewrite.runtime.compiler``) pass a one-element integer tensor that the graph draws on the
device at every call and the backward recomputes from: the kernels read it there, so a fresh
mask per call costs no host sync.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

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
    seed: int | None = None,
) -> torch.Tensor:
    """``residual + dropout(x + bias, p, training)``; ``bias`` (over the last dim) may be None.

    ``seed`` (an int, or a one-element integer tensor on ``x``'s device) fixes the dropout mask.
    Without it the Triton path draws one from torch's CPU generator and the reference path is
    torch's dropout.
    """
    _check(x, bias, residual, p)
    tensors = [t for t in (x, bias, residual) if t is not None]
    kernel_dtypes = all(t.dtype in KERNEL_DTYPES for t in tensors)
    if training and p > 0 and kernel_dtypes and use_triton(*tensors):
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())  # a CPU tensor: no device sync
        return _BiasDropoutAddFunction.apply(x, bias, residual, float(p), seed)
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


class _BiasDropoutAddFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, p, seed):
        x = x.contiguous()
        residual = residual.contiguous()
        dtypes = [t.dtype for t in (x, bias, residual) if t is not None]
        out = torch.empty_like(x, dtype=functools.reduce(torch.promote_types, dtypes))
        n = x.numel()
        scale = _keep_scale(p)
        if n:
            _forward_kernel[(triton.cdiv(n, _BLOCK),)](
                x, bias, residual, out, n, x.shape[-1] if x.dim() else 1, p, scale, seed,
                HAS_BIAS=bias is not None, BLOCK=_BLOCK,
            )
        ctx.p, ctx.scale, ctx.seed = p, scale, seed
        ctx.x_dtype = x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.residual_dtype = residual.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        dout = dout.contiguous()
        dx = torch.empty_like(dout, dtype=ctx.x_dtype)
        n = dout.numel()
        if n:
            _backward_kernel[(triton.cdiv(n, _BLOCK),)](
                dout, dx, n, ctx.p, ctx.scale, ctx.seed, BLOCK=_BLOCK,
            )
        dbias = None
        if ctx.bias_dtype is not None:
            dbias = dx.reshape(-1, dx.shape[-1]).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dbias, dout.to(ctx.residual_dtype), None, None


if triton_available():

    @triton.jit
    def _seed_value(seed):
        if seed.dtype.is_ptr():  # a seed tensor, read on the device (see the module docstring)
            seed = tl.load(seed)
        return seed

    @triton.jit
    def _forward_kernel(X, Bias, Residual, Out, n, n_cols, p, scale, seed,
                        HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        h = tl.load(X + offs, mask=mask).to(tl.float32)
        if HAS_BIAS:
            h += tl.load(Bias + offs % n_cols, mask=mask).to(tl.float32)
        keep = tl.rand(_seed_value(seed), offs) >= p
        out = tl.load(Residual + offs, mask=mask).to(tl.float32) + tl.where(keep, h * scale, 0.0)
        tl.store(Out + offs, out.to(Out.dtype.element_ty), mask=mask)

    @triton.jit
    def _backward_kernel(DOut, DX, n, p, scale, seed, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dout = tl.load(DOut + offs, mask=mask).to(tl.float32)
        keep = tl.rand(_seed_value(seed), offs) >= p  # the forward's mask, drawn again
        tl.store(DX + offs, tl.where(keep, dout * scale, 0.0).to(DX.dtype.element_ty), mask=mask)
