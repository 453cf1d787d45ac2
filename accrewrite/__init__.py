"""accrewrite: migrate PyTorch CUDA training scripts and run them accelerated."""

__version__ = "0.1.0"
