"""Fused modules (TorchAcc's migration guide, "Kernel fusion optimizations" and, for DCN/DCNv2,
"Parallelized kernel optimizations"): the Triton path on CUDA tensors, the PyTorch reference
elsewhere; DCN/DCNv2 take torchvision's compiled kernel where it loads. Each name lives in the
submodule the guide imports it from. ``SyncBatchNorm`` is torch's, on every device the runtime
trains on."""

from accrewrite.base.lazy import lazy_attributes

__all__, __getattr__ = lazy_attributes(__name__, {
    "FusedLayerNorm": "layer_norm:FusedLayerNorm",
    "QuickGelu": "quick_gelu:QuickGelu",
    "dropout_add_fused_train": "dropout_add:dropout_add_fused_train",
    "dropout_add_fused": "dropout_add:dropout_add_fused",
    "WindowProcess": "window_process:WindowProcess",
    "WindowProcessReverse": "window_process:WindowProcessReverse",
    "FusedSwinFmha": "fmha:FusedSwinFmha",
    "nms": "nms:nms",
    "nms_normal": "nms:nms_normal",
    "soft_nms": "nms:soft_nms",
    "batched_soft_nms": "nms:batched_soft_nms",
    "DCN": "dcn_v2:DCN",
    "DCNv2": "dcn_v2:DCNv2",
    "dcn_v2_conv": "dcn_v2:dcn_v2_conv",
    "SyncBatchNorm": "sync_batch_norm:SyncBatchNorm",
    "deform_conv2d": "dcn_v2:deform_conv2d",
})
