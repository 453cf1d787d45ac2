"""Triton kernels with their PyTorch references (see DESIGN.md, "Kernels")."""
