"""accrewrite's C++ kernels for the CPU (``cpu_kernels.cpp``): causal attention
(``attention.py``) and cross-entropy (``cross_entropy.py``), in float32.

They are built from ``cpu_kernels.cpp`` as inductor builds its own kernels (``cpp_library``):
its compiler flags, precompiled header and on-disk cache; 2-3 s once per machine, then a load.
Each module that uses them checks once that they run here (its ``unavailable``), so that the
kernel-selection pass keeps inductor's code where they cannot be built or run.
"""

import functools
import logging
import pathlib
from types import MappingProxyType

from torch import Tensor

from accrewrite.runtime.compiler.cpu import cpp_library

log = logging.getLogger(__name__)

# each C function of cpu_kernels.cpp with its argument types (pointers take tensors)
FUNCTIONS = MappingProxyType({
    "accrewrite_attention_forward":
        ["const float*"] * 3 + ["float*"] * 2 + ["const int64_t*"] + ["int64_t"] * 4
        + ["float", "int64_t", "int64_t"],
    "accrewrite_attention_backward":
        ["const float*"] * 6 + ["float*"] * 3 + ["const int64_t*"] + ["int64_t"] * 4
        + ["float", "int64_t", "int64_t"],
    "accrewrite_cross_entropy_forward":
        ["const float*", "const int64_t*", "float*", "float*"] + ["int64_t"] * 5,
    "accrewrite_cross_entropy_backward":
        ["const float*", "const float*", "const int64_t*", "const float*"] + ["float*"] * 3
        + ["int64_t"] * 5,
})


@functools.cache
def library():
    """The built kernels: a module with a function for each of ``FUNCTIONS``."""
    source = pathlib.Path(__file__).with_name("cpu_kernels.cpp").read_text()
    return cpp_library.load_functions(source, FUNCTIONS)


def why_unavailable(kernel: str, trial) -> str | None:
    """Why ``trial()``, a run of ``kernel`` on a small problem (which builds or loads the
    library first), fails in this process, or None."""
    try:
        trial()
    except Exception as error:  # noqa: BLE001 - no compiler, oneDNN's micro-kernel missing, ...
        log.warning("accrewrite's CPU %s kernel is unavailable: %s", kernel, error)
        return f"{type(error).__name__}: {error}"
    return None


def contiguous_rows(x: Tensor) -> Tensor:
    """x with a contiguous last dimension: the kernels read rows, whatever their stride."""
    return x if x.stride(-1) == 1 else x.contiguous()
