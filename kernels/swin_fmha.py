"""Swin Transformer's windowed attention scores: ``softmax(attn + relative_position_bias + mask)``
fused into one pass (TorchAcc's migration guide, "FusedSwinFmha").

``attn`` is ``q @ k.transpose(-2, -1)`` with ``q`` already scaled, shape ``(B * nW, nH, N, N)``
(B images, nW windows per image, nH heads, N = window_size ** 2 tokens per window);
``relative_pos_bias`` is ``(nH, N, N)`` (or ``(1, nH, N, N)``) and is broadcast over windows;
``attn_mask`` is ``(nW, N, N)`` (shifted windows) or None, broadcast over images and heads.
All are floating point; the computation is in fp32 (fp64 for fp64 ``attn``).

Eager Swin makes three full-size passes (two broadcast adds, then softmax) and keeps the sums;
here each row is loaded once, summed in fp32, normalised and stored once. Numerics: sums and
softmax in fp32, the probabilities returned in ``attn``'s dtype (eager promotes a bf16 ``attn``
plus an fp32 bias to fp32; returning bf16 is what halves the memory traffic).

One operator, ``accrewrite::swin_fmha`` (``swin_fmha_op``), that eager code, the nn module and
compiled graphs all call; it returns each row's log-sum-exp beside the probabilities, which its
backward (``accrewrite::swin_fmha_backward``) takes. Backward does not keep the probabilities:
it keeps ``attn`` and one fp32 log-sum-exp per row and recomputes them in fp32, so gradients are
as precise as the fp32 reference's. The gradient of the bias, a sum over all B * nW windows, is
accumulated in fp32 inside the kernel. Where the Triton kernel does not run
(``dispatch.use_triton``) the operator computes the same in PyTorch, for compiled graphs; eager
calls there run the reference directly.
"""

import functools
from typing import Optional

import torch

from accrewrite.kernels.compiler_op import CompilerOp, Cost, Pattern, never
from accrewrite.kernels.dispatch import triton_available, use_triton

if triton_available():  # without triton only the reference path exists
    import triton
    import triton.language as tl

__all__ = ["swin_fmha", "swin_fmha_reference"]

# Programs per launch worth splitting the windows for (a few per SM of a large GPU).
_TARGET_PROGRAMS = 1024


def swin_fmha_reference(attn, relative_pos_bias, attn_mask=None):
    """Eager Swin (``WindowAttention.forward``) in fp32 (fp64 for fp64 ``attn``), returned in
    ``attn.dtype``."""
    _check(attn, relative_pos_bias, attn_mask)
    return torch.softmax(_scores(attn, relative_pos_bias, attn_mask), dim=-1).to(attn.dtype)


def swin_fmha(attn, relative_pos_bias, attn_mask=None):
    """``softmax(attn + relative_pos_bias + attn_mask)`` over the last dimension: the Triton
    kernel when ``use_triton`` says so for the inputs, else the same in PyTorch."""
    _check(attn, relative_pos_bias, attn_mask)
    if not _kernel_takes(attn, relative_pos_bias, attn_mask):
        return swin_fmha_reference(attn, relative_pos_bias, attn_mask)
    return swin_fmha_op(attn, relative_pos_bias, attn_mask)[0]


