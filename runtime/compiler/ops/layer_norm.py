"""layer_norm: ``F.layer_norm`` over the last dimension, with a weight and a bias."""

import torch
import torch.nn.functional as F

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register


def reference(x, weight, bias, eps):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
    ]


register(Op("layer_norm", "x", reference,
            patterns=(Pattern("layer_norm", reference, _inputs, scalars={"eps": 1e-5}),)))
register(inductors_code("layer_norm"))
