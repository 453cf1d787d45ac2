"""``nn.MultiheadAttention`` with separate q, k, v and output projections, which tensor
parallelism can split by head.

``nn.MultiheadAttention`` keeps q, k and v in one packed ``in_proj_weight`` and computes in one
functional call, so DTensor cannot split it. ``SplitQKVMultiheadAttention.from_module(mha)``
is the same attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` as ``nn.Linear``
modules holding exactly the packed weights; its ``forward`` takes and returns what
``nn.MultiheadAttention.forward`` does (``batch_first`` either way, unbatched inputs, boolean or
additive ``attn_mask`` and ``key_padding_mask``, ``need_weights``, ``average_attn_weights``). Its
state dict names the projections (``q_proj.weight``...) rather than ``in_proj_weight``.

After ``split_heads(mesh)`` it computes on its ``num_heads / tp`` heads; the attention weights
it returns (``need_weights``) are gathered over the mesh, so every rank returns all heads'.
It is made for that split, with DTensor parameters: ``nn.TransformerEncoder``'s nested-tensor
inference path (eval, a ``src_key_padding_mask``) reads packed weights, which it has not, and
is skipped only for parameters with a ``__torch_function__``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard


class SplitQKVMultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None, batch_first=False,
                 device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.head_mesh = None  # the tp mesh its heads are split over
        # What torch.nn's transformer layers read to choose their inference fast path, which
        # needs a packed projection: these send them down their plain path, which calls forward.
        self._qkv_same_embed_dim, self.in_proj_weight, self.in_proj_bias = False, None, None

    @classmethod
    def from_module(cls, mha: nn.MultiheadAttention) -> "SplitQKVMultiheadAttention":
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("an nn.MultiheadAttention with add_bias_kv or add_zero_attn appends learned or "
                             "zero keys that a head split does not cover; give config.dist.tp.plan without it")
        weight = mha.out_proj.weight
        converted = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias=mha.in_proj_bias is not None,
                        kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first, device=weight.device,
                        dtype=weight.dtype)
        if mha._qkv_same_embed_dim:
            weights = mha.in_proj_weight.chunk(3)
        else:
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None,) * 3
        projections = (converted.q_proj, converted.k_proj, converted.v_proj, converted.out_proj)
        with torch.no_grad():
            for projection, w, b in zip(projections, (*weights, weight), (*biases, mha.out_proj.bias)):
                projection.weight.copy_(w)
                projection.weight.requires_grad_(w.requires_grad)
                if b is not None:
                    projection.bias.copy_(b)
                    projection.bias.requires_grad_(b.requires_grad)
        converted.train(mha.training)
        return converted

    def split_heads(self, mesh) -> None:
        """Compute on this rank's ``num_heads / mesh.size()`` heads (the projections are split
        by the caller)."""
        if self.num_heads % mesh.size():
            raise ValueError(f"{self.num_heads} heads do not split over {mesh.size()} ranks")
        self.num_heads //= mesh.size()
        self.head_mesh = mesh

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if is_causal and attn_mask is None:  # as nn.MultiheadAttention: the hint needs its mask
            raise RuntimeError("Need attn_mask if specifying the is_causal hint")
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
                   for t in (self.q_proj(query), self.k_proj(key), self.v_proj(value)))
        # As nn.MultiheadAttention: without padding or weights, is_causal says attn_mask is causal,
        # and attention takes the hint rather than the mask (context parallel needs no mask).
        causal = is_causal and key_padding_mask is None and not need_weights
        mask = None if causal else self._additive_mask(attn_mask, key_padding_mask, q)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1)
            weights = (scores if mask is None else scores + mask).softmax(-1)
            out = (F.dropout(weights, dropout) if dropout else weights) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).flatten(2))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if weights is None:
            return out, None
        if self.head_mesh is not None:
            weights = DTensor.from_local(weights, self.head_mesh, [Shard(1)], run_check=False).full_tensor()
        if average_attn_weights:
            weights = weights.mean(1)
        return out, weights if batched else weights.squeeze(0)

    def _additive_mask(self, attn_mask, key_padding_mask, q):
        """``attn_mask`` and ``key_padding_mask`` as one float mask added to the scores
        (``True``: not attended), broadcast over (batch, heads, target, source)."""
        mask = None
        if attn_mask is not None:
            if attn_mask.dim() == 3:  # one mask per (batch, head): (batch * heads, target, source)
                if self.head_mesh is not None:
                    raise ValueError("a per-head attn_mask (batch * heads, target, source) cannot follow a "
                                     "split of the heads over tensor-parallel ranks; give one mask for all "
                                     "heads (target, source)")
                attn_mask = attn_mask.view(-1, self.num_heads, *attn_mask.shape[1:])
            mask = _additive(attn_mask, q.dtype)
        if key_padding_mask is not None:
            padding = _additive(key_padding_mask, q.dtype)[:, None, None, :]
            mask = padding if mask is None else mask + padding
        return mask


def _additive(mask, dtype):
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)
