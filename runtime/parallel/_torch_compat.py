"""The torch private names the runtime relies on, in one place, so that a torch upgrade that
moves them breaks here and nowhere else."""

# A DTensor placement for a dimension split into ``split_factor`` equal parts, each sharded
# across the mesh: the layout of a fused q/k/v projection split by attention head.
from torch.distributed.tensor.placement_types import _StridedShard as StridedShard

__all__ = ["StridedShard"]
