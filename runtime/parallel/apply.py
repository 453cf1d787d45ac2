"""The parts that ``accelerate`` applies to a model, each usable on its own, and ``PARTS``, the
order it applies them in (torchtitan's):

1. ``apply_pp(model, layers, pp, mesh)``: the model cut into one stage per rank of the 1-D
   ``mesh`` (``pipeline.py``); this rank's stage, a ``PipelineModel``, and the layers it holds
   are what the later parts get;
2. ``apply_tp(model, layers, tp, mesh)``: each layer's projections split over the 1-D ``mesh``
   by DTensor's ``parallelize_module`` (``tensor_parallel.py``), the model's other parameters
   replicated on it;
3. ``apply_sp(model, layers, mesh, sp)``: context parallel: each layer computes on its part of the
   sequence over the 1-D ``mesh``, its attention over all of it by Ulysses, ring attention or both
   (``context_parallel.py``);
4. ``apply_ac(model, layers, memory)``: activation checkpointing (``accrewrite.runtime.activation_checkpoint``)
   of the first ``memory.gc_cnt`` checkpointed modules;
5. ``apply_compile(layers)``: ``accrewrite.runtime.compile`` of each layer;
6. ``apply_fsdp(model, layers, fsdp, compute, mesh, cpu_offload)``: FSDP2 over a ``dp x fsdp`` mesh (``fsdp``
   and ``sp`` flattened, with context parallel), last,
   so that it shards the DTensors tensor parallel made and its all-gathers wrap what
   checkpointing and compilation made of each layer.

``layers`` are the model's wrapped layers (``find_layers``): the blocks that are split,
checkpointed, compiled and sharded one by one.

A new parallelism is its ``apply_*`` function, its ``Config`` field, and its ``Part`` in
``PARTS`` at its place in the order; ``accelerate`` applies what ``PARTS`` holds. A part that
returns a ``(model, layers)`` pair hands those to the parts after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from ..blocks import repeated_blocks
from ..activation_checkpoint import checkpoint_modules
from ...base import torch_compat
from .config import (ComputeConfig, Config, FSDPConfig, MemoryConfig, PipelineParallelConfig,
                     SequenceParallelConfig, TensorParallelConfig)
from .context_parallel import MODES, SequenceLayout, shard_sequence
from .parallel_dims import ParallelDims
from .pipeline import PipelineModel, forward_input_names, split_point_names, split_stages
from .tensor_parallel import derive_plan, parallelize_block, replicate_the_rest


def find_layers(model: nn.Module, classes, setting: str) -> list[nn.Module]:
    """The modules of ``model`` of ``classes`` (classes or class names), or, for None, its
    repeated blocks; ``setting`` names the config field in the error when none matches."""
    if classes is None:
        return [block for _, container in repeated_blocks(model) for block in container]
    if isinstance(classes, (str, type)):
        classes = {classes}
    wanted = {c if isinstance(c, str) else c.__name__ for c in classes}
    found = [m for m in model.modules() if type(m).__name__ in wanted]
    if not found:
        present = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"{setting} = {sorted(wanted)} matches no module of {type(model).__name__}; "
                         f"its module classes are {present}")
    return found


def apply_pp(model: nn.Module, layers: list[nn.Module], pp: PipelineParallelConfig,
             mesh) -> tuple[PipelineModel, list[nn.Module]]:
    """``model`` cut before each of ``pp.split_points`` (None: into even parts of ``layers``)
    into one stage per rank of the 1-D ``mesh``: this rank's stage and the ``layers`` it holds."""
    stages = split_stages(model, split_point_names(model, pp, layers), layers, pp.input_names)
    index = mesh.get_local_rank()
    device = next(model.parameters()).device
    stage = PipelineModel(stages[index], index, pp, mesh, device, forward_input_names(stages[0]))
    held = {id(module) for module in stage.modules()}
    return stage, [layer for layer in layers if id(layer) in held]


def apply_tp(model: nn.Module, layers: list[nn.Module], tp: TensorParallelConfig, mesh) -> None:
    """Split each of ``layers`` over the 1-D ``mesh`` by ``tp.plan`` (None: derived from each
    layer's layout), make every other parameter of ``model`` a replicated DTensor on ``mesh``,
    and check at the first forward that the ranks of ``mesh`` got the same inputs."""
    for layer in layers:
        parallelize_block(layer, derive_plan(layer) if tp.plan is None else tp.plan, mesh)
    replicate_the_rest(model, mesh)
    _check_same_inputs(model, mesh, "tensor-parallel")


def apply_sp(model: nn.Module, layers: list[nn.Module], mesh, sp: SequenceParallelConfig | None = None) -> None:
    """Each of ``layers`` computes on this rank's part of the sequence of the 1-D ``mesh``, its
    attention by Ulysses' all-to-all over the heads, ring attention or both, as ``sp.mode``
    says (None: Ulysses); checks at the first forward that the ranks of ``mesh`` got the same
    inputs."""
    _check_not_nested(layers)
    sp = sp or SequenceParallelConfig()
    layout = SequenceLayout.build(mesh, sp.mode, sp.ulysses_size)
    for layer in layers:
        shard_sequence(layer, layout)
    _check_same_inputs(model, mesh, "context-parallel")


