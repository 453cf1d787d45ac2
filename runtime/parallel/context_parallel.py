"""Context (sequence) parallel by Ulysses: each wrapped layer computes on ``1 / sp`` of the
sequence, its attention on ``1 / sp`` of the heads.

``shard_sequence(layer, mesh)`` makes a layer take its first input (the hidden states, batch
first: ``(batch, sequence, ...)``) cut along the sequence, this rank's part of the 1-D ``mesh``,
and give back its output gathered whole; inside it, every ``F.scaled_dot_product_attention``
swaps the sequence split for a split of the heads by an all-to-all (``all_to_all_single``), so
that each rank attends over the whole sequence with ``heads / sp`` heads, and swaps back after.
An ``nn.MultiheadAttention`` is first converted into separate projections (``mha.py``) whose
forward calls ``scaled_dot_product_attention``. What runs between the layers (embeddings,
positional embeddings, the loss) sees the whole sequence, so positions need no offset; a
layer's other inputs (a rotary table, position ids) are cut along their dim of the sequence's
length, where they have one. Only attention is made to see the whole sequence, so at a layer's
first forward its parts, gathered, are checked against the layer on the whole sequence: a
layer that mixes tokens otherwise is refused rather than trained wrong.

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

from .._tensor_tree import map_tensors
from .mha import SplitQKVMultiheadAttention

SEQUENCE_DIM = 1  # of a layer's hidden states (batch, sequence, ...)
HEAD_DIM = 1  # of attention's q, k, v (batch, heads, sequence, head_dim)


def shard_sequence(layer: nn.Module, mesh) -> None:
    """``layer`` computes on this rank's part of the sequence, its attention over all of it
    (see the module docstring)."""
    for path, module in list(layer.named_modules()):
        if isinstance(module, nn.MultiheadAttention):
            parent, _, attribute = path.rpartition(".")
            converted = SplitQKVMultiheadAttention.from_module(module)
            converted.register_forward_pre_hook(_refuse_attention_weights, with_kwargs=True)
            setattr(layer.get_submodule(parent), attribute, converted)
    attention = _UlyssesAttention(mesh)
    name = type(layer).__name__  # FSDP2 renames the class later
    checked, whole = False, None  # whole: the first call's inputs, until its forward is checked

    def split(module, args, kwargs):
        nonlocal whole
        if not args or not isinstance(args[0], torch.Tensor):
            raise ValueError(f"context parallel splits the hidden states a {name} gets as its first argument, "
                             f"but it got {type(args[0]).__name__ if args else 'none'}")
        length = args[0].shape[SEQUENCE_DIM]
        if not checked:
            whole = map_tensors(torch.Tensor.detach, (args, kwargs))
        hidden = _Split.apply(args[0], mesh, SEQUENCE_DIM)
        others = map_tensors(lambda tensor: _split_along_sequence(tensor, length, mesh), (args[1:], kwargs))
        return (hidden, *others[0]), others[1]

    def gather(module, args, kwargs, output):
        nonlocal checked, whole
        if not checked:
            _check_parts_match_whole(module, name, forward, whole, (args, kwargs))
            checked, whole = True, None
        if isinstance(output, tuple):
            return (_Gather.apply(output[0], mesh), *output[1:])
        return _Gather.apply(output, mesh)

    forward = _WithAttentionOverParts(layer, layer.__dict__.get("forward"), attention)
    layer.forward = forward
    layer.register_forward_pre_hook(split, with_kwargs=True)
    layer.register_forward_hook(gather, with_kwargs=True)


class _WithAttentionOverParts:
    """A layer's forward with its ``scaled_dot_product_attention`` calls made Ulysses'. Set on
    the instance, so that activation checkpointing, which wraps it, recomputes through it.
    ``original`` is a forward set on the instance before (None: the class's); the module is held
    rather than its bound ``forward`` so that pickling and deepcopy do not follow a bound method
    back to this object."""

    def __init__(self, module: nn.Module, original, attention: _UlyssesAttention):
        self.module, self.original, self.attention = module, original, attention

    def whole(self, *args, **kwargs):
        """The forward on the whole sequence."""
        if self.original is not None:
            return self.original(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        with self.attention:
            return self.whole(*args, **kwargs)


def _check_parts_match_whole(layer: nn.Module, name: str, forward: _WithAttentionOverParts, whole,
                             part) -> None:
    """Only ``scaled_dot_product_attention`` is made to see the whole sequence: a layer that
    mixes tokens otherwise (attention written with a matmul and a softmax, positions taken from
    its input's length, a convolution over the sequence) would compute each part on its own and
    train silently wrong; so would another input cut along the wrong dim. At its first forward
    the layer runs once more on the ``whole`` inputs and once on this rank's ``part`` (each an
    ``(args, kwargs)`` pair; in eval mode, so that dropout draws nothing, without gradients):
    the parts gathered must be the whole's result."""
    modes = {module: module.training for module in layer.modules()}
    layer.eval()
    try:
        with torch.no_grad():
            expected = _first(forward.whole(*whole[0], **whole[1]))
            computed = _all_gather(_first(forward(*part[0], **part[1])), forward.attention.mesh, SEQUENCE_DIM)
    finally:
        for module, training in modes.items():
            module.training = training
    tolerance = 1e-4 if expected.dtype == torch.float32 else 1e-2
    if not torch.allclose(computed, expected, rtol=tolerance, atol=tolerance):
        raise ValueError(f"context parallel computes {name} on parts of the sequence, and it gives "
                         f"another result than on the whole: it mixes tokens outside F.scaled_dot_product_attention "
                         f"(an attention written with matmul and softmax, positions from its input's length, a "
                         f"convolution over the sequence), or an input is not cut along its sequence; write its "
                         f"attention with F.scaled_dot_product_attention and take positions before the layers, "
                         f"or leave config.dist.sp.size at 1")


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _refuse_attention_weights(attention, args, kwargs):
    """The weights an ``nn.MultiheadAttention`` returns are computed from its rank's part of the
    sequence only."""
    if (args[4] if len(args) > 4 else kwargs.get("need_weights", True)):
        raise ValueError("context parallel cannot return nn.MultiheadAttention's attention weights, which it "
                         "computes over parts of the sequence on different ranks; call it with "
                         "need_weights=False")


def _split_along_sequence(tensor: torch.Tensor, length: int, mesh) -> torch.Tensor:
    """A layer's other input (a rotary table ``(sequence, dim)``, position ids) cut along its one
    dim of the sequence's ``length``; whole where it has none (or several, as a mask): the first
    forward's check finds a guess that was wrong."""
    dims = [dim for dim, size in enumerate(tensor.shape) if size == length]
    return _Split.apply(tensor, mesh, dims[0]) if len(dims) == 1 else tensor


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
    """This rank's part of the sequence, along ``dim``; backward: the whole gradient, from every
    rank's part, divided by ``sp`` (the layers' gradients come scaled by ``sp``, see ``_Gather``)."""

    @staticmethod
    def forward(ctx, tensor, mesh, dim):
        ctx.mesh, ctx.dim = mesh, dim
        start, part = _sequence_part(tensor.shape[dim], mesh)
        return tensor.narrow(dim, start, part).clone()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.mesh, ctx.dim) / ctx.mesh.size(), None, None


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
