"""Which implementation a kernel call takes: the Triton kernel or the PyTorch reference.

Tensors on a GPU that Triton compiles for (CUDA, XPU: ``accelerator.supports_triton``) take the
Triton kernel and everything else the reference. The environment variable
``ACCREWRITE_KERNELS`` overrides that: ``reference`` forces the reference everywhere (to rule a
kernel out when chasing a numerical difference), ``triton`` forces the kernel everywhere (the
tests use it with ``TRITON_INTERPRET=1`` to run the kernels on the CPU).
"""

import functools
import os

import torch

from accrewrite.base import accelerator

MODE_ENV = "ACCREWRITE_KERNELS"
_MODES = ("auto", "reference", "triton")


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto") or "auto"
    if value not in _MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(_MODES)}")
    return value


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(*tensors) -> bool:
    """True when a kernel called on ``tensors`` should run its Triton implementation."""
    chosen = mode()
    if chosen == "reference":
        return False
    if chosen == "triton":
        if not triton_available():
            raise RuntimeError(f"{MODE_ENV}=triton but triton is not installed: pip install triton")
        return True
    return triton_available() and all(accelerator.supports_triton(t.device) for t in tensors)


# The floating dtypes the elementwise and normalisation kernels compute (in float32 inside);
# float64 takes the reference, which keeps its precision.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
