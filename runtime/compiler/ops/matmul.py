"""matmul: ``a @ b + bias`` as the graphs that inductor lowers have it, aten ``mm`` and
``addmm`` (a: (M, K), b: (K, N), bias: (N,) or None). Inductor calls ATen's GEMM for it, the
default; an ``addmm`` that scales its terms (alpha, beta) is left to it unlisted."""

import torch

from accrewrite.runtime.compiler.core.registry import (
    EVERY_DEVICE, FLOATS, Implementation, Op, register, same_cost,
)

_aten = torch.ops.aten


def reference(a, b, bias=None):
    return a @ b if bias is None else torch.addmm(bias, a, b)


def nodes(graph: torch.fx.Graph):
    """Each ``mm`` and unscaled ``addmm`` node with its argument nodes by name."""
    for node in graph.find_nodes(op="call_function", target=_aten.mm.default):
        yield node, {"a": node.args[0], "b": node.args[1], "bias": None}
    for node in graph.find_nodes(op="call_function", target=_aten.addmm.default):
        if not node.kwargs:
            bias, a, b = node.args
            yield node, {"a": a, "b": b, "bias": bias}


def _shape(args):
    return (*args["a"].shape, args["b"].shape[1])


register(Op("matmul", "a", reference, nodes=nodes, shape=_shape))
register(Implementation("matmul", "aten", EVERY_DEVICE, FLOATS, same_cost("ATen's GEMM")))
