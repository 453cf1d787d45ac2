"""quick_gelu: CLIP's ``x * sigmoid(1.702 * x)``."""

import torch

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register


def reference(x):
    return x * torch.sigmoid(1.702 * x)


def _inputs(dtype, grad):
    return [torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad)]


register(Op("quick_gelu", "x", reference, patterns=(Pattern("quick_gelu", reference, _inputs),)))
register(inductors_code("quick_gelu"))
