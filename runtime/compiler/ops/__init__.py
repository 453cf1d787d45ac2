"""The ops the compiler chooses kernels for that are not accrewrite's kernels (ATen's and
inductor's), one module each: how the op is found in a graph (patterns written as users write
it, or the aten nodes it is), its PyTorch reference and its default implementation, which
leaves the graph as it is. Their other implementations are in ``cpu/`` and ``cuda/``; the ops
of accrewrite's kernels are declared in the kernels' modules (``COMPILER_OP``)."""
