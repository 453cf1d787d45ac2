"""The ops the compiler chooses kernels for, one module each: how the op is found in a graph
(patterns written as users write it, or the aten nodes it is), its PyTorch reference and its
default implementation, which leaves the graph as it is. The other implementations are in
``cpu/`` and ``cuda/``."""