def _compute_dtype(dtype):
    """fp32 for fp16/bf16/fp32, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def _check(attn, bias, mask):
    for name, t in (("attn", attn), ("relative_pos_bias", bias), ("attn_mask", mask)):
        if t is not None and not t.is_floating_point():
            raise TypeError(f"swin_fmha: {name} must be floating point, got {t.dtype}")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"swin_fmha: attn must be (B * nW, nH, N, N), got {tuple(attn.shape)}")
    windows, heads, n, _ = attn.shape
    if bias.numel() != heads * n * n:
        raise ValueError(
            f"swin_fmha: relative_pos_bias of shape {tuple(bias.shape)} is not "
            f"(nH, N, N) = {(heads, n, n)}"
        )
    if mask is not None:
        nw = mask.numel() // (n * n) if n else 0
        if nw == 0 or mask.numel() != nw * n * n or windows % nw:
            raise ValueError(
                f"swin_fmha: attn_mask of shape {tuple(mask.shape)} is not (nW, N, N) with nW "
                f"dividing the {windows} windows of attn (N = {n})"
            )
    return windows, heads, n


def _kernel_takes(attn, bias, mask) -> bool:
    return attn.numel() > 0 and use_triton(*(t for t in (attn, bias, mask) if t is not None))


def _scores(attn, bias, mask):
    """``attn + bias + mask`` in the compute dtype."""
    windows, heads, n, _ = attn.shape
    wide = _compute_dtype(attn.dtype)
    x = attn.to(wide) + bias.to(wide).view(1, heads, n, n)
    if mask is not None:
        nw = mask.numel() // (n * n)
        x = x.view(-1, nw, heads, n, n) + mask.to(wide).view(1, nw, 1, n, n)
        x = x.view(windows, heads, n, n)
    return x


@torch.library.custom_op("accrewrite::swin_fmha", mutates_args=())
def swin_fmha_op(
    attn: torch.Tensor, relative_pos_bias: torch.Tensor, attn_mask: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the probabilities in ``attn``'s dtype, each row's log-sum-exp in the compute dtype)."""
    if _kernel_takes(attn, relative_pos_bias, attn_mask):
        attn = attn.contiguous()
        mask = attn_mask.contiguous() if attn_mask is not None else None
        probs = torch.empty_like(attn)
        lse = attn.new_empty(attn.shape[:-1], dtype=_compute_dtype(attn.dtype))
        _launch(attn, relative_pos_bias.contiguous(), mask, probs, lse)
        return probs, lse
    x = _scores(attn, relative_pos_bias, attn_mask)
    return torch.softmax(x, dim=-1).to(attn.dtype), torch.logsumexp(x, dim=-1)


@swin_fmha_op.register_fake
def _(attn, relative_pos_bias, attn_mask):
    return torch.empty_like(attn), attn.new_empty(attn.shape[:-1], dtype=_compute_dtype(attn.dtype))


