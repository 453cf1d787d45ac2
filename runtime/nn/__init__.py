"""Fused modules (TorchAcc's migration guide, "Kernel fusion optimizations" and, for DCN/DCNv2,
"Parallelized kernel optimizations"): the Triton path on CUDA tensors, the PyTorch reference
elsewhere; DCN/DCNv2 take torchvision's compiled kernel where it loads. Each name lives in the
submodule the guide imports it from, and is exported here by that submodule's ``__all__`` (a new
module is exported without an edit here). ``SyncBatchNorm`` is torch's, on every device the
runtime trains on."""

from accrewrite.base.lazy import lazy_attributes, submodule_attributes

__all__, __getattr__ = lazy_attributes(__name__, submodule_attributes(__path__))
