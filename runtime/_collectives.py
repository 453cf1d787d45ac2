"""Bucketed all-reduce over torch.distributed (what ``xm.all_reduce`` runs with several processes).

Many small tensors (a model's gradients) are flattened into buckets of at most
``bucket_cap_mb`` megabytes per device and dtype, one collective is issued per bucket, and the
reduced values are copied back. All buckets are launched asynchronously before the first is
waited for, so flattening the next bucket overlaps the communication of the previous one.

Wire compression: floating-point tensors wider than the chosen wire dtype (float32, float64)
travel as bfloat16 or float16 and are cast back after the reduction; the result loses the wire
dtype's precision. It is selected by the ``compress`` argument of ``xm.all_reduce`` /
``xm.reduce_gradients`` (``"bf16"``, ``"fp16"``, a torch dtype, or ``"none"``) and otherwise by
the environment variable ``ACCREWRITE_ALLREDUCE_DTYPE`` (same values; default none). float16
has a narrow range: a scaled AMP gradient can overflow to inf there, which the GradScaler then
treats as an overflow step. Compression pays where the wire is the bottleneck (NCCL between
machines); gloo on the CPU reduces bf16/fp16 more slowly than float32, so it is off by default
(benchmarks/allreduce_bucketing.py measures it). The bucket size comes from the ``bucket_cap_mb`` argument or
``ACCREWRITE_BUCKET_MB`` (default 25, as DistributedDataParallel).
"""

import os
from types import MappingProxyType

import torch
import torch.distributed as dist

COMPRESS_ENV = "ACCREWRITE_ALLREDUCE_DTYPE"
BUCKET_MB_ENV = "ACCREWRITE_BUCKET_MB"
DEFAULT_BUCKET_MB = 25.0

_WIRE_DTYPES = MappingProxyType({
    "none": None,
    "": None,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
})


def wire_dtype(compress=None):
    """The compression dtype (None: no compression) chosen by ``compress``, or by the
    environment when ``compress`` is None."""
    source = "compress"
    if compress is None:
        compress, source = os.environ.get(COMPRESS_ENV, "none"), COMPRESS_ENV
    if isinstance(compress, torch.dtype):
        if compress in (torch.bfloat16, torch.float16):
            return compress
    elif str(compress).strip().lower() in _WIRE_DTYPES:
        return _WIRE_DTYPES[str(compress).strip().lower()]
    raise ValueError(
        f"{source}={compress!r}: unknown all-reduce wire dtype; expected bf16, fp16 or none"
    )


def bucket_cap_bytes(bucket_cap_mb=None) -> int:
    """The bucket size in bytes from the argument or ``ACCREWRITE_BUCKET_MB``."""
    value = bucket_cap_mb if bucket_cap_mb is not None else os.environ.get(BUCKET_MB_ENV)
    try:
        megabytes = DEFAULT_BUCKET_MB if value is None else float(value)
    except ValueError:
        raise ValueError(f"{BUCKET_MB_ENV}={value!r}: expected a number of megabytes") from None
    if megabytes <= 0:
        raise ValueError(f"all-reduce bucket size must be positive, got {megabytes} MB")
    return int(megabytes * 1024 * 1024)


def make_buckets(tensors, cap_bytes):
    """Split ``tensors`` into lists sharing device and dtype, each at most ``cap_bytes`` in total
    (a tensor larger than the cap gets a bucket of its own). Order is kept within a bucket."""
    open_buckets = {}  # (device, dtype) -> (bucket, bytes so far)
    buckets = []
    for tensor in tensors:
        key = (tensor.device, tensor.dtype)
        size = tensor.numel() * tensor.element_size()
        bucket, used = open_buckets.get(key, (None, 0))
        if bucket is None or used + size > cap_bytes:
            bucket, used = [], 0
            buckets.append(bucket)
        bucket.append(tensor)
        open_buckets[key] = (bucket, used + size)
    return buckets


def all_reduce_(tensors, op, factor, group, compress_dtype, cap_bytes):
    """All-reduce ``tensors`` in place with ``op`` over ``group``, then multiply by ``factor``.

    One collective per bucket. ``factor`` is applied after the reduction (torch_xla applies
    ``scale`` to the reduced value).
    """
    pending = []
    for bucket in make_buckets(tensors, cap_bytes):
        dtype = bucket[0].dtype
        compress = (
            compress_dtype is not None
            and dtype.is_floating_point
            and torch.finfo(dtype).bits > torch.finfo(compress_dtype).bits
        )
        if len(bucket) == 1 and bucket[0].is_contiguous() and not compress:
            flat = bucket[0]  # reduce in place, nothing to copy back
        else:
            flat = torch.cat([t.reshape(-1) for t in bucket])
            if compress:
                flat = flat.to(compress_dtype)
        pending.append((bucket, flat, dist.all_reduce(flat, op=op, group=group, async_op=True)))
    for bucket, flat, work in pending:
        work.wait()
        if flat.dtype != bucket[0].dtype:
            flat = flat.to(bucket[0].dtype)
        if factor != 1.0:
            flat.mul_(factor)
        if flat is bucket[0]:
            continue
        offset = 0
        for tensor in bucket:
            numel = tensor.numel()
            tensor.copy_(flat[offset : offset + numel].view_as(tensor))
            offset += numel
