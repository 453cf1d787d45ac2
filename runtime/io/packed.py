"""Packing variable-length token sequences into fixed-length rows (TorchAcc's migration guide, "Pack dataset").

Padding every batch to its longest sample wastes compute on padding and gives the compiler a new
shape per batch. :class:`PackedDataset` instead concatenates whole documents into rows of exactly
``seq_len`` tokens and describes where each document starts, so that attention and the loss never
cross a document boundary::

    packed = PackedDataset(tokenized, seq_len=2048)
    loader = DataLoader(packed, batch_size=8, num_workers=2)
    for batch in loader:
        logits = model(batch["input_ids"], position_ids=batch["position_ids"],
                       attn_mask=batch["attention_mask"])     # [B, 1, L, L] for SDPA
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                               ignore_index=-100)

Each row is a dict of tensors with fixed shapes (so the default collate stacks them and an XLA or
compiled graph sees one shape):

``input_ids`` ``[L]`` int64
    The documents one after another, then ``pad_id`` up to ``seq_len``.
``labels`` ``[L]`` int64
    ``input_ids`` with ``-100`` on the first token of every document and on padding. The labels
    follow the Hugging Face causal-LM convention: they are *not* shifted; the model (or the loss,
    as above) predicts ``labels[i + 1]`` from position ``i``. The ``-100`` at a document's first
    token is exactly the prediction that would cross the boundary from the previous document.
``position_ids`` ``[L]`` int64
    ``0, 1, 2, ...`` restarting at every document; the padding tail counts as one more segment.
``cu_seqlens`` ``[L + 1]`` int32
    Cumulative segment boundaries ``0, len(doc0), len(doc0) + len(doc1), ..., L`` (padding is
    the last segment), repeated ``L`` to a fixed length; ``cu_seqlens.unique_consecutive()``
    gives the exact boundaries for ``flash_attn_varlen_func``.
``attention_mask`` ``[1, L, L]`` bool (only with ``attention_mask=True``, the default)
    Block-diagonal causal mask for ``scaled_dot_product_attention`` (True = may attend); the
    leading 1 broadcasts over heads. Rows are ``L * L`` bytes each: for long rows pass
    ``attention_mask=False`` and build the mask on the device with :func:`block_causal_mask`.

Packing is best-fit decreasing over a buffer of ``buffer_size`` documents, streamed: each time the
buffer fills, its documents are packed and every row but the least filled is emitted; the least
filled row's documents wait for the next buffer. Documents longer than ``seq_len`` are split into
``seq_len``-token pieces that are packed as separate documents (``long_documents="split"``) or cut
to their first ``seq_len`` tokens (``"truncate"``).
"""

import bisect
import itertools
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, get_worker_info

IGNORE_INDEX = -100
"""Label value that ``torch.nn.functional.cross_entropy`` ignores by default."""


