"""Apply a function to every tensor of a nested batch, keeping the batch's structure and types.

One walker serves every place the runtime moves data: the device loader (pin, copy to the
device), the prefetcher, and ``xm.save`` (copy to the CPU). It understands tensors, mappings
(``dict``, ``OrderedDict``, ``UserDict`` subclasses such as HF ``BatchEncoding``), lists,
tuples, namedtuples and dataclass instances; anything else (ints, strings, None) is returned as
it is.
"""

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping

import torch


def map_tensors(fn, data):
    """Return ``data`` with every tensor ``t`` in it replaced by ``fn(t)``."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, MutableMapping):
        # A shallow copy keeps the mapping's type and extra state (BatchEncoding keeps its
        # tokenizer encodings next to the dict), then the values are replaced.
        clone = copy.copy(data)
        clone.update({key: map_tensors(fn, value) for key, value in data.items()})
        return clone
    if isinstance(data, Mapping):
        return type(data)({key: map_tensors(fn, value) for key, value in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(map_tensors(fn, value) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(fn, value) for value in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        clone = copy.copy(data)
        for field in dataclasses.fields(data):
            # object.__setattr__ also works on frozen dataclasses.
            object.__setattr__(clone, field.name, map_tensors(fn, getattr(data, field.name)))
        return clone
    return data


def tensors_in(data) -> list:
    """Every tensor in the nested ``data``, in traversal order."""
    found = []

    def collect(tensor):
        found.append(tensor)
        return tensor

    map_tensors(collect, data)
    return found
