"""swin_fmha: Swin's WindowAttention, from the relative position bias to the softmax, without
and with the shifted windows' mask.

Swin's own code (and torchvision) writes the image count of the first view as B_ // nW, timm as
-1, and either count and the number of windows per image may be symbolic: the masked form
matches any sizes of its views and checks their shapes.
"""

import torch

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register


def _search(attn, relative_pos_bias):
    return torch.softmax(attn + relative_pos_bias.unsqueeze(0), dim=-1)


def _masked_search(attn, relative_pos_bias, attn_mask):
    _, heads, n, _ = attn.shape
    scores = (attn + relative_pos_bias.unsqueeze(0)).view(-1, attn_mask.shape[0], heads, n, n)
    scores = scores + attn_mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(scores.view(-1, heads, n, n), dim=-1)


def reference(attn, relative_pos_bias, attn_mask=None):
    if attn_mask is None:
        return _search(attn, relative_pos_bias)
    return _masked_search(attn, relative_pos_bias, attn_mask)


def _masked_views(args):
    attn, windows_per_image = args["attn"], args["attn_mask"].shape[0]
    if attn.dim() != 4:
        return []  # not Swin's scores: no views fit
    windows, heads, n, _ = attn.shape
    return [(windows // windows_per_image, windows_per_image, heads, n, n), tuple(attn.shape)]


def _inputs(dtype, grad):
    return [
        torch.empty(4, 2, 5, 5, dtype=dtype, requires_grad=grad),
        torch.empty(2, 5, 5, dtype=dtype, requires_grad=grad),
    ]


def _masked_inputs(dtype, grad):
    return [*_inputs(dtype, grad), torch.empty(2, 5, 5, dtype=dtype)]


register(Op("swin_fmha", "attn", reference, patterns=(
    Pattern("swin_fmha", _search, _inputs),
    Pattern("swin_fmha", _masked_search, _masked_inputs, view_shapes=_masked_views),
)))
register(inductors_code("swin_fmha"))