def pack_lengths(lengths, capacity: int) -> list[list[int]]:
    """Group items into bins of at most ``capacity`` by best-fit decreasing.

    ``lengths[i]`` is the size of item ``i`` (each at most ``capacity``). Returns the bins in the
    order they were opened, each a list of item indices in ascending order.
    """
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin index), sorted: best fit is a bisect away
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        size = lengths[item]
        if size > capacity:
            raise ValueError(f"item {item} has length {size} > capacity {capacity}")
        slot = bisect.bisect_left(free, (size, -1))
        if slot < len(free):
            room, index = free.pop(slot)
        else:
            room, index = capacity, len(bins)
            bins.append([])
        bins[index].append(item)
        if room - size:
            bisect.insort(free, (room - size, index))
    return [sorted(members) for members in bins]


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The attention mask of packed rows from their ``position_ids`` (``[..., L]``).

    A new document starts wherever the position is 0. Returns a bool tensor ``[..., 1, L, L]``
    that is True where query ``i`` may attend to key ``j``: same document and ``j <= i``. It
    broadcasts over the heads of ``scaled_dot_product_attention``.
    """
    if position_ids.dim() < 1:
        raise ValueError("position_ids must have a sequence dimension")
    length = position_ids.shape[-1]
    document = torch.cumsum(position_ids == 0, dim=-1)
    same_document = document.unsqueeze(-1) == document.unsqueeze(-2)
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (same_document & causal).unsqueeze(-3)


class PackedDataset(IterableDataset):
    """Rows of exactly ``seq_len`` tokens packed from the documents of ``dataset``.

    ``dataset`` is map-style (``__getitem__`` and ``__len__``) or iterable; each sample is a token
    sequence: a list of ints, a 1-D integer tensor or array, or a mapping with ``"input_ids"``
    (a tokenizer's output). Empty documents are skipped.

    Sharding follows ``DistributedSampler``: ``num_replicas`` and ``rank`` default to the
    initialised ``torch.distributed`` group (else one replica). A map-style dataset is split by a
    ``DistributedSampler`` (``shuffle``, ``seed``, ``drop_last`` and :meth:`set_epoch` as there);
    an iterable one round-robin. DataLoader workers split their replica's share further, so no
    document is read twice. Call :meth:`set_epoch` before iterating the loader (with
    ``persistent_workers`` the workers keep the epoch they started with, as with the sampler). Ranks may produce different numbers of rows (packing depends on the
    lengths), so drive distributed training by a step count rather than by loader exhaustion.
    """

    def __init__(
        self,
        dataset,
        seq_len: int,
        *,
        buffer_size: int = 1024,
        pad_id: int = 0,
        long_documents: str = "split",
        attention_mask: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        if long_documents not in ("split", "truncate"):
            raise ValueError(f"long_documents must be 'split' or 'truncate', got {long_documents!r}")
        self.map_style = _is_map_style(dataset)
        if shuffle and not self.map_style:
            raise ValueError("shuffle needs a map-style dataset; shuffle an iterable one upstream")
        if num_replicas is None or rank is None:
            default_replicas, default_rank = _distributed_world()
            num_replicas = default_replicas if num_replicas is None else num_replicas
            rank = default_rank if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.dataset = dataset
        self.seq_len = seq_len
        self.buffer_size = buffer_size
        self.pad_id = pad_id
        self.long_documents = long_documents
        self.attention_mask = attention_mask
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle a map-style dataset for ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        self.epoch = epoch

    def __iter__(self):
        buffer: list[torch.Tensor] = []
        for document in self._documents():
            buffer.extend(self._pieces(document))
            if len(buffer) >= self.buffer_size:
                *rows, least_filled = self._pack(buffer)
                yield from (self._row(row) for row in rows)
                buffer = least_filled
        yield from (self._row(row) for row in self._pack(buffer))

    def _documents(self):
        """This replica's and this DataLoader worker's documents, as 1-D int64 tensors."""
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        if self.map_style:
            sampler = DistributedSampler(
                self.dataset, num_replicas=self.num_replicas, rank=self.rank,
                shuffle=self.shuffle, seed=self.seed, drop_last=self.drop_last,
            )
            sampler.set_epoch(self.epoch)
            indexed = ((i, self.dataset[i]) for i in itertools.islice(sampler, worker_id, None, workers))
        else:
            # The replica's share first, then the worker's: a rank reads the same documents
            # whatever its number of workers.
            share = itertools.islice(enumerate(self.dataset), self.rank, None, self.num_replicas)
            indexed = itertools.islice(share, worker_id, None, workers)
        for index, sample in indexed:
            tokens = _tokens(sample, index)
            if len(tokens):
                yield tokens

    def _pieces(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        if self.long_documents == "truncate":
            return [tokens[: self.seq_len]]
        return list(torch.split(tokens, self.seq_len))

    def _pack(self, documents: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Rows of documents, the least filled last."""
        rows = [[documents[i] for i in members]
                for members in pack_lengths([len(d) for d in documents], self.seq_len)]
        least = min(range(len(rows)), key=lambda r: sum(map(len, rows[r])), default=None)
        if least is not None:
            rows.append(rows.pop(least))
        return rows

    def _row(self, documents: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        length = self.seq_len
        used = sum(len(d) for d in documents)
        segments = [len(d) for d in documents] + ([length - used] if used < length else [])
        boundaries = np.cumsum([0] + segments)

        input_ids = torch.full((length,), self.pad_id, dtype=torch.int64)
        input_ids[:used] = torch.cat(documents)
        position_ids = torch.from_numpy(np.arange(length) - np.repeat(boundaries[:-1], segments))
        labels = input_ids.clone()
        labels[torch.from_numpy(boundaries[: len(documents)])] = IGNORE_INDEX
        labels[used:] = IGNORE_INDEX
        cu_seqlens = torch.full((length + 1,), length, dtype=torch.int32)
        cu_seqlens[: len(boundaries)] = torch.from_numpy(boundaries)

        row = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
               "cu_seqlens": cu_seqlens}
        if self.attention_mask:
            row["attention_mask"] = block_causal_mask(position_ids)
        return row


def _is_map_style(dataset) -> bool:
    if isinstance(dataset, IterableDataset):
        return False
    if isinstance(dataset, Dataset):
        return True
    return hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")


def _distributed_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _tokens(sample, index: int) -> torch.Tensor:
    """A sample's token ids as a 1-D int64 tensor, or a clear error naming the sample."""
    if isinstance(sample, Mapping):
        if "input_ids" not in sample:
            raise KeyError(f"sample {index} is a mapping without 'input_ids' (keys: {list(sample)})")
        sample = sample["input_ids"]
    try:
        tokens = torch.as_tensor(sample)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"sample {index} is not a sequence of token ids: {error}") from None
    if tokens.dim() != 1:
        raise ValueError(f"sample {index} must be a 1-D token sequence, got shape {tuple(tokens.shape)}")
    if tokens.numel() == 0:  # as_tensor([]) is float32: an empty document has no dtype to check
        return tokens.to(torch.int64)
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"sample {index} has {tokens.dtype} tokens; token ids must be integers")
    return tokens.to(torch.int64)
