"""``FusedLayerNorm``: a drop-in for ``torch.nn.LayerNorm`` that runs
``accrewrite.kernels.layer_norm`` (the Triton kernel on CUDA, ``F.layer_norm`` elsewhere).

It is a subclass of ``nn.LayerNorm``: the same constructor (``normalized_shape``, ``eps``,
``elementwise_affine``, ``bias``, ``device``, ``dtype``), the same parameter initialization and
state_dict keys, so it loads an ``nn.LayerNorm`` checkpoint and ``isinstance(m, nn.LayerNorm)``
still holds. One difference (as apex's FusedLayerNorm): the output has the input's dtype, also
when the parameters are float32 and the input bfloat16 under autocast, where ``nn.LayerNorm``
returns float32.
"""

import torch

from accrewrite.kernels.layer_norm import layer_norm

__all__ = ["FusedLayerNorm"]


class FusedLayerNorm(torch.nn.LayerNorm):
    """Layer normalization over the trailing ``normalized_shape`` dims, with a fused kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

