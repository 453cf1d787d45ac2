"""``multi_apply_multi_stream``: mmdet's ``multi_apply`` with the calls spread over device streams
(TorchAcc's migration guide, "Multi-stream kernel optimizations").

    result = multi_apply_multi_stream(fn, 2, t1, t2, t3)   # == multi_apply(fn, t1, t2, t3)

Like ``mmdet.core.multi_apply(func, *args, **kwargs)`` it calls ``fn(*items, **kwargs)`` for the
items of ``args`` taken in lockstep (``map(fn, *args)``: up to the shortest; a tensor argument
is iterated along its first dimension) and returns the results transposed: a tuple with one list
per output of ``fn``. When an argument holds tensors on an accelerator with streams (CUDA,
XPU, ...), call ``k`` is issued on stream ``k % n_streams`` so that small independent calls
(per-level heads, per-image targets) overlap on the device; elsewhere the calls run one after
the other. Either way the result is the same.
"""

from functools import partial

import torch

from accrewrite.base import torch_compat as compat
from accrewrite.base import accelerator

__all__ = ["multi_apply_multi_stream"]


def multi_apply_multi_stream(fn, n_streams, *args, **kwargs):
    """Apply ``fn`` to the items of ``args`` on up to ``n_streams`` device streams; returns
    ``tuple(map(list, zip(*results)))`` as mmdet's ``multi_apply``."""
    if not isinstance(n_streams, int) or isinstance(n_streams, bool) or n_streams < 1:
        raise ValueError(f"n_streams must be a positive int, got {n_streams!r}")
    call = partial(fn, **kwargs) if kwargs else fn
    calls = list(zip(*args))
    device = _accelerator_device(args, kwargs)
    streams = [] if device is None else [
        accelerator.new_stream(device) for _ in range(min(n_streams, len(calls)))
    ]
    if not streams or streams[0] is None:  # no accelerator tensors, or a device without streams
        results = [call(*items) for items in calls]
    else:
        results = _run_on_streams(call, calls, streams, device)
    return tuple(map(list, zip(*results)))


def _accelerator_device(args, kwargs):
    """The device of the first accelerator tensor among the arguments, or None."""
    leaves, _ = compat.tree_flatten((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and accelerator.on_accelerator(leaf.device):
            return leaf.device
    return None


def _run_on_streams(call, calls, streams, device):
    current = accelerator.current_stream(device)
    for stream in streams:  # the inputs were produced on the current stream
        stream.wait_stream(current)
    results = []
    for k, items in enumerate(calls):
        with streams[k % len(streams)]:
            results.append(call(*items))
    for stream in streams:  # the caller's later work sees the results
        current.wait_stream(stream)
    # Outputs were allocated on the side streams but live on in the current one: tell the
    # caching allocator, or freeing one could hand its memory to the side stream too early.
    for leaf in compat.tree_flatten(results)[0]:
        if isinstance(leaf, torch.Tensor) and accelerator.on_accelerator(leaf.device):
            leaf.record_stream(current)
    return results
