"""Fused dropout + residual add with the call signatures of TorchAcc's migration guide::

    if self.training:
        x = dropout_add_fused_train(x, to_add, drop_rate)   # to_add + dropout(x, drop_rate)
    else:
        x = dropout_add_fused(x, to_add, drop_rate)         # to_add + x

``x`` is the branch output that dropout applies to and ``to_add`` the residual it is added to
(the argument order of Megatron's and HF Falcon's ``dropout_add(x, residual, prob)``). Runs
``accrewrite.kernels.bias_dropout_add`` without a bias: on CUDA the Triton kernel, whose mask comes
from its own Philox stream (hence the codemod's ACC023 is an unsafe fix), elsewhere torch's
dropout.
"""

import torch

from accrewrite.kernels.bias_dropout_add import bias_dropout_add

__all__ = ["dropout_add_fused_train", "dropout_add_fused"]


def dropout_add_fused_train(
    x: torch.Tensor, to_add: torch.Tensor, drop_rate: float
) -> torch.Tensor:
    """Training mode: ``to_add + dropout(x, drop_rate)``."""
    return bias_dropout_add(x, None, to_add, drop_rate, training=True)


def dropout_add_fused(x: torch.Tensor, to_add: torch.Tensor, drop_rate: float) -> torch.Tensor:
    """Inference mode: dropout is the identity, so ``to_add + x`` (``drop_rate`` is only
    checked)."""
    return bias_dropout_add(x, None, to_add, drop_rate, training=False)
