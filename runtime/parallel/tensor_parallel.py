"""Tensor-parallel plans for transformer blocks, applied with DTensor's ``parallelize_module``.

A plan maps the name of a module inside a block to how it is split over the ``tp`` mesh:

- ``"colwise"``: output features split (q/k/v, MLP up and gate projections); the block sees
  the local part of the output.
- ``"colwise_fused"``: a fused q/k/v projection (GPT-2's ``c_attn``): each of q, k and v is
  split by attention head, so a rank holds the same heads of all three.
- ``"rowwise"``: input features split (attention output, MLP down projection); the outputs are
  summed over the mesh, so the block sees the full result.
- ``"heads"``: an attention module (or the block itself, ``""``) whose head counts and widths
  (``num_heads``, ``n_head``, ``split_size``, ``embed_dim``...) are divided by the tp size, so
  code that sizes its views from them, or from ``-1`` and a head dimension as Hugging Face and
  torchtitan models do, runs unchanged on its ``heads / tp`` heads. An ``nn.MultiheadAttention``
  is first converted into separate projections (``mha.py``), split q/k/v column-wise and the
  output row-wise.
- or any torch ``ParallelStyle``.

``nn.Linear`` projections are split by torch's ``ColwiseParallel``/``RowwiseParallel``; those
that compute ``x @ W + b`` (GPT-2's ``Conv1D``, weight ``in x out``) and fused q/k/v by the
styles below. ``derive_plan`` (``tp_plan.py``) reads the plan off what a block computes. A plan
without ``"heads"`` entries (given by hand) divides the head counts of the modules holding
projections named as q/k/v are (``q_proj``, ``query``, ``c_attn``...).
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from accrewrite.base.torch_compat import StridedShard
from .mha import SplitQKVMultiheadAttention
from .tp_plan import (ATTENTION_INPUT_NAMES, COLWISE, COLWISE_FUSED, HEADS, OUT_IN, ROWWISE, derive_plan,
                      projection_layout)

_STYLES = (COLWISE, COLWISE_FUSED, ROWWISE, HEADS)
# Attributes of an attention module that count its heads or its q/k/v width.
_HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "num_attention_heads", "num_key_value_heads",
                    "n_kv_heads", "split_size", "embed_dim", "n_embd", "all_head_size", "hidden_size")

__all__ = ["derive_plan", "parallelize_block", "replicate_the_rest"]


def _is_projection(module: nn.Module) -> bool:
    return projection_layout(module) is not None


def parallelize_block(block: nn.Module, plan: dict, mesh) -> None:
    """Split ``block`` over the 1-D ``mesh`` by ``plan`` (names relative to the block)."""
    plan = dict(plan)
    block_name = type(block).__name__
    modules = dict(block.named_modules())
    for name, style in list(plan.items()):
        if style == HEADS and isinstance(modules.get(name), (nn.MultiheadAttention, SplitQKVMultiheadAttention)):
            _check_heads(block, name, "num_heads", modules[name].num_heads, mesh.size())
            if isinstance(modules[name], nn.MultiheadAttention):
                _replace(block, name, SplitQKVMultiheadAttention.from_module(modules[name]))
            for projection in ("q_proj", "k_proj", "v_proj"):
                plan.setdefault(f"{name}.{projection}", COLWISE)
            plan.setdefault(f"{name}.out_proj", ROWWISE)
    modules = dict(block.named_modules())
    missing = sorted(name for name in plan if name not in modules)
    if missing:
        raise ValueError(
            f"config.dist.tp.plan names {missing}, which {block_name} lacks; its "
            f"projections are {[n for n, m in modules.items() if _is_projection(m)]}"
        )
    styles = {}
    for name, style in plan.items():
        if isinstance(style, ParallelStyle):
            styles[name] = style
        elif style not in _STYLES:
            raise ValueError(f"config.dist.tp.plan[{name!r}] = {style!r}: expected one of {_STYLES} "
                             f"or a torch ParallelStyle")
        elif style != HEADS:
            styles[name] = _style(modules[name], style, f"{block_name}.{name}")
    tp = mesh.size()
    heads = [name for name, style in plan.items() if style == HEADS]
    if not heads:  # a plan given by hand: the modules holding q/k/v-named projections
        heads = sorted({name.rpartition(".")[0] for name in plan if name.rpartition(".")[2] in ATTENTION_INPUT_NAMES})
    for name in heads:
        if isinstance(modules[name], SplitQKVMultiheadAttention):
            modules[name].split_heads(mesh)
        else:
            _divide_heads(block, name, tp)
    parallelize_module(block, mesh, styles)


def _replace(block: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(block.get_submodule(parent), leaf, module)


def _style(module: nn.Module, style: str, where: str) -> ParallelStyle:
    layout = projection_layout(module)
    if layout is None:
        raise ValueError(f"config.dist.tp.plan splits {where} ({type(module).__name__}) {style}, but tensor "
                         f"parallel splits projections only: nn.Linear or modules computing x @ W + b")
    if layout == OUT_IN and style == COLWISE:
        return ColwiseParallel()
    if layout == OUT_IN and style == ROWWISE:
        return RowwiseParallel()
    return _Rowwise() if style == ROWWISE else _Colwise(fused=3 if style == COLWISE_FUSED else 1)


def replicate_the_rest(model: nn.Module, mesh) -> None:
    """Make the parameters that no plan split (embeddings, norms, the head, a top module's own
    ``pos_embed``) replicated DTensors on the tensor-parallel ``mesh``. Every parameter of the
    model is then a DTensor on one mesh, as ``clip_grad_norm_`` and the checkpoints need.
    Parameters shared between modules (tied embeddings) stay shared.

    A leaf module computes on DTensors, its inputs and outputs converted as for a split
    projection. A module with children cannot have its inputs converted (each child converts
    its own), so its forward reads its own parameters as their local tensors instead."""
    replicated = {}

    def replicate_own(module):
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in replicated:
                replicated[id(param)] = _replicate(param, mesh)
            module.register_parameter(key, replicated[id(param)])

    for module in list(model.modules()):
        own = list(module.parameters(recurse=False))
        if not own or any(isinstance(p, DTensor) for p in own):
            continue
        if next(module.children(), None) is None:
            distribute_module(module, mesh, lambda name, leaf, mesh: replicate_own(leaf), _Colwise._input, _to_local)
        else:
            replicate_own(module)
            _read_own_parameters_locally(module)


def _read_own_parameters_locally(module: nn.Module) -> None:
    """For the time of ``module``'s forward, its own DTensor parameters are their local tensors
    (through ``to_local``, so their gradients reach the DTensors). The parameters in place at
    the forward are the ones put back: FSDP2 swaps in its gathered ones before."""
    held = {}

    def to_local(module, args):
        for key, param in module._parameters.items():
            if isinstance(param, DTensor):
                held[key] = param
                module._parameters[key] = param.to_local()

    def put_back(module, args, output):
        module._parameters.update(held)
        held.clear()

    module.register_forward_pre_hook(to_local)
    module.register_forward_hook(put_back, always_call=True)


def _to_local(module, output, mesh):
    return output.to_local() if isinstance(output, DTensor) else output


def _check_heads(block: nn.Module, name: str, attribute: str, value: int, tp: int) -> None:
    if value % tp:
        where = f"{type(block).__name__}.{name}" if name else type(block).__name__
        module = block.get_submodule(name)
        raise ValueError(
            f"cannot split {where} ({type(module).__name__}) by head: its {attribute} = {value} is not divisible "
            f"by config.dist.tp.size = {tp}; choose a tp size that divides {value}, or give "
            f"config.dist.tp.plan without {where}'s projections")


def _divide_heads(block: nn.Module, name: str, tp: int) -> None:
    attention = block.get_submodule(name)
    if getattr(attention, "_heads_divided_by", None) == tp:  # a module shared by two entries
        return
    counts = {attribute: value for attribute in _HEAD_ATTRIBUTES
              if isinstance(value := getattr(attention, attribute, None), int) and not isinstance(value, bool)}
    for attribute, value in counts.items():  # all checked before any is changed
        _check_heads(block, name, attribute, value, tp)
    for attribute, value in counts.items():
        setattr(attention, attribute, value // tp)
    attention._heads_divided_by = tp


def _weight_out_dim(module: nn.Module) -> int:
    return 0 if projection_layout(module) == OUT_IN else 1  # Conv1D keeps its weight as in x out


def _replicate(param, mesh):
    return nn.Parameter(DTensor.from_local(param.detach(), mesh, [Replicate()], run_check=False),
                        requires_grad=param.requires_grad)


def _shard(tensor, mesh, dim: int, fused: int):
    placement = Shard(dim) if fused == 1 else StridedShard(dim, split_factor=fused)
    full = tensor.detach()
    if full.shape[dim] % (fused * mesh.size()):
        raise ValueError(f"a projection of {full.shape[dim]} features (in {fused} parts) does not split over "
                         f"config.dist.tp.size = {mesh.size()}; choose a tp size that divides its width")
    local = full.unflatten(dim, (fused, mesh.size(), -1)).select(dim + 1, mesh.get_local_rank()).flatten(dim, dim + 1)
    return nn.Parameter(DTensor.from_local(local.contiguous(), mesh, [placement], run_check=False,
                                           shape=full.shape, stride=full.stride()))


class _Split(ParallelStyle):
    """A projection's parameters split over a 1-D mesh, its inputs and outputs converted
    between plain tensors (what the block's code sees) and DTensors (what the split computes)."""

    def _apply(self, module, mesh):
        if not _is_projection(module):
            raise ValueError(f"tensor parallel splits projections (nn.Linear, or x @ W + b as GPT-2's Conv1D), "
                             f"not {type(module).__name__}")
        return distribute_module(module, mesh, self._partition, self._input, self._output)


class _Colwise(_Split):
    """Output features split; ``fused`` equal parts (q, k, v) are each split alike."""

    def __init__(self, fused: int = 1):
        super().__init__()
        self.fused = fused

    def _partition(self, name, module, mesh):
        module.weight = _shard(module.weight, mesh, _weight_out_dim(module), self.fused)
        if module.bias is not None and self.fused == 1:
            module.bias = _shard(module.bias, mesh, 0, 1)
        elif module.bias is not None:  # FSDP cannot shard dim 0 again on top of a strided split
            module.bias = _replicate(module.bias, mesh)

    @staticmethod
    def _input(module, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) if isinstance(x, torch.Tensor)
                     else x for x in inputs)

    _output = staticmethod(_to_local)


class _Rowwise(_Split):
    """Input features split; the partial outputs are summed over the mesh."""

    def _partition(self, name, module, mesh):
        module.weight = _shard(module.weight, mesh, 1 - _weight_out_dim(module), 1)
        if module.bias is not None:
            module.bias = _replicate(module.bias, mesh)

    @staticmethod
    def _input(module, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Shard(x.dim() - 1)], run_check=False) if isinstance(x, torch.Tensor)
                     else x for x in inputs)

    @staticmethod
    def _output(module, output, mesh):
        return output.redistribute(placements=[Replicate()]).to_local()