def _check_not_nested(layers: list[nn.Module]) -> None:
    """A layer inside another would cut its part of the sequence again."""
    for outer in layers:
        inner = [layer for layer in layers if layer is not outer and any(layer is m for m in outer.modules())]
        if inner:
            raise ValueError(f"context parallel cuts each wrapped layer's sequence once, but {type(inner[0]).__name__} "
                             f"is inside {type(outer).__name__}; give config.dist.fsdp.wrap_layer_cls classes that do "
                             f"not hold one another")


def _check_same_inputs(model: nn.Module, mesh, group: str) -> None:
    """A loader split over every rank (a DDP script's ``DistributedSampler``) would give the
    ranks of a ``group`` group (tensor- or context-parallel) different inputs, and the split
    layers would silently mix them: the first forward compares them."""

    def check(module, args, kwargs):
        handle.remove()
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        digest = torch.stack([t.double().sum() for t in tensors]) if tensors else torch.zeros(1, dtype=torch.float64)
        gathered = [torch.empty_like(digest) for _ in range(mesh.size())]
        dist.all_gather(gathered, digest, group=mesh.get_group())
        if any(not torch.equal(other, gathered[0]) for other in gathered):
            raise ValueError(
                f"the {group} ranks got different inputs; they must read the same batches: pass "
                "the dataloader to accelerate(model, dataloader, config), or split the data over the "
                "data-parallel ranks only (the 'dp' and 'fsdp' dims of model.accelerate_mesh), where a "
                "DistributedSampler over every rank gives each rank batches of its own"
            )

    handle = model.register_forward_pre_hook(check, with_kwargs=True)


def apply_ac(model: nn.Module, layers: list[nn.Module], memory: MemoryConfig) -> None:
    """Activation checkpointing of the ``memory.gc_cls`` modules of ``model`` (None: ``layers``),
    the first ``memory.gc_cnt`` of them (None: all): the earliest hold their activations longest."""
    checkpointed = layers if memory.gc_cls is None else find_layers(model, memory.gc_cls, "config.memory.gc_cls")
    checkpoint_modules(checkpointed[:memory.gc_cnt])


def apply_compile(layers: list[nn.Module]) -> None:
    """``accrewrite.runtime.compile`` of each layer, in place: one graph per layer class, reused
    by the repeated layers."""
    from ..compiler import compile  # the graph compiler loads only when asked for

    for layer in layers:
        compile(layer, regional=False)


def apply_fsdp(model: nn.Module, layers: list[nn.Module], fsdp: FSDPConfig, compute: ComputeConfig,
               mesh, cpu_offload: bool = False) -> None:
    """FSDP2 (``fully_shard``) of each of ``layers``, then of ``model``, over ``mesh`` (2-D
    ``dp x fsdp``: sharded over the last dim, replicated over the first), in
    ``compute.bf16``/``fp16`` with float32 gradient reduction. Each layer frees its gathered
    parameters after its forward (``fsdp.reshard_after_forward``) and issues the all-gather of
    the next ``fsdp.prefetch`` layers before it computes, in both passes. With ``cpu_offload``
    the shards, their gradients and the optimizer step stay on the host (pinned where the mesh
    is on an accelerator)."""
    dtype = torch.bfloat16 if compute.bf16 else torch.float16 if compute.fp16 else None
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    offload = CPUOffloadPolicy(pin_memory=mesh.device_type != "cpu") if cpu_offload else OffloadPolicy()
    for module in (*layers, model):
        fully_shard(module, mesh=mesh, reshard_after_forward=fsdp.reshard_after_forward, mp_policy=policy,
                    offload_policy=offload)
    if fsdp.prefetch > 0:
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + fsdp.prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - fsdp.prefetch):i][::-1])


def _check_precision(config: Config, dims: ParallelDims) -> None:
    compute = config.compute
    if compute.bf16 and compute.fp16:
        raise ValueError("config.compute.bf16 and config.compute.fp16 are both set; choose one")
    if not dims.distributed and (compute.bf16 or compute.fp16):
        raise ValueError(
            "config.compute.bf16/fp16 run through FSDP2's MixedPrecisionPolicy, which needs more than "
            "one process; in one process leave them off and use accrewrite.runtime.amp.autocast"
        )


def _check_memory(config: Config, dims: ParallelDims) -> None:
    memory = config.memory
    if memory.gc_cnt is not None:
        if isinstance(memory.gc_cnt, bool) or not isinstance(memory.gc_cnt, int) or memory.gc_cnt < 0:
            raise ValueError(f"config.memory.gc_cnt is how many modules to checkpoint, got {memory.gc_cnt!r}")
        if not memory.gc:
            raise ValueError("config.memory.gc_cnt counts checkpointed modules: set config.memory.gc = True too")
    if memory.cpu_offload and not dims.fsdp_enabled:
        raise ValueError("config.memory.cpu_offload offloads FSDP2's shards: set config.dist.fsdp.size > 1 too")


