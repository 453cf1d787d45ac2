"""The bucketing dataloader (TorchAcc 2.x's ``config.dataloader``): each batch's last dimension
padded up to the nearest of a few lengths, so that a compiler that specializes on shapes
(torch_xla, ``torch.compile`` without dynamic shapes) sees a handful of shapes instead of one per
batch, for less padding than padding every batch to the longest possible length.

The lengths are ``config.dataloader.buckets``, or ``max_length`` cut into ``num_buckets`` equal
steps (``max_length`` the last). A batch is a tensor, a tuple or list, or a dict (any mapping,
such as transformers' ``BatchEncoding``). Its sequences are its tensors of two dimensions or
more; its length is the longest last dimension among the sequences ``pad_value_dict`` names, or,
where it names none of them, among all of them. The sequences of that length are padded up to
the smallest bucket that holds it, each with its value in ``pad_value_dict`` (keyed by dict key
or tuple position), else ``-100`` for ``labels`` (what ``cross_entropy`` ignores) and 0 for the
rest. One-dimensional tensors (a label per sample, lengths) and everything else pass as they
are. A batch longer than the largest bucket is an error that says which buckets to give:
truncating it would silently drop tokens.
"""

from collections.abc import Mapping

import torch

from .config import DataLoaderConfig

IGNORED_LABEL = -100  # cross_entropy's default ignore_index
DEFAULT_NUM_BUCKETS = 8  # TorchAcc's, for max_length without num_buckets


def bucket_lengths(config: DataLoaderConfig) -> list[int] | None:
    """The ascending bucket lengths ``config`` asks for, or None where it asks for none; a
    setting that cannot be honoured raises with what to change."""
    if config.buckets is not None:
        if config.max_length is not None or config.num_buckets is not None:
            raise ValueError("config.dataloader sets buckets and max_length/num_buckets; give one of them")
        if not config.buckets or not all(_positive_int(length) for length in config.buckets):
            raise ValueError(f"config.dataloader.buckets must be positive integers, got {config.buckets!r}")
        return sorted(set(config.buckets))
    if config.max_length is None:
        if config.num_buckets is not None:
            raise ValueError("config.dataloader.num_buckets needs max_length, the largest bucket")
        if config.pad_value_dict is not None:
            raise ValueError("config.dataloader.pad_value_dict pads to buckets: set buckets or max_length too")
        return None
    count = DEFAULT_NUM_BUCKETS if config.num_buckets is None else config.num_buckets
    if not (_positive_int(config.max_length) and _positive_int(count)) or count > config.max_length:
        raise ValueError(
            f"config.dataloader.max_length ({config.max_length!r}) and num_buckets ({count!r}) must be "
            f"positive integers, no more buckets than the length"
        )
    return sorted({config.max_length * (i + 1) // count for i in range(count)})


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class BucketingLoader:
    """``loader``'s batches, each padded by ``pad_batch``; every other attribute (``sampler``,
    ``dataset``, ``batch_size``) is ``loader``'s."""

    def __init__(self, loader, buckets: list[int], pad_value_dict: dict | None = None):
        self.loader = loader
        self.buckets = buckets
        self.pad_value_dict = pad_value_dict or {}

    def __iter__(self):
        for batch in self.loader:
            yield pad_batch(batch, self.buckets, self.pad_value_dict)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        if name == "loader":  # not set yet (unpickling): no recursion through ourselves
            raise AttributeError(name)
        return getattr(self.loader, name)


def pad_batch(batch, buckets: list[int], pad_value_dict: dict | None = None):
    """``batch`` with the last dimension of its sequences padded up to the nearest of
    ``buckets`` (ascending); see the module docstring."""
    pad_value_dict = pad_value_dict or {}
    if isinstance(batch, torch.Tensor):
        return _pad(batch, _bucket(batch.shape[-1], buckets), 0) if batch.dim() >= 2 else batch
    if isinstance(batch, Mapping):
        items = dict(batch)
    elif isinstance(batch, (tuple, list)):
        items = dict(enumerate(batch))
    else:
        raise TypeError(f"the bucketing loader pads tensors, tuples, lists and dicts; got a batch of "
                        f"{type(batch).__name__}")
    sequences = {key: value for key, value in items.items() if isinstance(value, torch.Tensor) and value.dim() >= 2}
    if not sequences:
        return batch
    named = [key for key in sequences if key in pad_value_dict] or list(sequences)
    length = max(sequences[key].shape[-1] for key in named)
    bucket = _bucket(length, buckets)
    for key, value in sequences.items():
        if value.shape[-1] == length:
            items[key] = _pad(value, bucket, pad_value_dict.get(key, IGNORED_LABEL if key == "labels" else 0))
    return _rebuilt(batch, items)


def _bucket(length: int, buckets: list[int]) -> int:
    for bucket in buckets:
        if bucket >= length:
            return bucket
    raise ValueError(
        f"a batch of length {length} is longer than the largest bucket ({buckets[-1]}); give buckets up to "
        f"the longest batch, such as config.dataloader.buckets = {[*buckets, length]}, or a "
        f"config.dataloader.max_length of at least {length}"
    )


def _pad(tensor: torch.Tensor, length: int, value) -> torch.Tensor:
    if tensor.shape[-1] == length:
        return tensor
    padded = tensor.new_full((*tensor.shape[:-1], length), value)
    padded[..., :tensor.shape[-1]] = tensor
    return padded


def _rebuilt(batch, items: dict):
    """A batch of ``batch``'s type holding ``items``."""
    if isinstance(batch, Mapping):
        return items if type(batch) is dict else type(batch)(items)
    values = list(items.values())
    if isinstance(batch, list):
        return values
    return type(batch)(*values) if hasattr(batch, "_fields") else tuple(values)
