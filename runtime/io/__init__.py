"""Data reading (TorchAcc's data reading): prefetching, packed datasets, a preprocessing cache."""

from accrewrite.base.lazy import lazy_attributes

__all__, __getattr__ = lazy_attributes(__name__, {
    "Prefetcher": "prefetcher:Prefetcher",
    "PackedDataset": "packed:PackedDataset",
    "block_causal_mask": "packed:block_causal_mask",
    "PreprocessCache": "cache:PreprocessCache",
})
