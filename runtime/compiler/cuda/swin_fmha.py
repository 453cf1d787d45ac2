"""swin_fmha's Triton kernel (``accrewrite.kernels.swin_fmha``) as its implementation "triton".

The kernel holds each row of N scores in registers and sums the relative position bias's
gradient over the windows inside its backward, where inductor runs a reduction of its own over
the whole gradient: that should pay where many windows (images * windows per image) share the
bias and rows are short (Swin's windows have 7x7 to 12x12 tokens).
"""

import functools

import torch

from accrewrite.kernels.swin_fmha import swin_fmha_op
from accrewrite.runtime.compiler.core.registry import Cost, never, register
from accrewrite.runtime.compiler.core.triton_kernels import triton_implementation

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


def _unsupported(args):
    attn, bias, mask = args["attn"], args["relative_pos_bias"], args.get("attn_mask")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        return f"attn {list(attn.shape)} is not (windows, heads, N, N)"
    if bias.shape != attn.shape[1:]:
        return f"relative_pos_bias {list(bias.shape)} is not (heads, N, N)"
    if mask is not None and (mask.dim() != 3 or mask.shape[1:] != attn.shape[2:]):
        return f"attn_mask {list(mask.shape)} is not (windows per image, N, N)"
    return None


def _swin_fmha(attn, relative_pos_bias, attn_mask=None):
    # Eager Swin adds in the promoted dtype (under autocast a bf16 attn plus the fp32 bias gives
    # fp32 probabilities), the kernel in fp32 returning attn's dtype: give it the promoted one.
    dtypes = [t.dtype for t in (attn, relative_pos_bias, attn_mask) if t is not None]
    attn = attn.to(functools.reduce(torch.promote_types, dtypes))
    return swin_fmha_op(attn, relative_pos_bias, attn_mask)[0]


register(triton_implementation("swin_fmha", "attn", _swin_fmha, _cost, _unsupported))
