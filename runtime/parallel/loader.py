"""The dataloader that ``accelerate`` returns: the original's batches split over the
data-parallel ranks (the ranks of one tensor-parallel group read the same batches)."""

from torch.utils.data import DataLoader, DistributedSampler

from .parallel_dims import ParallelDims


class _EveryNthBatch:
    """The batches of ``batch_sampler`` whose index is ``rank`` modulo ``ranks``, the uneven
    tail dropped."""

    def __init__(self, batch_sampler, rank: int, ranks: int):
        self.batch_sampler, self.rank, self.ranks = batch_sampler, rank, ranks

    def __len__(self):
        return len(self.batch_sampler) // self.ranks

    def __iter__(self):
        batches = iter(self.batch_sampler)
        for _ in range(len(self)):
            group = [next(batches) for _ in range(self.ranks)]
            yield group[self.rank]


def data_parallel_loader(loader: DataLoader, dims: ParallelDims):
    """A loader over ``loader``'s dataset that gives this data-parallel rank every
    ``dims.data_parallel_size``-th batch of ``loader``'s order, or ``loader`` itself when there
    is one data-parallel rank or its ``DistributedSampler`` already splits over them."""
    ranks = dims.data_parallel_size
    if ranks == 1:
        return loader
    if not isinstance(loader, DataLoader):
        raise TypeError(f"accelerate splits a torch DataLoader over the data-parallel ranks, "
                        f"got {type(loader).__name__}; shard the data yourself and pass no dataloader")
    rank = dims.data_parallel_rank
    if isinstance(loader.sampler, DistributedSampler):
        if (loader.sampler.num_replicas, loader.sampler.rank) == (ranks, rank):
            return loader
        raise ValueError(
            f"the dataloader's DistributedSampler splits over {loader.sampler.num_replicas} ranks, but "
            f"there are {ranks} data-parallel ranks (tensor-parallel ranks share batches); build it "
            f"with a plain sampler and let accelerate split it"
        )
    if loader.batch_sampler is None:
        raise ValueError("accelerate splits a dataloader by batches; give one with a batch_size")
    return DataLoader(
        loader.dataset, batch_sampler=_EveryNthBatch(loader.batch_sampler, rank, ranks),
        num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers,
    )
