"""Implementations for CUDA: the Triton kernels of ``accrewrite.kernels`` (``triton.py``, their
operators in ``triton_ops.py``) and causal attention (``attention.py``).

A new kernel is one new module here: its operator (``core.custom_ops.define``, with a fake
implementation for inductor) and ``registry.register(Implementation(op, name, ("cuda",),
dtypes, cost rule, kernel=..., unsupported=...))`` for an op of ``ops/``. The registry imports
the module, the selector weighs it against the op's other implementations, the compile report
names it where chosen, and inductor's cache key covers it."""
