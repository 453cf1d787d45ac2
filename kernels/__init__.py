"""Triton kernels with their PyTorch references (see docs/design.md, "Kernels")."""
