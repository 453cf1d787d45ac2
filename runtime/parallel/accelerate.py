"""``accelerate(model, dataloader=None, config=None)``: TorchAcc 2.x's accelerate API on
torch.distributed.

It places the model on this process's device, copies rank 0's parameters and buffers to every
rank (as DDP's constructor did: ranks may have built different weights), and builds, on a
DeviceMesh of shape ``(dp, fsdp, tp)`` (see ``Config``):

1. tensor parallel (``dist.tp.size > 1``): each wrapped layer's projections split over the
   ``tp`` ranks by DTensor's ``parallelize_module`` (``tensor_parallel.py``);
2. activation checkpointing (``memory.gc``) of the ``memory.gc_cls`` layers (default: the
   wrapped ones), through ``accrewrite.runtime.memory``;
3. ``accrewrite.runtime.compile`` of each wrapped layer (``compute.compile``);
4. FSDP2 (``fully_shard``) of each wrapped layer, then of the whole model, over ``dp x fsdp``
   (hybrid: sharded over ``fsdp``, replicated over ``dp``), with ``MixedPrecisionPolicy`` for
   ``compute.bf16``/``fp16``. Each layer frees its gathered parameters after its forward
   (``fsdp.reshard_after_forward``) and issues the all-gather of the next ``fsdp.prefetch``
   layers before it computes, so communication overlaps compute in both passes.

The wrapped layers are ``dist.fsdp.wrap_layer_cls`` (classes or class names), by default the
repeated blocks of the model (``accrewrite.runtime.blocks``). The parameters become DTensors:
build the optimizer after ``accelerate``; ``torch.nn.utils.clip_grad_norm_`` works on them.
Checkpoints: ``save_checkpoint``/``load_checkpoint`` (``checkpoint.py``). The mesh is
``model.accelerate_mesh`` (dims ``dp``, ``fsdp``, ``tp``; None with one process), for code that
shards its own data or builds its own DTensors.

With a ``dataloader``, the second return value is a loader over the same dataset and collate
function that gives this data-parallel rank every ``dp * fsdp``-th batch of the original's batch
order (the ranks of one tensor-parallel group read the same batches). The original's order must
be the same on every rank (one random state on all of them, as DDP scripts set); an uneven tail
of batches is dropped so that every rank steps as often. A loader with a ``DistributedSampler``
is returned as it is when that sampler already splits over the data-parallel ranks.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from .. import memory
from .. import xla_model as xm
from ..blocks import repeated_blocks
from .config import Config
from .tensor_parallel import derive_plan, parallelize_block, replicate_the_rest

MESH_DIMS = ("dp", "fsdp", "tp")


def accelerate(model: nn.Module, dataloader=None, config: Config | None = None):
    """``model``, or ``(model, dataloader)`` when a dataloader is given, set up by ``config``
    (see the module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"accelerate needs an nn.Module, got {type(model).__name__}")
    config = Config() if config is None else config
    if not isinstance(config, Config):
        raise TypeError(f"config must be an accrewrite.runtime.Config, got {type(config).__name__}")
    compute = config.compute
    if compute.bf16 and compute.fp16:
        raise ValueError("config.compute.bf16 and config.compute.fp16 are both set; choose one")
    xm._default_group()  # the process group, created from torchrun's environment if needed
    world = dist.get_world_size() if dist.is_initialized() else 1
    dp, fsdp, tp = config.mesh_shape(world)
    if world == 1 and (compute.bf16 or compute.fp16):
        raise ValueError(
            "config.compute.bf16/fp16 run through FSDP2's MixedPrecisionPolicy, which needs more than "
            "one process; in one process leave them off and use accrewrite.runtime.amp.autocast"
        )
    device = xm.xla_device()
    model.to(device)
    xm.broadcast_master_param(model)  # rank 0's weights everywhere, as DDP's constructor copied them
    layers = _layers(model, config.dist.fsdp.wrap_layer_cls, "config.dist.fsdp.wrap_layer_cls")
    if not layers and (tp > 1 or config.memory.gc or compute.compile):
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks (an nn.ModuleList or nn.Sequential of one "
            f"class) to split, checkpoint or compile; name its layer classes in "
            f"config.dist.fsdp.wrap_layer_cls"
        )
    mesh = init_device_mesh(device.type, (dp, fsdp, tp), mesh_dim_names=MESH_DIMS) if world > 1 else None

    if tp > 1:
        for layer in layers:
            plan = derive_plan(layer) if config.dist.tp.plan is None else config.dist.tp.plan
            parallelize_block(layer, plan, mesh["tp"])
        replicate_the_rest(model, mesh["tp"])
        _check_tensor_parallel_inputs(model, mesh["tp"])
    if config.memory.gc:
        checkpointed = layers if config.memory.gc_cls is None else _layers(model, config.memory.gc_cls,
                                                                          "config.memory.gc_cls")
        memory.checkpoint_modules(checkpointed)
    if compute.compile:
        from ..compiler import compile  # the graph compiler loads only when asked for

        for layer in layers:
            compile(layer, regional=False)
    if mesh is not None and (dp * fsdp > 1 or compute.bf16 or compute.fp16):
        _fully_shard(model, layers, mesh, config)
    model.accelerate_mesh = mesh
    if dataloader is None:
        return model
    return model, _data_parallel_loader(dataloader, mesh, dp * fsdp)


