"""Moving batches to the training device ahead of use (the device loader and the Prefetcher).

On an accelerator a batch is pinned (unless already pinned, e.g. by
``DataLoader(pin_memory=True)``) and copied with ``non_blocking=True`` on a side stream, so the
copy overlaps the step running on the training stream; an event recorded after the copy is what
the training stream waits on when the batch is handed over. Elsewhere (the CPU, a device
without side streams) the batch is moved with a plain ``.to(device)``.
"""

import torch

from accrewrite.base import accelerator
from ._tensor_tree import map_tensors, tensors_in


class DeviceMover:
    """Moves a batch to ``device``; on an accelerator pins it and copies on a side stream,
    recording an event that the consumer waits on."""

    def __init__(self, device):
        self.device = device
        self.stream = accelerator.new_stream(device)

    def __call__(self, batch, then=None):
        """``(moved batch, event or None)``; ``then(moved)``, when given, runs on the device
        right after the copy (on the side stream where there is one) and its result is the
        batch."""
        if self.stream is None:
            moved = map_tensors(lambda t: t.to(self.device), batch)
            return (moved if then is None else then(moved)), None
        # Entering the stream also makes its device current for this thread (the loader's
        # thread must pin and copy for this process's device, not device 0).
        with self.stream:
            moved = map_tensors(self._copy_pinned, batch)
            if then is not None:
                moved = then(moved)
            ready = torch.Event(device=self.device)
            ready.record(self.stream)
        return moved, ready

    def _copy_pinned(self, tensor):
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def hand_over(self, moved, ready):
        """Make ``moved`` safe to use on the current stream."""
        if ready is not None:
            current = accelerator.current_stream(self.device)
            current.wait_event(ready)
            for tensor in tensors_in(moved):
                if accelerator.on_accelerator(tensor.device):
                    # the allocator must not reuse the memory while the training stream uses it
                    tensor.record_stream(current)
        return moved
