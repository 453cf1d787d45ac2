"""Data reading (TorchAcc's data reading): prefetching, packed datasets, a preprocessing cache."""

from types import MappingProxyType

from accrewrite.lazy import lazy_attributes

_ATTRIBUTES = MappingProxyType({
    "Prefetcher": "prefetcher:Prefetcher",
    "PackedDataset": "packed:PackedDataset",
    "block_causal_mask": "packed:block_causal_mask",
    "PreprocessCache": "cache:PreprocessCache",
})
__all__ = list(_ATTRIBUTES)
__getattr__ = lazy_attributes(__name__, _ATTRIBUTES)
