"""Context (sequence) parallel by Ulysses: each wrapped layer computes on ``1 / sp`` of the
sequence, its attention on ``1 / sp`` of the heads.

``shard_sequence(layer, mesh)`` makes a layer take its first input (the hidden states, batch
first: ``(batch, sequence, ...)``) cut along the sequence, this rank's part of the 1-D ``mesh``,
and give back its output gathered whole; inside it, every ``F.scaled_dot_product_attention``
swaps the sequence split for a split of the heads by an all-to-all (``all_to_all_single``), so
that each rank attends over the whole sequence with ``heads / sp`` heads, and swaps back after.
An ``nn.MultiheadAttention`` is first converted into separate projections (``mha.py``) whose
forward calls ``scaled_dot_product_attention``. What runs between the layers (embeddings,
positional embeddings, the loss) sees the whole sequence, so positions need no offset.

The ranks of ``mesh`` read the same batches and compute the same loss. Each layer's parameters
get from each rank the gradient of that rank's part of the sequence; the whole gradient is
their sum. FSDP2 averages gradients over its mesh, which holds the ``sp`` ranks too, so the
gradient leaving a layer's output is scaled by ``sp`` and the one leaving its input by
``1 / sp``: the layers' parameters get the sum, the rest (identical on every rank) the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .mha import SplitQKVMultiheadAttention

SEQUENCE_DIM = 1  # of a layer's hidden states (batch, sequence, ...)
HEAD_DIM = 1  # of attention's q, k, v (batch, heads, sequence, head_dim)


def shard_sequence(layer: nn.Module, mesh) -> None:
    """``layer`` computes on this rank's part of the sequence, its attention over all of it
    (see the module docstring)."""
    for name, module in list(layer.named_modules()):
        if isinstance(module, nn.MultiheadAttention):
            parent, _, attribute = name.rpartition(".")
            converted = SplitQKVMultiheadAttention.from_module(module)
            converted.register_forward_pre_hook(_refuse_attention_weights, with_kwargs=True)
            setattr(layer.get_submodule(parent), attribute, converted)
    attention = _UlyssesAttention(mesh)

    def split(module, args, kwargs):
        _check_one_tensor_input(module, args, kwargs)
        hidden = _Split.apply(args[0], mesh)
        attention.__enter__()
        return (hidden, *args[1:]), kwargs

    def gather(module, args, kwargs, output):
        # always called, after a forward that raised too (output None), to leave the attention
        if not attention.entered:
            return None
        attention.__exit__(None, None, None)
        if output is None:
            return None
        if isinstance(output, tuple):
            return (_Gather.apply(output[0], mesh), *output[1:])
        return _Gather.apply(output, mesh)

    layer.register_forward_pre_hook(split, with_kwargs=True)
    layer.register_forward_hook(gather, with_kwargs=True, always_call=True)


def _refuse_attention_weights(attention, args, kwargs):
    """The weights an ``nn.MultiheadAttention`` returns are computed from its rank's part of the
    sequence only."""
    if (args[4] if len(args) > 4 else kwargs.get("need_weights", True)):
        raise ValueError("context parallel cannot return nn.MultiheadAttention's attention weights, which it "
                         "computes over parts of the sequence on different ranks; call it with "
                         "need_weights=False")


def _check_one_tensor_input(layer: nn.Module, args, kwargs) -> None:
    """A layer given other tensors than its hidden states (rotary tables, masks) would get them
    whole beside a part of the sequence, and could broadcast them silently wrong."""
    others = [value for value in (*args[1:], *kwargs.values()) if isinstance(value, torch.Tensor)]
    if not args or not isinstance(args[0], torch.Tensor) or others:
        raise ValueError(f"context parallel splits the hidden states a {type(layer).__name__} gets as its only "
                         f"tensor input, but it got {len(others) + len(args[:1])} tensors; compute rotary "
                         f"tables and masks inside the layer, or leave config.dist.sp.size at 1")


def _sequence_part(length: int, mesh) -> tuple[int, int]:
    size = mesh.size()
    if length % size:
        raise ValueError(f"the sequence of length {length} does not split over config.dist.sp.size = {size} "
                         f"ranks; pad it to a multiple of {size} (config.dataloader.buckets)")
    part = length // size
    return mesh.get_local_rank() * part, part


def _all_gather(tensor: torch.Tensor, mesh, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(mesh.size())]
    dist.all_gather(parts, tensor.contiguous(), group=mesh.get_group())
    return torch.cat(parts, dim)


class _Split(torch.autograd.Function):
    """This rank's part of the sequence; backward: the whole gradient, from every rank's part,
    divided by ``sp`` (the layers' gradients come scaled by ``sp``, see ``_Gather``)."""

    @staticmethod
    def forward(ctx, hidden, mesh):
        ctx.mesh = mesh
        start, part = _sequence_part(hidden.shape[SEQUENCE_DIM], mesh)
        return hidden.narrow(SEQUENCE_DIM, start, part).clone()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.mesh, SEQUENCE_DIM) / ctx.mesh.size(), None


class _Gather(torch.autograd.Function):
    """The whole sequence from every rank's part; backward: this rank's part of the gradient
    (the same on every rank), times ``sp``, so that FSDP2's average over the ``sp`` ranks sums
    the parts' gradients of the layer's parameters."""

    @staticmethod
    def forward(ctx, hidden, mesh):
        ctx.mesh = mesh
        return _all_gather(hidden, mesh, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        start, part = _sequence_part(grad.shape[SEQUENCE_DIM], ctx.mesh)
        return grad.narrow(SEQUENCE_DIM, start, part) * ctx.mesh.size(), None


def _all_to_all(tensor: torch.Tensor, mesh, split_dim: int, cat_dim: int) -> torch.Tensor:
    """``tensor`` cut into ``sp`` parts along ``split_dim``, part ``i`` sent to rank ``i``, the
    parts received joined along ``cat_dim``."""
    size = mesh.size()
    if tensor.shape[split_dim] % size:
        raise ValueError(f"attention's {tensor.shape[split_dim]} heads do not split over config.dist.sp.size = "
                         f"{size} ranks; give a size that divides the number of heads")
    send = torch.stack(tensor.chunk(size, split_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=mesh.get_group())
    return torch.cat(received.unbind(0), cat_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, mesh, split_dim, cat_dim):
        ctx.args = mesh, split_dim, cat_dim
        return _all_to_all(tensor, mesh, split_dim, cat_dim)

    @staticmethod
    def backward(ctx, grad):
        mesh, split_dim, cat_dim = ctx.args
        return _all_to_all(grad, mesh, cat_dim, split_dim), None, None, None


class _UlyssesAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on q, k, v split along the sequence, computed on all
    of the sequence and ``heads / sp`` of the heads."""

    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh
        self.entered = False

    def __enter__(self):
        self.entered = True
        return super().__enter__()

    def __exit__(self, *exception):
        self.entered = False
        return super().__exit__(*exception)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        if (rest and rest[0] is not None) or kwargs.get("attn_mask") is not None:
            raise ValueError("context parallel attends over a sequence split across ranks, which an attn_mask "
                             "built for one part does not cover; use is_causal=True, or leave "
                             "config.dist.sp.size at 1")
        sequence = q.dim() - 2
        q, k, v = (_AllToAll.apply(t, self.mesh, HEAD_DIM, sequence) for t in (q, k, v))
        out = func(q, k, v, *rest, **kwargs)
        return _AllToAll.apply(out, self.mesh, sequence, HEAD_DIM)
