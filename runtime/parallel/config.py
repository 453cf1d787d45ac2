"""``Config``: what ``accelerate`` builds, laid out like TorchAcc 2.x's ``ta.Config()``.

    config = Config()
    config.dist.fsdp.size = 4                       # shard parameters over 4 ranks
    config.dist.tp.size = 2                         # and split each block's matmuls over 2
    config.dist.fsdp.wrap_layer_cls = {"Block"}     # default: the model's repeated blocks
    config.memory.gc = True                         # activation checkpointing of those blocks
    config.memory.gc_cnt = 6                        # of the first 6 of them only
    config.memory.cpu_offload = True                # FSDP2's shards and optimizer state on the host
    config.compute.bf16 = True                      # FSDP2 mixed precision
    config.compute.compile = True                   # accrewrite.runtime.compile, per block
    config.dist.pp.size = 2                         # two pipeline stages, cut at the middle block
    config.dist.pp.num_micro_batches = 4            # model.forward_backward(*inputs) splits the batch
    config.dist.topology = ["dp", "fsdp", "pp", "tp"]  # tp on neighbouring ranks ("sp" just after "fsdp")
    config.dist.sp.size = 2   # instead of pp, tp and compile (not combined yet): each block on half the sequence
    config.dist.sp.mode = "ring"                    # attention by torch's ring ("ulysses": by all-to-all)
    config.dataloader.buckets = [128, 256, 512]     # each batch padded to the nearest length

The data-parallel size ``dist.dp.size`` defaults to what the world size leaves over
``fsdp.size * pp.size * sp.size * tp.size``. Layer classes are given as classes or as class names
(TorchAcc's spelling: ``{"LlamaDecoderLayer"}``). Every field is checked by ``accelerate`` against the model
and the world (the sizes by ``ParallelDims``), and a mistake is reported with what to change.
"""

import os
from dataclasses import dataclass, field

from accrewrite.base.parallel_kinds import KINDS, PARALLEL_KINDS


@dataclass
class DataParallelConfig:
    size: int | None = None  # None: world size // (fsdp.size * pp.size * tp.size)


@dataclass
class FSDPConfig:
    size: int = 1
    wrap_layer_cls: set | None = None  # classes or class names; None: the repeated blocks
    reshard_after_forward: bool = True  # free the gathered parameters after each block's forward
    prefetch: int = 1  # blocks whose all-gather is issued ahead of the one computing


@dataclass
class TensorParallelConfig:
    size: int = 1
    # Per wrapped block: {submodule name: "colwise" | "rowwise" | "colwise_fused" | "heads" | a
    # torch ParallelStyle}. None: derived from what the block computes (see tp_plan.py).
    plan: dict | None = None


@dataclass
class PipelineParallelConfig:
    size: int = 1
    num_micro_batches: int = 1  # the batch is split along its first dim into this many
    # Modules (or their names) the model is cut before, size - 1 of them; None: the repeated
    # blocks in size even parts.
    split_points: list | None = None
    input_names: list | None = None  # the forward's inputs; None: its arguments without a default
    broadcast_loss: bool = True  # forward_backward returns the loss on every rank, not the last stage only


@dataclass
class SequenceParallelConfig:
    size: int = 1
    # How each attention sees the whole sequence (context_parallel.py): "ulysses", an all-to-all
    # swaps the sequence split for a split of the heads; "ring", each rank's queries attend to
    # every rank's keys and values in turn (torch's ring attention); "2d", Ulysses within groups
    # of ulysses_size neighbouring ranks and the ring across the groups (TorchAcc's
    # context_parallel_2d, whose intra_parallel_size is ulysses_size). TorchAcc's SPConfig has
    # the size only; the mode is ours.
    mode: str = "ulysses"
    ulysses_size: int | None = None  # "2d" only: divides size, the ring has size / ulysses_size ranks


@dataclass
class DistConfig:
    dp: DataParallelConfig = field(default_factory=DataParallelConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    tp: TensorParallelConfig = field(default_factory=TensorParallelConfig)
    pp: PipelineParallelConfig = field(default_factory=PipelineParallelConfig)
    sp: SequenceParallelConfig = field(default_factory=SequenceParallelConfig)
    # The order of the parallelisms over the ranks, outermost first: the last gets neighbouring
    # ranks (one machine's fast links). An order without "sp" has it just after "fsdp".
    topology: list = field(default_factory=lambda: ["dp", "fsdp", "pp", "tp"])


@dataclass
class MemoryConfig:
    gc: bool = False  # activation checkpointing (accrewrite.runtime.activation_checkpoint)
    gc_cls: set | None = None  # classes or names to checkpoint; None: the wrapped layers
    gc_cnt: int | None = None  # checkpoint only the first gc_cnt of them; None: all
    cpu_offload: bool = False  # FSDP2's CPUOffloadPolicy: sharded state and the optimizer step on the host


@dataclass
class DataLoaderConfig:
    # The lengths a batch's last dimension is padded up to (bucketing.py); or ``max_length``
    # cut into ``num_buckets`` equal steps. None: batches as the loader gives them.
    buckets: list[int] | None = None
    max_length: int | None = None
    num_buckets: int | None = None
    # Pad value per dict key or tuple position; unnamed tensors are padded with 0, ``labels`` with -100.
    pad_value_dict: dict | None = None


@dataclass
class ComputeConfig:
    bf16: bool = False
    fp16: bool = False
    compile: bool = False


@dataclass
class Config:
    dist: DistConfig = field(default_factory=DistConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    dataloader: DataLoaderConfig = field(default_factory=DataLoaderConfig)


def parallel_config(kind: str) -> Config:
    """The ``Config`` that ``migrate --parallel KIND`` writes into a DDP script, sized from
    torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` by the table of kinds (``accrewrite.base.parallel_kinds``):
    ``"fsdp"`` shards over every rank; ``"tp"`` splits every block over every rank;
    ``"fsdp,tp"`` splits blocks over the ranks of a machine and shards over the machines;
    ``"pp"`` cuts the model into one stage per rank, and ``"fsdp,pp"``, ``"tp,pp"``,
    ``"fsdp,tp,pp"`` into a stage per machine (two on one machine), sharded or split within
    each; ``"cp"`` splits each layer's sequence over every rank (context parallel), and
    ``"fsdp,cp"`` over the ranks of a machine (two on one machine), sharded over the rest. With
    stages, the batch is split into as many micro-batches as there are stages (the
    fewest the 1F1B schedule takes) and the stages are the outermost dim, so that the other
    kinds keep a machine's links."""
    if kind not in PARALLEL_KINDS:
        raise ValueError(f"parallel_config({kind!r}): expected one of {', '.join(PARALLEL_KINDS)}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    config = Config()
    for section, size in KINDS[kind](world, local).items():
        getattr(config.dist, section).size = size
    if config.dist.pp.size > 1:
        config.dist.pp.num_micro_batches = config.dist.pp.size
        config.dist.topology = ["pp", *(dim for dim in config.dist.topology if dim != "pp")]
    return config
