"""Causal attention on CUDA: SDPA's flash kernel (the op's default, "aten": the graph calls
``scaled_dot_product_attention`` as written) or inductor's code (the implementation "inductor"
here: the attention written out, scores, mask, softmax and product, which inductor fuses and
tiles itself).

The rule: SDPA's flash kernel where it takes the problem, half precision with a head size of at
most 256; elsewhere (float32, larger heads) SDPA falls back to its memory-efficient or math
kernel, and inductor's fused code is taken for up to ``_MAX_TOKENS`` tokens, where the scores of
one (batch, head) pair are small enough for its softmax to be one pass. These are heuristics,
not measured here: kernels="autotune" measures both on the target GPU.
"""

import math

import torch

from accrewrite.runtime.compiler.core.registry import FLOATS, Cost, Implementation, never, register
from accrewrite.runtime.compiler.ops import causal_attention as op

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD = 256
_MAX_TOKENS = 1024


def _written_out(q, k, v):
    """Causal attention as the math it is, in q's dtype with the softmax in at least float32,
    as SDPA's math kernel computes it."""
    tokens = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.to(torch.promote_types(q.dtype, torch.float32)).masked_fill(future, -math.inf)
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


def flash_takes(q) -> bool:
    """Whether SDPA's flash kernel takes attention on ``q`` (batch, heads, tokens, head size)."""
    return q.dtype in _FLASH_DTYPES and q.shape[-1] <= _FLASH_MAX_HEAD


def _cost(args) -> Cost:
    q = args["q"]
    tokens, head = q.shape[-2], q.shape[-1]
    if flash_takes(q):
        dtype = str(q.dtype).removeprefix("torch.")
        return never(f"SDPA's flash kernel takes {dtype} heads of {head}")
    if not isinstance(tokens, int) or tokens > _MAX_TOKENS:
        return never(f"{tokens} tokens: scores too long for one fused softmax (> {_MAX_TOKENS})")
    return Cost(0.9, f"no flash kernel for it; {tokens} tokens fit inductor's fused softmax")


register(Implementation("causal_attention", "inductor", ("cuda",), FLOATS, _cost,
                        kernel=_written_out, unsupported=op.unsupported, generated=True))
