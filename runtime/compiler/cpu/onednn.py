"""oneDNN's GEMM on the CPU: the implementation "onednn" of the op matmul (``ops/matmul.py``),
for the matmuls where it is faster than ATen's.

ATen runs a float32 ``mm``/``addmm`` on the CPU with MKL's sgemm, and so does inductor, which
calls ATen for matmuls. On AMD CPUs oneDNN's inner product (the kernel behind
``torch.ops.mkldnn._linear_pointwise``) is faster where the left operand is row-major: measured
on 2 Zen 4 cores at 2048 rows, a linear layer's forward and input gradient ran at 203-224
GFLOP/s on oneDNN vs 174-205 on MKL, with the bias added inside the GEMM instead of copied
into the output first. It was slower below 32 MFLOP (its call costs about 25 us) and with fewer
than 256 columns on either side of the product.

A weight gradient, ``dY^T @ X``, has a transposed left operand, which oneDNN reads only
row-major: handed the view, ATen copies it first (132-189 GFLOP/s with the copy, vs MKL's
178-194). With the copy made in the graph instead (``_onednn_matmul``), where inductor fuses it
into the kernel that computes ``dY`` or writes it in a tiled kernel, a compiled weight gradient
took 0.76-1.08x ATen's time (median 0.92x) over 15 shapes from 512 to 8192 rows with K and N of
at least 256, ``dY`` computed in the graph or an input of it; 1.08-1.20x under 32 MFLOP. That
is the rule of the other matmuls, which the weight gradients now follow too.

So its cost rule takes oneDNN's GEMM from 32 MFLOP with K and N of at least 256, on any CPU:
on Intel's, where MKL is the vendor's own GEMM, this is not measured, and kernels="autotune"
measures it instead of following the rule.
"""

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from accrewrite.runtime.compiler.core.custom_ops import define
from accrewrite.runtime.compiler.core.graph_insert import call
from accrewrite.runtime.compiler.core.registry import Cost, Implementation, never, register

_aten = torch.ops.aten
_MIN_COLUMNS = 256  # of K and of N, in an (M, K) @ (K, N) product
_MIN_FLOP = 1 << 25


def onednn_matmul(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b + bias`` (a: (M, K), b: (K, N), bias: (N,) or None) by oneDNN's inner product."""
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")


# Only compiled graphs call it, with no autograd to support. Inductor gives the op its operands in
# the stride order of their FX values: the row-major copies that the graph makes for oneDNN stay
# row-major (without the tag inductor lays out a copy as its input lies, which undoes it).
_ONEDNN = define(
    "onednn_matmul(Tensor a, Tensor b, Tensor? bias=None) -> Tensor",
    {"CPU": onednn_matmul},
    lambda a, b, bias=None: a.new_empty(a.shape[0], b.shape[1]),
    tags=(torch.Tag.needs_fixed_stride_order,),
).default


def _cost(args) -> Cost:
    (m, k), n = args["a"].shape, args["b"].shape[1]
    if min(k, n) < _MIN_COLUMNS:
        return never(f"slower than ATen's with K or N under {_MIN_COLUMNS}")
    # A symbolic M (batch x tokens under dynamic shapes) is not checked: where it turns out
    # small, oneDNN's call costs tens of microseconds more; where large, it is 10% faster.
    if isinstance(m, int) and 2 * m * k * n < _MIN_FLOP:
        return never(f"slower than ATen's under {_MIN_FLOP >> 20} MFLOP")
    return Cost(0.9, "oneDNN's GEMM: 6-16% faster than MKL's where measured (AMD CPUs)")


def _unsupported(args) -> str | None:
    """Why oneDNN's inner product cannot take ``a @ b + bias``, or None."""
    b, bias = args["b"], args["bias"]
    if bias is not None and bias.dtype != torch.float32:
        return f"bias {bias.dtype}, not float32"
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch is built without oneDNN"
    if not torch.backends.mkldnn.enabled:
        return "oneDNN is turned off (torch.backends.mkldnn.enabled)"
    if not all(isinstance(size, int) for size in b.shape):
        return "symbolic K or N"
    if 0 in b.shape:
        return "K or N is 0"
    if bias is not None and (bias.shape != b.shape[1:] or bias.stride() != (1,)):
        return f"bias {list(bias.shape)} is not a contiguous vector over the columns"
    return None


def _insert(graph: torch.fx.Graph, a, b, bias) -> torch.fx.Node:
    """Nodes computing ``a @ b + bias`` with ``accrewrite::onednn_matmul``; the last one gives
    the product.

    oneDNN reads its left operand row-major, and ATen copies one that is not
    (``Tensor.contiguous``): 1.1-1.4 ms for a transposed (2048, 768), hardly faster on 2
    threads than on 1. A weight gradient's left operand, ``dY^T`` in ``dY^T @ X``, is such a
    view, so the copy is made a node of the graph: inductor writes it in a tiled kernel of its
    own, or as a second output of the kernel that computes ``dY``. Of the two ways round, the one
    copying fewer elements: ``a`` itself (m x k), or ``b^T`` (n x k) and then the product,
    computed transposed as ``b^T @ a^T`` (m x n)."""
    a_val, b_val = a.meta["val"], b.meta["val"]
    if statically_known_true(a_val.stride(1) == 1):
        return call(graph, _ONEDNN, a, b, bias)
    (m, k), n = a_val.shape, b_val.shape[1]
    if bias is not None or statically_known_true(m * k <= n * k + m * n):
        return call(graph, _ONEDNN, _row_major(graph, a), b, bias)
    b_t = _row_major(graph, _transpose(graph, b))
    return _row_major(graph, _transpose(graph, call(graph, _ONEDNN, b_t, _transpose(graph, a))))


def _transpose(graph, x):
    return call(graph, _aten.permute.default, x, [1, 0])


def _row_major(graph, x):
    return call(graph, _aten.clone.default, x, memory_format=torch.contiguous_format)


# ATen runs bfloat16 matmuls on oneDNN already
register(Implementation("matmul", "onednn", ("cpu",), (torch.float32,), _cost, kernel=onednn_matmul,
                        insert=_insert, unsupported=_unsupported, ours=True))
