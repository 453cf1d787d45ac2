"""Implementations for CUDA: one module per Triton kernel of ``accrewrite.kernels``
(``layer_norm.py``, ``quick_gelu.py``, ``bias_dropout_add.py``, ``swin_fmha.py``) and causal
attention (``attention.py``).

A new kernel's compiler side is one new module here, which the registry imports by itself: it
calls ``register(core.triton_kernels.triton_implementation(op, input, kernel, cost rule))``,
where ``kernel`` calls the kernel's ``torch.library`` operator (the one eager code calls), for
an op of ``ops/``; a kernel for an op that the compiler does not know yet registers that ``Op``
(its patterns) and its default ``inductors_code`` in the same module. The selector weighs it
against the op's other implementations, the compile report names it where chosen, and
inductor's cache key covers the module."""
