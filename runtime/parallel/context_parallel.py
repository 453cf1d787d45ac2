"""Context (sequence) parallel: each wrapped layer computes on ``1 / sp`` of the sequence, its
attention over all of it, by Ulysses, by ring attention, or by both (``config.dist.sp.mode``).

``shard_sequence(layer, layout)`` makes a layer take its first input (the hidden states, batch
first: ``(batch, sequence, ...)``) cut along the sequence, this rank's part (``SequenceLayout``),
and give back its output gathered whole; inside it, every ``F.scaled_dot_product_attention``
sees the whole sequence:

- ``"ulysses"``: an all-to-all (``all_to_all_single``) swaps the sequence split for a split of
  the heads, so that each rank attends over the whole sequence with ``heads / sp`` heads, and
  swaps back after;
- ``"ring"``: torch's own ring attention (its templated ring of ``torch_compat.ring_attention``):
  each rank keeps its queries and attends to every rank's keys and values in turn, merging the
  parts by their logsumexp; the kernel is SDPA's flash kernel of the device (``_ring_kernel``);
- ``"2d"``: Ulysses over the heads within groups of ``config.dist.sp.ulysses_size`` neighbouring
  ranks, then the ring across the groups (TorchAcc's ``context_parallel_2d``).

For causal attention on contiguous parts the ring's ranks would do unequal work (the first
rank's queries see one part of the keys, the last's all of them), so with a ring the sequence
is cut into ``2 * ring`` chunks and ring rank ``j`` holds chunks ``j`` and ``2 * ring - 1 - j``
(torch's head-tail load balancing): every rank computes as much. Only the layers see this order; what
gets their output sees the sequence in its own order.

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

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ...base import torch_compat
from .._tensor_tree import map_tensors
from .mha import SplitQKVMultiheadAttention

SEQUENCE_DIM = 1  # of a layer's hidden states (batch, sequence, ...)
HEAD_DIM = 1  # of attention's q, k, v (batch, heads, sequence, head_dim)
MODES = ("ulysses", "ring", "2d")


@dataclass(frozen=True)
class SequenceLayout:
    """Which positions of the sequence each rank of the 1-D ``mesh`` holds, and the meshes its
    attention runs over: ``heads`` (Ulysses' all-to-all; None: none) and ``ring`` (None: none).
    Rank ``j * ulysses + i`` of ``mesh`` is rank ``i`` of Ulysses group ``j``, rank ``j`` of its
    ring: the all-to-all, which moves the most, gets neighbouring ranks."""

    mesh: object
    heads: object = None
    ring: object = None
    heads_setting: str = "config.dist.sp.size"  # what sets the size of heads, for errors

    @classmethod
    def build(cls, mesh, mode: str, ulysses_size: int | None = None) -> SequenceLayout:
        """The layout of ``config.dist.sp.mode`` over ``mesh`` (collective with "2d": every
        rank calls it)."""
        if mode == "ulysses":
            return cls(mesh, heads=mesh)
        if mode == "ring":
            return cls(mesh, ring=mesh)
        grid = torch_compat.reshape_mesh(mesh, (mesh.size() // ulysses_size, ulysses_size), ("ring", "ulysses"))
        return cls(mesh, heads=grid["ulysses"], ring=grid["ring"], heads_setting="config.dist.sp.ulysses_size")

    @property
    def ring_size(self) -> int:
        return 1 if self.ring is None else self.ring.size()

    def order(self, length: int) -> torch.Tensor:
        """The sequence's positions in the order of the ranks' parts: rank ``r`` holds
        ``order[r * part:(r + 1) * part]``. With a ring, ring rank ``j``'s part is chunks ``j``
        and ``2 * ring - 1 - j`` of ``2 * ring``, which its Ulysses group shares in turn."""
        multiple = self.mesh.size() if self.ring is None else math.lcm(2 * self.ring_size, self.mesh.size())
        if length % multiple:
            chunks = "" if self.ring is None else " (two chunks per ring rank)"
            raise ValueError(f"the sequence of length {length} does not split over config.dist.sp.size = "
                             f"{self.mesh.size()} ranks{chunks}; pad it to a multiple of {multiple} "
                             f"(config.dataloader.buckets)")
        chunks = torch.arange(length).chunk(2 * self.ring_size)
        return torch.cat([chunks[index] for j in range(self.ring_size) for index in (j, -1 - j)])

    def positions(self, length: int) -> torch.Tensor:
        """This rank's positions of a sequence of ``length``."""
        part = length // self.mesh.size()
        return self.order(length)[self.mesh.get_local_rank() * part:][:part]

    def whole(self, parts: torch.Tensor, dim: int) -> torch.Tensor:
        """The sequence in its own order from the ranks' ``parts``, joined along ``dim``."""
        return parts.index_select(dim, self.order(parts.shape[dim]).argsort().to(parts.device))


def shard_sequence(layer: nn.Module, layout: SequenceLayout) -> None:
    """``layer`` computes on this rank's part of the sequence, its attention over all of it
    (see the module docstring)."""
    for path, module in list(layer.named_modules()):
        if isinstance(module, nn.MultiheadAttention):
            parent, _, attribute = path.rpartition(".")
            converted = SplitQKVMultiheadAttention.from_module(module)
            converted.register_forward_pre_hook(_refuse_attention_weights, with_kwargs=True)
            setattr(layer.get_submodule(parent), attribute, converted)
    attention = _AttentionOverParts(layout)
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
        hidden = _Split.apply(args[0], layout, SEQUENCE_DIM)
        others = map_tensors(lambda tensor: _split_along_sequence(tensor, length, layout), (args[1:], kwargs))
        return (hidden, *others[0]), others[1]

    def gather(module, args, kwargs, output):
        nonlocal checked, whole
        if not checked:
            _check_parts_match_whole(module, name, forward, whole, (args, kwargs))
            checked, whole = True, None
        if isinstance(output, tuple):
            return (_Gather.apply(output[0], layout), *output[1:])
        return _Gather.apply(output, layout)

    forward = _WithAttentionOverParts(layer, layer.__dict__.get("forward"), attention)
    layer.forward = forward
    layer.register_forward_pre_hook(split, with_kwargs=True)
    layer.register_forward_hook(gather, with_kwargs=True)


class _WithAttentionOverParts:
    """A layer's forward with its ``scaled_dot_product_attention`` calls made to see the whole
    sequence. Set on the instance, so that activation checkpointing, which wraps it, recomputes
    through it. ``original`` is a forward set on the instance before (None: the class's); the
    module is held rather than its bound ``forward`` so that pickling and deepcopy do not follow
    a bound method back to this object."""

    def __init__(self, module: nn.Module, original, attention: _AttentionOverParts):
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
            computed = _gather_whole(_first(forward(*part[0], **part[1])), forward.attention.layout, SEQUENCE_DIM)
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


def _split_along_sequence(tensor: torch.Tensor, length: int, layout: SequenceLayout) -> torch.Tensor:
    """A layer's other input (a rotary table ``(sequence, dim)``, position ids) cut along its one
    dim of the sequence's ``length``; whole where it has none (or several, as a mask): the first
    forward's check finds a guess that was wrong."""
    dims = [dim for dim, size in enumerate(tensor.shape) if size == length]
    return _Split.apply(tensor, layout, dims[0]) if len(dims) == 1 else tensor


def _part(tensor: torch.Tensor, layout: SequenceLayout, dim: int) -> torch.Tensor:
    return tensor.index_select(dim, layout.positions(tensor.shape[dim]).to(tensor.device))


def _gather_whole(tensor: torch.Tensor, layout: SequenceLayout, dim: int) -> torch.Tensor:
    mesh = layout.mesh
    parts = [torch.empty_like(tensor) for _ in range(mesh.size())]
    dist.all_gather(parts, tensor.contiguous(), group=mesh.get_group())
    return layout.whole(torch.cat(parts, dim), dim)


class _Split(torch.autograd.Function):
    """This rank's part of the sequence, along ``dim``; backward: the whole gradient, from every
    rank's part, divided by ``sp`` (the layers' gradients come scaled by ``sp``, see ``_Gather``)."""

    @staticmethod
    def forward(ctx, tensor, layout, dim):
        ctx.layout, ctx.dim = layout, dim
        return _part(tensor, layout, dim)

    @staticmethod
    def backward(ctx, grad):
        return _gather_whole(grad, ctx.layout, ctx.dim) / ctx.layout.mesh.size(), None, None


class _Gather(torch.autograd.Function):
    """The whole sequence from every rank's part; backward: this rank's part of the gradient
    (the same on every rank), times ``sp``, so that FSDP2's average over the ``sp`` ranks sums
    the parts' gradients of the layer's parameters."""

    @staticmethod
    def forward(ctx, hidden, layout):
        ctx.layout = layout
        return _gather_whole(hidden, layout, SEQUENCE_DIM)

    @staticmethod
    def backward(ctx, grad):
        return _part(grad, ctx.layout, SEQUENCE_DIM) * ctx.layout.mesh.size(), None


def _all_to_all(tensor: torch.Tensor, layout: SequenceLayout, split_dim: int, cat_dim: int) -> torch.Tensor:
    """``tensor`` cut into parts along ``split_dim``, part ``i`` sent to rank ``i`` of
    ``layout.heads``, the parts received joined along ``cat_dim``."""
    mesh = layout.heads
    size = mesh.size()
    if tensor.shape[split_dim] % size:
        raise ValueError(f"attention's {tensor.shape[split_dim]} heads do not split over {layout.heads_setting} = "
                         f"{size} ranks; give a size that divides the number of heads")
    send = torch.stack(tensor.chunk(size, split_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=mesh.get_group())
    return torch.cat(received.unbind(0), cat_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, layout, split_dim, cat_dim):
        ctx.args = layout, split_dim, cat_dim
        return _all_to_all(tensor, layout, split_dim, cat_dim)

    @staticmethod
    def backward(ctx, grad):
        layout, split_dim, cat_dim = ctx.args
        return _all_to_all(grad, layout, cat_dim, split_dim), None, None, None


@dataclass(frozen=True)
class _RingKernel:
    """An SDPA kernel that returns the logsumexp the ring merges by: ``forward(q, k, v,
    is_causal=, dropout_p=, scale=, **forward_kwargs)`` gives ``(out, logsumexp, *rest)``, of
    which ``backward`` takes the first as ``rest_names``, with ``grad_out`` as ``grad_out_name``."""

    forward: object
    backward: object
    grad_out_name: str = "grad_out"
    rest_names: tuple = ()
    forward_kwargs: tuple = ()  # (name, value) pairs
    backward_kwargs: tuple = ()


def _ring_kernel(query: torch.Tensor) -> _RingKernel:
    """SDPA's flash kernel where the device has one for ``query``'s dtype: CUDA's in half
    precision, the CPU's always; CUDA's memory-efficient kernel in float32."""
    aten = torch.ops.aten
    if query.device.type == "cpu":
        return _RingKernel(aten._scaled_dot_product_flash_attention_for_cpu.default,
                           aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    if query.dtype in (torch.float16, torch.bfloat16):
        return _RingKernel(aten._scaled_dot_product_flash_attention.default,
                           aten._scaled_dot_product_flash_attention_backward.default,
                           rest_names=("cum_seq_q", "cum_seq_k", "max_q", "max_k", "philox_seed", "philox_offset"))
    return _RingKernel(aten._scaled_dot_product_efficient_attention.default,
                       aten._scaled_dot_product_efficient_attention_backward.default, grad_out_name="grad_out_",
                       rest_names=("philox_seed", "philox_offset"),
                       forward_kwargs=(("attn_bias", None), ("compute_log_sumexp", True)),
                       backward_kwargs=(("attn_bias", None), ("grad_input_mask", (True, True, True, False))))


class _RingAttention(torch.autograd.Function):
    """Attention of this rank's queries over every ring rank's keys and values, by torch's
    templated ring (``torch_compat.ring_attention``) on ``_ring_kernel``'s kernel. Causal
    attention is balanced: the sequence is laid out head-tail (``SequenceLayout.order``);
    attention that is not causal does not depend on the keys' order, and runs unbalanced."""

    @staticmethod
    def forward(ctx, query, key, value, mesh, is_causal, scale):
        ring, kernel = torch_compat.ring_attention(), _ring_kernel(query)
        with ring.load_balanced(is_causal):
            out, logsumexp, *rest = ring.forward(mesh.get_group(), 2, kernel.forward, query, key, value,
                                                 is_causal=is_causal, dropout_p=0.0, scale=scale,
                                                 **dict(kernel.forward_kwargs))
        ctx.save_for_backward(query, key, value, out, logsumexp)
        ctx.mesh, ctx.is_causal, ctx.scale, ctx.kernel = mesh, is_causal, scale, kernel
        ctx.rest = dict(zip(kernel.rest_names, rest))
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, out, logsumexp = ctx.saved_tensors
        ring, kernel = torch_compat.ring_attention(), ctx.kernel
        with ring.load_balanced(ctx.is_causal):
            grads = ring.backward(ctx.mesh.get_group(), 2, kernel.backward, grad.contiguous(), kernel.grad_out_name,
                                  query, key, value, out, logsumexp, ctx.is_causal, dropout_p=0.0, scale=ctx.scale,
                                  **ctx.rest, **dict(kernel.backward_kwargs))
        return grads[0], grads[1], grads[2], None, None, None


class _AttentionOverParts(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on q, k, v split along the sequence as ``layout``
    holds it, computed over all of the sequence: Ulysses' all-to-all over ``layout.heads`` to
    the whole of the heads' group's sequence, then the ring over ``layout.ring``."""

    def __init__(self, layout: SequenceLayout):
        super().__init__()
        self.layout = layout

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
        if self.layout.heads is not None:
            q, k, v = (_AllToAll.apply(t, self.layout, HEAD_DIM, sequence) for t in (q, k, v))
        out = func(q, k, v, *rest, **kwargs) if self.layout.ring is None else self._ring(q, k, v, *rest, **kwargs)
        if self.layout.heads is not None:
            out = _AllToAll.apply(out, self.layout, sequence, HEAD_DIM)
        return out

    def _ring(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p or enable_gqa:
            raise ValueError(f"ring attention (config.dist.sp.mode = \"ring\" or \"2d\") runs SDPA without "
                             f"{'dropout' if dropout_p else 'enable_gqa'}; give "
                             f"{'dropout_p=0.0' if dropout_p else 'k and v as many heads as q'}, or "
                             f"config.dist.sp.mode = \"ulysses\"")
        return _RingAttention.apply(q, k, v, self.layout.ring, is_causal, scale)
