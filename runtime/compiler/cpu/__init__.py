"""Implementations for the CPU and what they are built with: accrewrite's C++ kernels
(``cpu_kernels.cpp``, built by ``cpu_kernels.py`` through ``cpp_library.py``, which also builds
inductor's kernels of a graph as one library per compile thread), causal attention
(``attention.py``), cross-entropy (``cross_entropy.py``), oneDNN's GEMM (``onednn.py``), and the
host memory cache (``host_memory.py``)."""
