"""The kinds of ``migrate --parallel`` and the ``Config`` sizes each sets: the one table that
the runtime's ``parallel_config`` and the codemod (``--parallel``, ``[tool.accrewrite]
parallel``) read. It imports nothing, so that the codemod reads it without torch.

Each kind maps to a function of torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (the ranks of
one machine) that gives ``{dist section: size}``, the sizes left out staying at 1.
"""

from types import MappingProxyType


def _shard_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"fsdp": world}


def _split_over_every_rank(world: int, local: int) -> dict[str, int]:
    return {"tp": world}


def _split_in_a_machine_shard_over_machines(world: int, local: int) -> dict[str, int]:
    # Tensor parallelism exchanges activations in every layer: it stays on one machine's links.
    return {"tp": local, "fsdp": world // local}


KINDS = MappingProxyType({
    "fsdp": _shard_over_every_rank,
    "tp": _split_over_every_rank,
    "fsdp,tp": _split_in_a_machine_shard_over_machines,
})
PARALLEL_KINDS = tuple(KINDS)
