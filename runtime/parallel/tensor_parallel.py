"""Tensor-parallel plans for transformer blocks, applied with DTensor's ``parallelize_module``.

A plan maps the name of a projection inside a block to how it is split over the ``tp`` mesh:

- ``"colwise"``: output features split (q/k/v, MLP up and gate projections); the block sees
  the local part of the output.
- ``"colwise_fused"``: a fused q/k/v projection (GPT-2's ``c_attn``): each of q, k and v is
  split by attention head, so a rank holds the same heads of all three.
- ``"rowwise"``: input features split (attention output, MLP down projection); the outputs are
  summed over the mesh, so the block sees the full result.
- or any torch ``ParallelStyle``.

``nn.Linear`` (weight ``out x in``) and GPT-2's ``Conv1D`` (weight ``in x out``) are both
handled. ``derive_plan`` reads the plan off a block's projection names: separate q/k/v/o
(``q_proj``, ``query``, ``wq``...), GPT-2 (``c_attn``, ``c_fc``, ``c_proj``), Llama
(``gate_proj``, ``up_proj``, ``down_proj``; ``w1``, ``w3``, ``w2``) and plain MLPs (``fc1``,
``fc2``).

The attention of a split block runs on ``heads / tp`` heads: the attention module's head-count
and width attributes (``num_heads``, ``n_head``, ``split_size``, ``embed_dim``...) are divided
by the tp size, so code that sizes its views from them, or from ``-1`` and a head dimension as
Hugging Face and torchtitan models do, runs unchanged.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .._torch_compat import StridedShard

COLWISE, COLWISE_FUSED, ROWWISE = "colwise", "colwise_fused", "rowwise"
_STYLES = (COLWISE, COLWISE_FUSED, ROWWISE)

_BY_NAME = {
    **dict.fromkeys(("q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v",
                     "wq", "wk", "wv", "gate_proj", "up_proj", "w1", "w3", "fc1", "c_fc", "fc_in"), COLWISE),
    **dict.fromkeys(("c_attn", "qkv", "qkv_proj", "Wqkv"), COLWISE_FUSED),
    **dict.fromkeys(("o_proj", "out_proj", "o", "wo", "down_proj", "w2", "fc2", "c_proj", "fc_out"), ROWWISE),
}
_ATTENTION_INPUTS = {"q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v", "wq", "wk", "wv",
                     "c_attn", "qkv", "qkv_proj", "Wqkv"}
# Attributes of an attention module that count its heads or its q/k/v width.
_HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "num_attention_heads", "num_key_value_heads",
                    "n_kv_heads", "split_size", "embed_dim", "n_embd", "all_head_size", "hidden_size")


def _is_projection(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def derive_plan(block: nn.Module) -> dict:
    """``{name: style}`` for the projections of ``block`` whose names tell their role; raises
    when the block has a split that its names cannot complete (no rowwise partner)."""
    plan = {}
    for name, module in block.named_modules():
        style = _BY_NAME.get(name.rpartition(".")[2])
        if style is not None and _is_projection(module):
            plan[name] = style
    parents = {name.rpartition(".")[0] for name in plan}
    for parent in parents:
        styles = {style for name, style in plan.items() if name.rpartition(".")[0] == parent}
        if ROWWISE not in styles or styles == {ROWWISE}:  # half a pair cannot be split alone
            for name in [n for n in plan if n.rpartition(".")[0] == parent]:
                del plan[name]
    if not plan:
        names = [name for name, module in block.named_modules() if _is_projection(module)]
        raise ValueError(
            f"cannot derive a tensor-parallel plan for {type(block).__name__}: its projections "
            f"{names} have no names of a known layout (q_proj/k_proj/v_proj/o_proj, c_attn/c_proj, "
            f"gate_proj/up_proj/down_proj, fc1/fc2); give one in config.dist.tp.plan, as "
            f"{{'attn.q': 'colwise', 'attn.out': 'rowwise'}}"
        )
    return plan


def parallelize_block(block: nn.Module, plan: dict, mesh) -> None:
    """Split ``block`` over the 1-D ``mesh`` by ``plan`` (names relative to the block)."""
    modules = dict(block.named_modules())
    missing = sorted(name for name in plan if name not in modules)
    if missing:
        raise ValueError(
            f"config.dist.tp.plan names {missing}, which {type(block).__name__} lacks; its "
            f"projections are {[n for n, m in modules.items() if _is_projection(m)]}"
        )
    styles = {}
    for name, style in plan.items():
        if isinstance(style, ParallelStyle):
            styles[name] = style
        elif style in _STYLES:
            styles[name] = _Rowwise() if style == ROWWISE else _Colwise(fused=3 if style == COLWISE_FUSED else 1)
        else:
            raise ValueError(f"config.dist.tp.plan[{name!r}] = {style!r}: expected one of {_STYLES} "
                             f"or a torch ParallelStyle")
    tp = mesh.size()
    for name in plan:
        parent, _, leaf = name.rpartition(".")
        if leaf in _ATTENTION_INPUTS:
            _divide_heads(modules[parent], tp)
    parallelize_module(block, mesh, styles)


def replicate_the_rest(model: nn.Module, mesh) -> None:
    """Make the parameters that no plan split (embeddings, norms, the head) replicated DTensors
    on the tensor-parallel ``mesh``, their modules' inputs and outputs converted as for a split
    projection. Every parameter of the model is then a DTensor on one mesh, as
    ``clip_grad_norm_`` and the checkpoints need. Parameters shared between modules (tied
    embeddings) stay shared."""
    replicated = {}

    def partition(name, module, mesh):
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in replicated:
                replicated[id(param)] = _replicate(param, mesh)
            module.register_parameter(key, replicated[id(param)])

    for module in list(model.modules()):
        own = list(module.parameters(recurse=False))
        if own and not any(isinstance(p, DTensor) for p in own):
            distribute_module(module, mesh, partition, _Colwise._input, _to_local)


def _to_local(module, output, mesh):
    return output.to_local() if isinstance(output, DTensor) else output


def _divide_heads(attention: nn.Module, tp: int) -> None:
    if getattr(attention, "_heads_divided_by", None) == tp:  # q, k and v share one parent
        return
    for attribute in _HEAD_ATTRIBUTES:
        value = getattr(attention, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            if value % tp:
                raise ValueError(f"{type(attention).__name__}.{attribute} = {value} is not divisible by "
                                 f"config.dist.tp.size = {tp}; choose a tp size that divides the heads")
            setattr(attention, attribute, value // tp)
    attention._heads_divided_by = tp


def _weight_out_dim(module: nn.Module) -> int:
    return 0 if isinstance(module, nn.Linear) else 1  # Conv1D keeps its weight as in x out


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
            raise ValueError(f"tensor parallel splits nn.Linear or Conv1D projections, not {type(module).__name__}")
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