@torch.library.custom_op("accrewrite::swin_fmha_backward", mutates_args=())
def swin_fmha_backward_op(
    grad_probs: torch.Tensor,
    attn: torch.Tensor,
    relative_pos_bias: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``attn`` and of ``relative_pos_bias`` (summed over the windows)."""
    bias = relative_pos_bias
    if _kernel_takes(attn, bias, attn_mask):
        attn = attn.contiguous()
        mask = attn_mask.contiguous() if attn_mask is not None else None
        grad_attn = torch.empty_like(attn)
        partial_bias = _launch(attn, bias.contiguous(), mask, grad_attn, lse,
                               grad_probs.contiguous())
        return grad_attn, partial_bias.sum(0).to(bias.dtype).view(bias.shape)
    probs = torch.exp(_scores(attn, bias, attn_mask) - lse.unsqueeze(-1))
    dp = grad_probs.to(lse.dtype)
    ds = probs * (dp - (probs * dp).sum(-1, keepdim=True))
    return ds.to(attn.dtype), ds.sum(0).to(bias.dtype).view(bias.shape)


@swin_fmha_backward_op.register_fake
def _(grad_probs, attn, relative_pos_bias, attn_mask, lse):
    return torch.empty_like(attn), torch.empty_like(relative_pos_bias)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])


def _grads(ctx, grad_probs, _grad_lse):
    attn, bias, mask, lse = ctx.saved_tensors
    grad_attn, grad_bias = swin_fmha_backward_op(grad_probs, attn, bias, mask, lse)
    grad_mask = None
    if ctx.needs_input_grad[2]:
        heads, n = attn.shape[1], attn.shape[-1]
        nw = mask.numel() // (n * n)
        grad_mask = grad_attn.to(lse.dtype).view(-1, nw, heads, n, n).sum((0, 2))
        grad_mask = grad_mask.to(mask.dtype).view(mask.shape)
    return grad_attn, grad_bias, grad_mask


swin_fmha_op.register_autograd(_grads, setup_context=_setup_context)


def _launch(attn, bias, mask, out, lse, grad_probs=None):
    """Forward (no ``grad_probs``): ``out`` = probabilities, ``lse`` filled. Backward: ``out``
    = grad of attn; returns the per-split partial sums of the bias gradient (in lse's dtype)."""
    windows, heads, n, _ = attn.shape
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(4096 // block_n, triton.next_power_of_2(windows)))
    # Programs own one (head, query row) of the bias, so its gradient sums in registers; the
    # windows are split over a second grid axis so that small heads * N still fill the GPU.
    splits = max(1, min(triton.cdiv(windows, block_m), _TARGET_PROGRAMS // (heads * n)))
    backward = grad_probs is not None
    partial = (
        torch.empty((splits, heads, n, n), dtype=lse.dtype, device=attn.device)
        if backward else None
    )
    nw = mask.numel() // (n * n) if mask is not None else 1
    _swin_fmha_kernel[(heads * n, splits)](
        attn, bias, mask if mask is not None else attn, out, lse,
        grad_probs if backward else attn, partial if backward else lse,
        windows, heads, n, nw,
        HAS_MASK=mask is not None, BACKWARD=backward, BLOCK_M=block_m, BLOCK_N=block_n,
        WIDE_FP64=lse.dtype == torch.float64,
    )
    return partial


# The op as a compiled graph has it: Swin's WindowAttention from the relative position bias to
# the softmax, without and with the shifted windows' mask. Swin's own code (and torchvision)
# writes the image count of the first view as B_ // nW, timm as -1, and either count and the
# number of windows per image may be symbolic: the masked form matches any sizes of its views and
# checks their shapes.
#
# The kernel holds each row of N scores in registers and sums the relative position bias's
# gradient over the windows inside its backward, where inductor runs a reduction of its own over
# the whole gradient: that should pay where many windows (images * windows per image) share the
# bias and rows are short (Swin's windows have 7x7 to 12x12 tokens).


def _search(attn, relative_pos_bias):
    return torch.softmax(attn + relative_pos_bias.unsqueeze(0), dim=-1)


def _masked_search(attn, relative_pos_bias, attn_mask):
    _, heads, n, _ = attn.shape
    scores = (attn + relative_pos_bias.unsqueeze(0)).view(-1, attn_mask.shape[0], heads, n, n)
    scores = scores + attn_mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(scores.view(-1, heads, n, n), dim=-1)


def _written(attn, relative_pos_bias, attn_mask=None):
    if attn_mask is None:
        return _search(attn, relative_pos_bias)
    return _masked_search(attn, relative_pos_bias, attn_mask)


def _masked_views(args):
    attn, windows_per_image = args["attn"], args["attn_mask"].shape[0]
    if attn.dim() != 4:
        return []  # not Swin's scores: no views fit
    windows, heads, n, _ = attn.shape
    return [(windows // windows_per_image, windows_per_image, heads, n, n), tuple(attn.shape)]


def _example_inputs(dtype, grad):
    return [
        torch.empty(4, 2, 5, 5, dtype=dtype, requires_grad=grad),
        torch.empty(2, 5, 5, dtype=dtype, requires_grad=grad),
    ]


def _masked_example_inputs(dtype, grad):
    return [*_example_inputs(dtype, grad), torch.empty(2, 5, 5, dtype=dtype)]


_MIN_WINDOWS = 512
_MAX_TOKENS = 256


def _cost(args) -> Cost:
    windows, tokens = args["attn"].shape[0], args["attn"].shape[-1]
    reason = (
        f"{windows} windows of {tokens} tokens; the kernel takes >= {_MIN_WINDOWS} "
        f"windows of <= {_MAX_TOKENS} tokens"
    )
    fits = windows >= _MIN_WINDOWS and tokens <= _MAX_TOKENS
    return Cost(0.9, reason) if fits else never(reason)


def _compiled_unsupported(args):
    attn, bias, mask = args["attn"], args["relative_pos_bias"], args.get("attn_mask")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        return f"attn {list(attn.shape)} is not (windows, heads, N, N)"
    if bias.shape != attn.shape[1:]:
        return f"relative_pos_bias {list(bias.shape)} is not (heads, N, N)"
    if mask is not None and (mask.dim() != 3 or mask.shape[1:] != attn.shape[2:]):
        return f"attn_mask {list(mask.shape)} is not (windows per image, N, N)"
    return None


def _compiled(attn, relative_pos_bias, attn_mask=None):
    # Eager Swin adds in the promoted dtype (under autocast a bf16 attn plus the fp32 bias gives
    # fp32 probabilities), the kernel in fp32 returning attn's dtype: give it the promoted one.
    dtypes = [t.dtype for t in (attn, relative_pos_bias, attn_mask) if t is not None]
    attn = attn.to(functools.reduce(torch.promote_types, dtypes))
    return swin_fmha_op(attn, relative_pos_bias, attn_mask)[0]


COMPILER_OP = CompilerOp(
    "swin_fmha", "attn", _written,
    patterns=(
        Pattern("swin_fmha", _search, _example_inputs),
        Pattern("swin_fmha", _masked_search, _masked_example_inputs, view_shapes=_masked_views),
    ),
    kernel=_compiled, cost=_cost, unsupported=_compiled_unsupported,
)


if triton_available():

    @triton.jit
    def _swin_fmha_kernel(
        attn, bias, mask, out, lse, grad_probs, partial_bias,
        windows, heads, n, nw,
        HAS_MASK: tl.constexpr, BACKWARD: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WIDE_FP64: tl.constexpr,
    ):
        wide = tl.float64 if WIDE_FP64 else tl.float32
        head_row = tl.program_id(0)  # h * n + i: one row of the bias
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        h = head_row // n
        i = head_row % n
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < n
        bias_row = tl.load(bias + head_row * n + cols, mask=col_ok, other=0.0).to(wide)
        bias_grad = tl.zeros((BLOCK_N,), dtype=wide)

        for start in range(split * BLOCK_M, windows, splits * BLOCK_M):
            win = start + tl.arange(0, BLOCK_M)
            ok = (win[:, None] < windows) & col_ok[None, :]
            row = (win.to(tl.int64) * heads + h) * n + i  # row index into (B*nW, nH, N)
            offsets = row[:, None] * n + cols[None, :]
            x = tl.load(attn + offsets, mask=ok, other=0.0).to(wide) + bias_row[None, :]
            if HAS_MASK:
                mask_row = ((win % nw) * n + i) * n
                x += tl.load(mask + mask_row[:, None] + cols[None, :], mask=ok,
                             other=0.0).to(wide)
            # Padding columns drop out of the softmax; padding rows stay finite (never stored).
            x = tl.where(col_ok[None, :], x, float("-inf"))
            if BACKWARD:
                row_lse = tl.load(lse + row, mask=win < windows, other=0.0)
                p = tl.exp(x - row_lse[:, None])
                dp = tl.load(grad_probs + offsets, mask=ok, other=0.0).to(wide)
                ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])
                ds = tl.where(ok, ds, 0.0)
                tl.store(out + offsets, ds.to(out.dtype.element_ty), mask=ok)
                bias_grad += tl.sum(ds, axis=0)
            else:
                row_max = tl.max(x, axis=1)
                e = tl.exp(x - row_max[:, None])
                total = tl.sum(e, axis=1)
                tl.store(out + offsets, (e / total[:, None]).to(out.dtype.element_ty), mask=ok)
                tl.store(lse + row, row_max + tl.log(total), mask=win < windows)
        if BACKWARD:
            tl.store(partial_bias + (split * heads * n + head_row) * n + cols, bias_grad,
                     mask=col_ok)
