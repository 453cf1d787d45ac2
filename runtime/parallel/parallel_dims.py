"""``ParallelDims``: the degrees of the parallelisms that ``accelerate`` builds, checked against
the world size, and the DeviceMesh they make (built once).

The mesh always has the four named dims of ``MESH_DIMS``, those of size 1 included, so that code
reading ``model.accelerate_mesh`` finds the same names whatever the config:

- ``dp``: data parallel by replication (torchtitan's ``dp_replicate``): FSDP2 replicates over it;
- ``fsdp``: data parallel by sharding (``dp_shard``): FSDP2 shards the parameters over it;
- ``pp``: pipeline parallel: each rank of it holds one stage of the model;
- ``tp``: tensor parallel: each wrapped layer's projections are split over it.

Their order over the ranks is ``config.dist.topology`` (outermost first: the last dim's ranks
are neighbours, ``0, 1, ...``, and get one machine's fast links; ``dp`` before ``fsdp``, as
FSDP2's hybrid mesh has them); the mesh's dims are in that order. Each part takes its slice:
``tp_mesh``, ``pp_mesh``, ``shard_mesh`` (``dp`` and ``fsdp``, FSDP2's hybrid mesh). A new
parallelism adds its degree here, its dim to ``MESH_DIMS`` and the slice it works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("dp", "fsdp", "pp", "tp")


@dataclass
class ParallelDims:
    """``dp x fsdp x pp x tp`` ranks, as ``config.dist.{dp,fsdp,pp,tp}.size`` give them, laid
    over the ranks in the order of ``topology``; ``dp=None`` takes what ``world_size`` leaves
    over ``fsdp * pp * tp``. Raises ``ValueError`` saying what to change when the sizes do not
    fit the world or the topology is not an order of the four dims."""

    dp: int | None
    fsdp: int
    tp: int
    world_size: int
    pp: int = 1
    topology: tuple = MESH_DIMS
    mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        sizes = {"dist.fsdp.size": self.fsdp, "dist.pp.size": self.pp, "dist.tp.size": self.tp}
        if self.dp is not None:
            sizes["dist.dp.size"] = self.dp
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"config.{name} must be a positive int, got {size!r}")
        self.topology = tuple(self.topology)
        if sorted(self.topology) != sorted(MESH_DIMS):
            raise ValueError(f"config.dist.topology = {list(self.topology)} must order each of {list(MESH_DIMS)} "
                             f"once, outermost first")
        if self.topology.index("fsdp") < self.topology.index("dp"):
            raise ValueError(f"config.dist.topology = {list(self.topology)} puts fsdp before dp, but FSDP2 shards "
                             f"within the replicas of dp; put dp before fsdp")
        rest, world = self.fsdp * self.pp * self.tp, self.world_size
        if self.dp is None:
            if world % rest:
                raise ValueError(
                    f"config.dist.fsdp.size * pp.size * tp.size = {self.fsdp} * {self.pp} * {self.tp} does not "
                    f"divide the world size {world}; set them so that their product divides it"
                )
            self.dp = world // rest
        elif self.dp * rest != world:
            raise ValueError(
                f"config.dist.dp.size * fsdp.size * pp.size * tp.size = {self.dp} * {self.fsdp} * {self.pp} * "
                f"{self.tp} = {self.dp * rest}, but the world size is {world}; change the sizes so that they "
                f"multiply to {world} (or leave dp.size as None to take what is left)"
            )

    @classmethod
    def from_config(cls, config, world_size: int) -> ParallelDims:
        """The dims of ``config.dist`` (a ``Config``) on ``world_size`` ranks."""
        dist = config.dist
        return cls(dp=dist.dp.size, fsdp=dist.fsdp.size, tp=dist.tp.size, pp=dist.pp.size,
                   topology=tuple(dist.topology), world_size=world_size)

    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes of the dims, in the order of ``topology``."""
        return tuple(getattr(self, name) for name in self.topology)

    @property
    def distributed(self) -> bool:
        """More than one process: there is a mesh to build."""
        return self.world_size > 1

    @property
    def data_parallel_size(self) -> int:
        """The ranks that read different batches (the ranks of a ``pp`` or ``tp`` group read the same)."""
        return self.dp * self.fsdp

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP2 has ranks to shard or replicate over."""
        return self.distributed and self.data_parallel_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The DeviceMesh of dims ``topology``, built on the first call (collective: every rank
        calls it); None with one process."""
        if self.mesh is None and self.distributed:
            self.mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.topology)
        return self.mesh

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self._built()["tp"]

    @property
    def pp_mesh(self) -> DeviceMesh:
        return self._built()["pp"]

    @property
    def shard_mesh(self) -> DeviceMesh:
        return self._built()[tuple(name for name in self.topology if name in ("dp", "fsdp"))]

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index among the ``data_parallel_size`` ranks that read different batches."""
        coordinate = dict(zip(self.topology, self._built().get_coordinate()))
        return coordinate["dp"] * self.fsdp + coordinate["fsdp"]

    def _built(self) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("ParallelDims.build_mesh(device_type) has not built the mesh (it builds "
                               "none with one process)")
        return self.mesh
