"""The kinds of ``migrate --parallel`` and the ``Config`` sizes each sets: the one table that
the runtime's ``parallel_config`` and the codemod (``--parallel``, ``[tool.accrewrite]
parallel``) read. It imports nothing, so that the codemod reads it without torch.

Each kind maps to a function of torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (the ranks of
one machine) that gives ``{dist section: size}``, the sizes left out staying at 1.

Pipeline parallel sends activations only where the model is cut: with another kind, its stages
take the machines when there are several and two halves of one machine's ranks otherwise, the
other kind the ranks of a stage (tensor parallel within a machine, as in ``fsdp,tp``).

Context parallel (``cp``, ``config.dist.sp``) exchanges every layer's attention inputs: with
``fsdp``, its groups take the ranks of a machine when there are several and two neighbouring
ranks otherwise, FSDP2 sharding over the rest (and over the groups' ranks, which hold the same
parameters). The runtime does not combine it with ``tp`` or ``pp`` yet.
"""

from types import MappingProxyType


def _shard_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"fsdp": world}


def _split_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"tp": world}


def _split_in_a_machine_shard_over_machines(world: int, local: int) -> dict[str, int]:
    # Tensor parallelism exchanges activations in every layer: it stays on one machine's links.
    return {"tp": local, "fsdp": world // local}


def _stages(world: int, local: int) -> int:
    machines = world // local
    return machines if machines > 1 else min(2, world)


def _stages_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"pp": world}


def _stages_sharded(world: int, local: int) -> dict[str, int]:
    stages = _stages(world, local)
    return {"pp": stages, "fsdp": world // stages}


def _stages_split(world: int, local: int) -> dict[str, int]:
    stages = _stages(world, local)
    return {"pp": stages, "tp": world // stages}


def _stages_split_in_a_machine_sharded(world: int, local: int) -> dict[str, int]:
    stages = _stages(world, local)
    split = local if world // local > 1 else local // stages
    return {"pp": stages, "tp": split, "fsdp": world // (stages * split)}


def _context_groups(world: int, local: int) -> int:
    machines = world // local
    return local if machines > 1 else min(2, world)


def _sequence_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"sp": world}


def _sequence_in_a_group_sharded(world: int, local: int) -> dict[str, int]:
    group = _context_groups(world, local)
    return {"sp": group, "fsdp": world // group}


KINDS = MappingProxyType({
    "fsdp": _shard_over_every_rank,
    "tp": _split_over_every_rank,
    "fsdp,tp": _split_in_a_machine_shard_over_machines,
    "pp": _stages_over_every_rank,
    "fsdp,pp": _stages_sharded,
    "tp,pp": _stages_split,
    "fsdp,tp,pp": _stages_split_in_a_machine_sharded,
    "cp": _sequence_over_every_rank,
    "fsdp,cp": _sequence_in_a_group_sharded,
})
PARALLEL_KINDS = tuple(KINDS)


def unknown_kind(kind: str) -> str:
    """Why ``kind`` is not a kind, for ``--parallel`` and ``[tool.accrewrite] parallel``."""
    why = f"must be one of {', '.join(PARALLEL_KINDS)}, got {kind!r}"
    if "cp" in kind.split(",") and {"tp", "pp"} & set(kind.split(",")):
        return f"{why}: context parallel (cp) does not combine with tensor or pipeline parallel (tp, pp) yet"
    return why
