"""``Prefetcher(loader, preprocess_fn)``: the data prefetcher of TorchAcc's migration guide, driven by the training loop.

The loop tells it when the host and the device are idle::

    prefetcher = Prefetcher(data_loader, preprocess_fn)
    for samples in prefetcher:
        loss = model(samples)
        loss.backward()
        prefetcher.prefetch_CPU()   # the device is busy with backward: load the next batch
        optimizer.step()
        prefetcher.prefetch_GPU()   # copy it to the device (non-blocking) and preprocess it

``prefetch_CPU()`` takes the next batch from ``loader`` (on the host, in the calling thread).
``prefetch_GPU()`` moves it to the device (pinned, ``non_blocking``, on a side stream on an
accelerator; see ``_transfer``) and applies ``preprocess_fn`` there; the next iteration returns
it. Each call does its work once per batch, and ``prefetch_GPU`` loads first if
``prefetch_CPU`` was not called, so a loop that calls neither still gets every batch, in order.
``iter()`` starts over and prepares the first batch at once.
"""

import torch

from .. import xla_model as xm
from .._transfer import DeviceMover

_NOTHING = object()  # no batch held at this stage


class Prefetcher:
    def __init__(self, loader, preprocess_fn=None, device=None):
        if preprocess_fn is not None and not callable(preprocess_fn):
            raise TypeError(f"Prefetcher: preprocess_fn must be callable or None, got {preprocess_fn!r}")
        self._loader = loader
        self._preprocess_fn = preprocess_fn
        self._mover = DeviceMover(torch.device(device) if device is not None else xm.xla_device())
        self._iterator = None
        self._on_host = _NOTHING
        self._on_device = _NOTHING

    @property
    def device(self):
        return self._mover.device

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        self._iterator = iter(self._loader)
        self._on_host = self._on_device = _NOTHING
        self.prefetch_GPU()
        return self

    def __next__(self):
        if self._iterator is None:
            raise TypeError("Prefetcher: call iter() (a for loop) before next()")
        self.prefetch_GPU()
        if self._on_device is _NOTHING:
            raise StopIteration
        batch, self._on_device = self._on_device, _NOTHING
        return self._mover.hand_over(*batch)

    def prefetch_CPU(self):  # noqa: N802 - TorchAcc's name
        """Load the next batch from the loader onto the host, unless one is already held."""
        if self._iterator is None or self._on_host is not _NOTHING or self._on_device is not _NOTHING:
            return
        try:
            self._on_host = next(self._iterator)
        except StopIteration:
            self._iterator = iter(())  # keeps raising StopIteration; drops the loader's iterator

    def prefetch_GPU(self):  # noqa: N802 - TorchAcc's name
        """Move the loaded batch to the device and preprocess it, loading it first if needed."""
        if self._on_device is not _NOTHING:
            return
        self.prefetch_CPU()
        if self._on_host is _NOTHING:
            return
        batch, self._on_host = self._on_host, _NOTHING
        self._on_device = self._mover(batch, then=self._preprocess_fn)
