"""Implementations for CUDA: the Triton kernels of ``accrewrite.kernels`` (``triton.py``, their
operators in ``triton_ops.py``) and causal attention (``attention.py``)."""
