"""``ParallelDims``: the degrees of the parallelisms that ``accelerate`` builds, checked against
the world size, and the DeviceMesh they make (built once).

The mesh always has the three named dims ``("dp", "fsdp", "tp")``, those of size 1 included, so
that code reading ``model.accelerate_mesh`` finds the same names whatever the config:

- ``dp``: data parallel by replication (torchtitan's ``dp_replicate``): FSDP2 replicates over it;
- ``fsdp``: data parallel by sharding (``dp_shard``): FSDP2 shards the parameters over it;
- ``tp``: tensor parallel: each wrapped layer's projections are split over it.

Each part takes its slice: ``tp_mesh`` (``mesh["tp"]``), ``shard_mesh`` (``mesh["dp", "fsdp"]``,
FSDP2's hybrid mesh). A new parallelism adds its degree here, its dim to ``MESH_DIMS`` and the
slice it works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("dp", "fsdp", "tp")


@dataclass
class ParallelDims:
    """``dp x fsdp x tp`` ranks, as ``config.dist.{dp,fsdp,tp}.size`` give them; ``dp=None``
    takes what ``world_size`` leaves over ``fsdp * tp``. Raises ``ValueError`` saying what to
    change when the sizes do not fit the world."""

    dp: int | None
    fsdp: int
    tp: int
    world_size: int
    mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        sizes = {"dist.fsdp.size": self.fsdp, "dist.tp.size": self.tp}
        if self.dp is not None:
            sizes["dist.dp.size"] = self.dp
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"config.{name} must be a positive int, got {size!r}")
        fsdp, tp, world = self.fsdp, self.tp, self.world_size
        if self.dp is None:
            if world % (fsdp * tp):
                raise ValueError(
                    f"config.dist.fsdp.size * config.dist.tp.size = {fsdp} * {tp} does not divide "
                    f"the world size {world}; set them so that their product divides it"
                )
            self.dp = world // (fsdp * tp)
        elif self.dp * fsdp * tp != world:
            dp = self.dp
            raise ValueError(
                f"config.dist.dp.size * fsdp.size * tp.size = {dp} * {fsdp} * {tp} = {dp * fsdp * tp}, "
                f"but the world size is {world}; change the sizes so that they multiply to "
                f"{world} (or leave dp.size as None to take what is left)"
            )

    @classmethod
    def from_config(cls, config, world_size: int) -> ParallelDims:
        """The dims of ``config.dist`` (a ``Config``) on ``world_size`` ranks."""
        dist = config.dist
        return cls(dp=dist.dp.size, fsdp=dist.fsdp.size, tp=dist.tp.size, world_size=world_size)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.dp, self.fsdp, self.tp

    @property
    def distributed(self) -> bool:
        """More than one process: there is a mesh to build."""
        return self.world_size > 1

    @property
    def data_parallel_size(self) -> int:
        """The ranks that read different batches (the ranks of a ``tp`` group read the same)."""
        return self.dp * self.fsdp

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP2 has ranks to shard or replicate over."""
        return self.distributed and self.data_parallel_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The ``(dp, fsdp, tp)`` DeviceMesh, built on the first call (collective: every rank
        calls it); None with one process."""
        if self.mesh is None and self.distributed:
            self.mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)
        return self.mesh

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self._built()["tp"]

    @property
    def shard_mesh(self) -> DeviceMesh:
        return self._built()["dp", "fsdp"]

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index among the ``data_parallel_size`` ranks that read different batches."""
        dp_index, fsdp_index, _ = self._built().get_coordinate()
        return dp_index * self.fsdp + fsdp_index

    def _built(self) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("ParallelDims.build_mesh(device_type) has not built the mesh (it builds "
                               "none with one process)")
        return self.mesh
