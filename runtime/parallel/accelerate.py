"""``accelerate(model, dataloader=None, config=None)``: TorchAcc 2.x's accelerate API on
torch.distributed.

It places the model on this process's device, copies rank 0's parameters and buffers to every
rank (as DDP's constructor did: ranks may have built different weights), checks ``config``
against the world (``ParallelDims``), builds the DeviceMesh of dims ``dp``, ``fsdp``, ``pp``,
``sp``, ``tp`` in the order of ``dist.topology`` and applies, in order, the parts that ``config`` asks
for (``apply.py``):

0. pipeline parallel (``dist.pp.size > 1``): the model cut before each ``dist.pp.split_points``
   (None: evenly over its repeated blocks) into one stage per ``pp`` rank (``pipeline.py``);
   what is returned, and what the parts below apply to, is this rank's stage, trained with
   ``loss = model.forward_backward(*inputs, output_fn=None, **kwargs)`` on torch's 1F1B schedule
   over ``dist.pp.num_micro_batches`` micro-batches;
1. tensor parallel (``dist.tp.size > 1``): each wrapped layer's projections split over the
   ``tp`` ranks by DTensor's ``parallelize_module`` (``tensor_parallel.py``);
2. context parallel (``dist.sp.size > 1``): each wrapped layer computes on its part of the
   sequence, its attention (``scaled_dot_product_attention``, ``nn.MultiheadAttention``) on
   its part of the heads, by Ulysses' all-to-all (``context_parallel.py``);
3. activation checkpointing (``memory.gc``) of the ``memory.gc_cls`` layers (default: the
   wrapped ones), through ``accrewrite.runtime.activation_checkpoint``;
4. ``accrewrite.runtime.compile`` of each wrapped layer (``compute.compile``);
5. FSDP2 (``fully_shard``) of each wrapped layer, then of the whole model, over ``dp x fsdp``
   (hybrid: sharded over ``fsdp``, and ``sp`` with it, replicated over ``dp``), with ``MixedPrecisionPolicy`` for
   ``compute.bf16``/``fp16``. Each layer frees its gathered parameters after its forward
   (``fsdp.reshard_after_forward``) and issues the all-gather of the next ``fsdp.prefetch``
   layers before it computes, so communication overlaps compute in both passes.

The wrapped layers are ``dist.fsdp.wrap_layer_cls`` (classes or class names), by default the
repeated blocks of the model (``accrewrite.runtime.blocks``). The parameters become DTensors:
build the optimizer after ``accelerate``; ``torch.nn.utils.clip_grad_norm_`` works on them.
Checkpoints: ``save_checkpoint``/``load_checkpoint`` (``checkpoint.py``). The mesh is
``model.accelerate_mesh`` (dims ``dp``, ``fsdp``, ``pp``, ``sp``, ``tp``; None with one process), for
code that shards its own data or builds its own DTensors.

With a ``dataloader``, the second return value is a loader over the same dataset and collate
function that gives this data-parallel rank every ``dp * fsdp``-th batch of the original's batch
order (the ranks of one pipeline, context- or tensor-parallel group read the same batches; ``loader.py``).
The original's order must be the same on every rank (one random state on all of them, as DDP
scripts set); an uneven tail of batches is dropped so that every rank steps as often. A loader with a
``DistributedSampler`` is returned as it is when that sampler already splits over the
data-parallel ranks. With ``config.dataloader`` buckets (``buckets``, or ``max_length`` and
``num_buckets``), each of its batches is padded up to the nearest bucket (``bucketing.py``).
"""

import torch.distributed as dist
from torch import nn

from .. import xla_model as xm
from . import apply
from .bucketing import BucketingLoader, bucket_lengths
from .config import Config
from .loader import data_parallel_loader
from .parallel_dims import ParallelDims


def accelerate(model: nn.Module, dataloader=None, config: Config | None = None):
    """``model``, or ``(model, dataloader)`` when a dataloader is given, set up by ``config``
    (see the module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"accelerate needs an nn.Module, got {type(model).__name__}")
    config = Config() if config is None else config
    if not isinstance(config, Config):
        raise TypeError(f"config must be an accrewrite.runtime.Config, got {type(config).__name__}")
    buckets = bucket_lengths(config.dataloader)
    if buckets is not None and dataloader is None:
        raise ValueError("config.dataloader pads a dataloader's batches: pass it, "
                         "model, loader = accelerate(model, loader, config)")
    xm._default_group()  # the process group, created from torchrun's environment if needed
    dims = ParallelDims.from_config(config, dist.get_world_size() if dist.is_initialized() else 1)
    for part in apply.PARTS:
        part.check(config, dims)
    device = xm.xla_device()
    model.to(device)
    xm.broadcast_master_param(model)  # rank 0's weights everywhere, as DDP's constructor copied them
    layers = apply.find_layers(model, config.dist.fsdp.wrap_layer_cls, "config.dist.fsdp.wrap_layer_cls")
    parts = [part for part in apply.PARTS if part.wanted(config, dims)]
    per_layer = [part.name for part in parts if part.per_layer]
    if not layers and per_layer:
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks (an nn.ModuleList or nn.Sequential of one "
            f"class) for {', '.join(per_layer)}; name its layer classes in config.dist.fsdp.wrap_layer_cls"
        )
    dims.build_mesh(device.type)
    for part in parts:
        model, layers = part.apply(model, layers, config, dims) or (model, layers)
    model.accelerate_mesh = dims.mesh
    if dataloader is None:
        return model
    loader = data_parallel_loader(dataloader, dims)
    if buckets is not None:
        loader = BucketingLoader(loader, buckets, config.dataloader.pad_value_dict)
    return model, loader
