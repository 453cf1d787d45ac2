"""causal_attention: causal self-attention, ``F.scaled_dot_product_attention(q, k, v,
is_causal=True)``, as it traces on the graph's device. Dropout, a mask (which excludes
is_causal) and a scale of its own trace to other arguments and do not match."""

import torch
import torch.nn.functional as F

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import (
    EVERY_DEVICE, FLOATS, Implementation, Op, register, same_cost,
)


def reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _inputs(dtype, grad):
    return [torch.empty(2, 3, 8, 4, dtype=dtype, requires_grad=grad) for _ in range(3)]


def unsupported(args) -> str | None:
    """Why ``args`` are not the (batch, heads, tokens, head size) q, k and v of one shape that
    accrewrite's attention kernels take, or None."""
    q, k, v = args["q"], args["k"], args["v"]
    if not q.shape == k.shape == v.shape:
        return f"q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} differ in shape"
    if q.dim() != 4:
        return f"q {list(q.shape)} is not (batch, heads, tokens, head size)"
    if any(isinstance(size, int) and size == 0 for size in q.shape):  # (a 0 is never symbolic)
        return f"q {list(q.shape)} is empty"
    return None


register(Op("causal_attention", "q", reference,
            patterns=(Pattern("causal_attention", reference, _inputs),)))
register(Implementation("causal_attention", "aten", EVERY_DEVICE, FLOATS,
                        same_cost("ATen's fused attention kernel (SDPA's)")))
