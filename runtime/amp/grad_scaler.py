"""``GradScaler``: PyTorch's loss scaler on the runtime device, with torch_xla's signature.

It is ``torch.amp.GradScaler``: with an optimizer that declares
``_step_supports_amp_scaling`` (the ``syncfree`` ones) ``scaler.step`` hands the optimizer the
scale and the overflow flag as tensors and never reads them on the host; with any other
optimizer it checks the flag on the host, as PyTorch does.

Gradients all-reduced in place between ``scaler.scale(loss).backward()`` and
``unscale_``/``step`` (the order of TorchAcc's migration guide) are what the scaler checks:
every rank then sees the same reduced gradients, finds the same overflow and skips the same
steps, so the replicas stay identical. An overflow on one rank becomes inf/nan on all ranks through the sum.
"""

import torch

from .autocast_mode import device_type


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, device=None):
        super().__init__(
            device_type(device),
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
