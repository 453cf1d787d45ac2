"""``QuickGelu``: ``x * sigmoid(1.702 x)``, the module TorchAcc's migration guide puts in place of ``nn.GELU``.

It is not GELU (it differs by up to about 0.02), which is why the codemod's ACC022 is an unsafe
fix. Runs ``accrewrite.kernels.quick_gelu``: the Triton kernel on CUDA, PyTorch elsewhere.
"""

import torch

from accrewrite.kernels.quick_gelu import quick_gelu

__all__ = ["QuickGelu"]


class QuickGelu(torch.nn.Module):
    """``x * sigmoid(1.702 x)``, elementwise.

    ``approximate`` is accepted so that ``nn.GELU(approximate=...)`` call sites can be replaced
    as they are; it does not change the function.
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(
                f"QuickGelu: approximate must be 'none' or 'tanh', got {approximate!r}"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return quick_gelu(input)
