"""``ParallelDims``: the degrees of the parallelisms that ``accelerate`` builds, checked against
the world size, and the DeviceMesh they make (built once).

The mesh always has the five named dims of ``MESH_DIMS``, those of size 1 included, so that code
reading ``model.accelerate_mesh`` finds the same names whatever the config:

- ``dp``: data parallel by replication (torchtitan's ``dp_replicate``): FSDP2 replicates over it;
- ``fsdp``: data parallel by sharding (``dp_shard``): FSDP2 shards the parameters over it;
- ``pp``: pipeline parallel: each rank of it holds one stage of the model;
- ``sp``: context (sequence) parallel: each wrapped layer computes on its part of the sequence;
- ``tp``: tensor parallel: each wrapped layer's projections are split over it.

Their order over the ranks is ``config.dist.topology`` (outermost first: the last dim's ranks
are neighbours, ``0, 1, ...``, and get one machine's fast links; ``dp`` before ``fsdp``, as
FSDP2's hybrid mesh has them; ``sp`` after ``fsdp``, and just after it where the topology
leaves it out); the mesh's dims are in that order. Each part takes its slice: ``tp_mesh``,
``pp_mesh``, ``sp_mesh``, ``shard_mesh`` (``dp`` and ``fsdp``, FSDP2's hybrid mesh; with ``sp``,
``fsdp`` and ``sp`` flattened into one dim that FSDP2 shards over, as torchtitan's
``dp_shard_cp``, since the ``sp`` ranks hold the same parameters). A new
parallelism adds its degree here, its dim to ``MESH_DIMS`` and the slice it works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from accrewrite.base.torch_compat import reshape_mesh

MESH_DIMS = ("dp", "fsdp", "pp", "sp", "tp")
ORDERED_DIMS = ("dp", "fsdp", "pp", "tp")  # the dims a topology must name; "sp" may be left out


@dataclass
class ParallelDims:
    """``dp x fsdp x pp x sp x tp`` ranks, as ``config.dist.{dp,fsdp,pp,sp,tp}.size`` give them,
    laid over the ranks in the order of ``topology``; ``dp=None`` takes what ``world_size``
    leaves over ``fsdp * pp * sp * tp``. Raises ``ValueError`` saying what to change when the sizes do not
    fit the world or the topology is not an order of the four dims."""

    dp: int | None
    fsdp: int
    tp: int
    world_size: int
    pp: int = 1
    sp: int = 1
    topology: tuple = ORDERED_DIMS
    mesh: DeviceMesh | None = field(default=None, init=False, repr=False)
    shard: DeviceMesh | None = field(default=None, init=False, repr=False)  # FSDP2's, see shard_mesh

    def __post_init__(self):
        sizes = {"dist.fsdp.size": self.fsdp, "dist.pp.size": self.pp, "dist.sp.size": self.sp,
                 "dist.tp.size": self.tp}
        if self.dp is not None:
            sizes["dist.dp.size"] = self.dp
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"config.{name} must be a positive int, got {size!r}")
        self.topology = _with_sp(tuple(self.topology))
        if sorted(self.topology) != sorted(MESH_DIMS):
            raise ValueError(f"config.dist.topology = {list(self.topology)} must order each of {list(ORDERED_DIMS)} "
                             f"once (and \"sp\", or leave it out), outermost first")
        for inner, outer, why in (("fsdp", "dp", "FSDP2 shards within the replicas of dp"),
                                  ("sp", "fsdp", "FSDP2 shards over fsdp and sp together")):
            if self.topology.index(inner) < self.topology.index(outer):
                raise ValueError(f"config.dist.topology = {list(self.topology)} puts {inner} before {outer}, but "
                                 f"{why}; put {outer} before {inner}")
        rest, world = self.fsdp * self.pp * self.sp * self.tp, self.world_size
        if self.dp is None:
            if world % rest:
                raise ValueError(
                    f"config.dist.fsdp.size * pp.size * sp.size * tp.size = {self.fsdp} * {self.pp} * {self.sp} * "
                    f"{self.tp} does not divide the world size {world}; set them so that their product divides it"
                )
            self.dp = world // rest
        elif self.dp * rest != world:
            raise ValueError(
                f"config.dist.dp.size * fsdp.size * pp.size * sp.size * tp.size = {self.dp} * {self.fsdp} * "
                f"{self.pp} * {self.sp} * {self.tp} = {self.dp * rest}, but the world size is {world}; change the "
                f"sizes so that they multiply to {world} (or leave dp.size as None to take what is left)"
            )

    @classmethod
    def from_config(cls, config, world_size: int) -> ParallelDims:
        """The dims of ``config.dist`` (a ``Config``) on ``world_size`` ranks."""
        dist = config.dist
        return cls(dp=dist.dp.size, fsdp=dist.fsdp.size, tp=dist.tp.size, pp=dist.pp.size, sp=dist.sp.size,
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
        """The ranks that read different batches (the ranks of a ``pp``, ``sp`` or ``tp`` group read the same)."""
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

    @property
    def sp_enabled(self) -> bool:
        return self.sp > 1

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The DeviceMesh of dims ``topology``, built on the first call (collective: every rank
        calls it); None with one process."""
        if self.mesh is None and self.distributed:
            self.mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.topology)
            self.shard = self._fsdp_mesh()
        return self.mesh

    def _fsdp_mesh(self) -> DeviceMesh:
        """FSDP2's mesh, of two dims at most: replicated over ``dp``, sharded over ``fsdp`` and
        ``sp`` together (torchtitan's ``dp_shard_cp``: the ``sp`` ranks hold the same parameters)."""
        if not self.sp_enabled:
            return self.mesh[("dp", "fsdp")]
        return reshape_mesh(self.mesh[("dp", "fsdp", "sp")], (self.dp, self.fsdp * self.sp), ("dp", "fsdp_sp"))

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self._built()["tp"]

    @property
    def pp_mesh(self) -> DeviceMesh:
        return self._built()["pp"]

    @property
    def sp_mesh(self) -> DeviceMesh:
        return self._built()["sp"]

    @property
    def shard_mesh(self) -> DeviceMesh:
        self._built()
        return self.shard  # built with the mesh

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


def _with_sp(topology: tuple) -> tuple:
    """``topology`` with ``sp`` just after ``fsdp`` where it is left out (TorchAcc's default
    names the four others only): FSDP2 shards over the two together."""
    if "sp" in topology or "fsdp" not in topology:
        return topology
    at = topology.index("fsdp") + 1
    return (*topology[:at], "sp", *topology[at:])
