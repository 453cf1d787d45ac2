"""Implementations for CUDA: accrewrite's Triton kernels (``triton_kernels.py``, which registers
the op each module of ``accrewrite.kernels`` declares) and causal attention (``attention.py``).

A new kernel's compiler side is its ``COMPILER_OP`` declaration
(``accrewrite.kernels.compiler_op``), in its own module: the registry finds it by itself. The selector weighs the kernel against the
op's other implementations, the compile report names it where chosen, and inductor's cache key
covers the kernel's module."""