def _fsdp_wanted(config: Config, dims: ParallelDims) -> bool:
    # Half precision runs through FSDP2 even where there is nothing to shard (tp over every rank);
    # context parallel's gradients are summed over the sp ranks by FSDP2's reduction.
    half = config.compute.bf16 or config.compute.fp16
    return dims.fsdp_enabled or dims.sp_enabled or (dims.distributed and half)


def _check_context_parallel(config: Config, dims: ParallelDims) -> None:
    sp = config.dist.sp
    if sp.mode not in MODES:
        raise ValueError(f"config.dist.sp.mode = {sp.mode!r}: context parallel runs {', '.join(map(repr, MODES))}")
    if (sp.mode == "2d") != (sp.ulysses_size is not None):
        raise ValueError(f"config.dist.sp.ulysses_size = {sp.ulysses_size!r} with config.dist.sp.mode = {sp.mode!r}: "
                         f"the size of the Ulysses groups is given with mode \"2d\", and only there")
    groups = [size for size in range(2, sp.size // 2 + 1) if sp.size % size == 0]
    if sp.mode == "2d" and sp.ulysses_size not in groups:
        hint = f"give one of {groups}" if groups else "give a size of 4 or more that is not prime, or mode \"ring\""
        raise ValueError(f"config.dist.sp.ulysses_size = {sp.ulysses_size!r} does not split config.dist.sp.size = "
                         f"{sp.size} ranks into Ulysses groups of 2 or more and a ring of 2 or more; {hint}")
    if not dims.sp_enabled:
        return
    if sp.mode != "ulysses":
        torch_compat.ring_attention()  # raises where this torch has none
    others = {"config.dist.pp.size > 1": dims.pp_enabled, "config.dist.tp.size > 1": dims.tp_enabled,
              "config.compute.compile": config.compute.compile}
    given = [name for name, on in others.items() if on]
    if given:
        raise ValueError(f"context parallel (config.dist.sp.size > 1) does not combine with {', '.join(given)} "
                         f"yet; leave one of them out")


def _check_micro_batches(config: Config, dims: ParallelDims) -> None:
    micro = config.dist.pp.num_micro_batches
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"config.dist.pp.num_micro_batches must be a positive int, got {micro!r}")
    if micro < dims.pp:
        raise ValueError(f"config.dist.pp.num_micro_batches = {micro} is fewer than the config.dist.pp.size = "
                         f"{dims.pp} stages, which the 1F1B schedule needs; give at least {dims.pp} (more keep "
                         f"the stages busier)")


def _nothing_to_check(config: Config, dims: ParallelDims) -> None:
    pass


@dataclass(frozen=True)
class Part:
    """One step of ``accelerate``. Before anything is applied, ``check(config, dims)`` of every
    part raises on settings it cannot honour; then, in order, each part that is ``wanted``
    gets ``apply(model, layers, config, dims)`` (``dims.mesh`` built), which may return the
    ``(model, layers)`` that the next parts get. ``name`` says in errors
    what asked for it; a part ``per_layer`` needs the model to have wrapped layers."""

    name: str
    wanted: Callable[[Config, ParallelDims], bool]
    apply: Callable[[nn.Module, list, Config, ParallelDims], tuple[nn.Module, list] | None]
    per_layer: bool = True
    check: Callable[[Config, ParallelDims], None] = _nothing_to_check


PARTS = [
    Part("pipeline parallel (config.dist.pp.size > 1)", per_layer=False, check=_check_micro_batches,
         wanted=lambda config, dims: dims.pp_enabled,
         apply=lambda model, layers, config, dims: apply_pp(model, layers, config.dist.pp, dims.pp_mesh)),
    Part("tensor parallel (config.dist.tp.size > 1)",
         wanted=lambda config, dims: dims.tp_enabled,
         apply=lambda model, layers, config, dims: apply_tp(model, layers, config.dist.tp, dims.tp_mesh)),
    Part("context parallel (config.dist.sp.size > 1)", check=_check_context_parallel,
         wanted=lambda config, dims: dims.sp_enabled,
         apply=lambda model, layers, config, dims: apply_sp(model, layers, dims.sp_mesh, config.dist.sp)),
    Part("activation checkpointing (config.memory.gc)", check=_check_memory,
         wanted=lambda config, dims: config.memory.gc,
         apply=lambda model, layers, config, dims: apply_ac(model, layers, config.memory)),
    Part("compilation (config.compute.compile)",
         wanted=lambda config, dims: config.compute.compile,
         apply=lambda model, layers, config, dims: apply_compile(layers)),
    Part("FSDP2", per_layer=False, check=_check_precision, wanted=_fsdp_wanted,
         apply=lambda model, layers, config, dims: apply_fsdp(model, layers, config.dist.fsdp, config.compute,
                                                              dims.shard_mesh, config.memory.cpu_offload)),
]
