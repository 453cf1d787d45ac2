"""accrewrite's C++ kernels for the CPU (``cpu_kernels.cpp``): causal attention
(``attention.py``) and cross-entropy (``cross_entropy.py``), in float32.

They are built from ``cpu_kernels.cpp`` as inductor builds its own kernels (``cpp_library``):
its compiler flags, precompiled header and on-disk cache; 2-3 s once per machine, then a load.
Each module that uses them checks once that they run here (its ``unavailable``), so that the
kernel-selection pass keeps inductor's code where they cannot be built or run.
"""

import functools
import pathlib

from accrewrite.runtime.compiler import cpp_library

# each C function of cpu_kernels.cpp with its argument types (pointers take tensors)
FUNCTIONS = {
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
}


@functools.cache
def library():
    """The built kernels: a module with a function for each of ``FUNCTIONS``."""
    source = pathlib.Path(__file__).with_name("cpu_kernels.cpp").read_text()
    return cpp_library.load_functions(source, FUNCTIONS)
