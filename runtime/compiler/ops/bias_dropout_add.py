"""bias_dropout_add: ``residual + dropout(x + bias, p)``, and without a bias.

Patterns with a bias and without (a Linear's bias is inside its matmul: most models write
residual + dropout(proj(h))), and with the residual on either side of the sum (the matcher does
not take the sum as commutative); with its bias first, so that a match is the longest one. The
residual is traced without a gradient: its gradient is the incoming one, which the pattern then
need not contain, so it matches either way.
"""

import torch
import torch.nn.functional as F

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register


def reference(x, residual, p, bias=None):
    return residual + F.dropout(x if bias is None else x + bias, p, training=True)


def _dropout_add_search(residual_first: bool):
    def search(x, residual, p):
        dropped = F.dropout(x, p, training=True)
        return residual + dropped if residual_first else dropped + residual

    return search


def _bias_dropout_add_search(residual_first: bool):
    dropout_add = _dropout_add_search(residual_first)

    def search(x, bias, residual, p):
        return dropout_add(x + bias, residual, p)

    return search


def _dropout_add_inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(2, 3, 8, dtype=dtype),
    ]


def _bias_dropout_add_inputs(dtype, grad):
    x, residual = _dropout_add_inputs(dtype, grad)
    return [x, torch.empty(8, dtype=dtype, requires_grad=grad), residual]


register(Op("bias_dropout_add", "x", reference, patterns=tuple(
    Pattern("bias_dropout_add", search(residual_first), inputs, scalars={"p": 0.113377})
    for search, inputs in (
        (_bias_dropout_add_search, _bias_dropout_add_inputs),
        (_dropout_add_search, _dropout_add_inputs),
    )
    for residual_first in (True, False)
)))
register(inductors_code(
    "bias_dropout_add", "inductor's code, the mask drawn inside its fused kernel"
))