def _layers(model: nn.Module, classes, setting: str) -> list[nn.Module]:
    """The modules of ``model`` of ``classes`` (classes or names), or its repeated blocks."""
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


def _check_tensor_parallel_inputs(model: nn.Module, mesh) -> None:
    """At the first forward, check that the ranks of a tensor-parallel group got the same
    inputs: a loader split over every rank (a DDP script's ``DistributedSampler``) would give
    them different ones, and the split layers would silently mix them."""

    def check(module, args, kwargs):
        handle.remove()
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        digest = torch.stack([t.double().sum() for t in tensors]) if tensors else torch.zeros(1, dtype=torch.float64)
        gathered = [torch.empty_like(digest) for _ in range(mesh.size())]
        dist.all_gather(gathered, digest, group=mesh.get_group())
        if any(not torch.equal(other, gathered[0]) for other in gathered):
            raise ValueError(
                "the tensor-parallel ranks got different inputs; they must read the same batches: pass "
                "the dataloader to accelerate(model, dataloader, config), or split the data over the "
                "data-parallel ranks only (the 'dp' and 'fsdp' dims of model.accelerate_mesh)"
            )

    handle = model.register_forward_pre_hook(check, with_kwargs=True)


def _fully_shard(model: nn.Module, layers: list[nn.Module], mesh, config: Config) -> None:
    compute, settings = config.compute, config.dist.fsdp
    dtype = torch.bfloat16 if compute.bf16 else torch.float16 if compute.fp16 else None
    # Gradients are reduced in float32 even when computed in half precision.
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    shard_mesh = mesh["dp", "fsdp"]
    for layer in layers:
        fully_shard(layer, mesh=shard_mesh, reshard_after_forward=settings.reshard_after_forward,
                    mp_policy=policy)
    fully_shard(model, mesh=shard_mesh, reshard_after_forward=settings.reshard_after_forward, mp_policy=policy)
    if settings.prefetch > 0:
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + settings.prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - settings.prefetch):i][::-1])


class _EveryNthBatch:
    """The batches of ``batch_sampler`` whose index is ``rank`` modulo ``ranks``, the uneven
    tail dropped."""

    def __init__(self, batch_sampler, rank: int, ranks: int):
        self.batch_sampler, self.rank, self.ranks = batch_sampler, rank, ranks

    def __len__(self):
        return len(self.batch_sampler) // self.ranks

    def __iter__(self):
        batches = iter(self.batch_sampler)
        for _ in range(len(self)):
            group = [next(batches) for _ in range(self.ranks)]
            yield group[self.rank]


def _data_parallel_loader(loader: DataLoader, mesh, ranks: int):
    if ranks == 1:
        return loader
    if not isinstance(loader, DataLoader):
        raise TypeError(f"accelerate splits a torch DataLoader over the data-parallel ranks, "
                        f"got {type(loader).__name__}; shard the data yourself and pass no dataloader")
    dp_index, fsdp_index, _ = mesh.get_coordinate()
    rank = dp_index * mesh["fsdp"].size() + fsdp_index
    if isinstance(loader.sampler, DistributedSampler):
        if (loader.sampler.num_replicas, loader.sampler.rank) == (ranks, rank):
            return loader
        raise ValueError(
            f"the dataloader's DistributedSampler splits over {loader.sampler.num_replicas} ranks, but "
            f"there are {ranks} data-parallel ranks (tensor-parallel ranks share batches); build it "
            f"with a plain sampler and let accelerate split it"
        )
    if loader.batch_sampler is None:
        raise ValueError("accelerate splits a dataloader by batches; give one with a batch_size")
    return DataLoader(
        loader.dataset, batch_sampler=_EveryNthBatch(loader.batch_sampler, rank, ranks),
        num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers,
    )
