"""Matmul selection on the CPU: oneDNN's GEMM for the matmuls where it is faster than ATen's.

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

So this pass, inductor's ``post_grad_custom_post_pass``, runs on each forward, backward and
inference graph as inductor is about to lower it, and chooses for each float32 ``mm`` and
``addmm`` on the CPU between ATen's kernel and ``accrewrite::onednn_matmul``. On other CPUs
(Intel's, where MKL is the vendor's own GEMM) "auto" keeps ATen's: not measured here. Every
matmul is listed in the compile report with its choice and the reason.
"""

import functools

import torch
from torch import Tensor
from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass, get_hash_for_files
from torch.fx.experimental.symbolic_shapes import statically_known_true

from accrewrite.runtime.compiler import graph_nodes
from accrewrite.runtime.compiler.graph_nodes import call
from accrewrite.runtime.compiler.kernel_selection import KernelMatch

_aten = torch.ops.aten
_MIN_COLUMNS = 256  # of K and of N, in an (M, K) @ (K, N) product
_MIN_FLOP = 1 << 25


# Defined on a Library, not with torch.library.custom_op: only compiled graphs call it (with no
# autograd to support), and custom_op's wrapper cost 100-220 us more per call at (2048, 256) @
# (256, 768) in three runs, 3-5% of the GEMM.
_library = torch.library.Library("accrewrite", "FRAGMENT")
# Inductor gives the op its operands in the stride order of their FX values: the row-major copies
# that this pass makes for oneDNN stay row-major (without the tag inductor lays out a copy as its
# input lies, which undoes it).
_library.define(
    "onednn_matmul(Tensor a, Tensor b, Tensor? bias=None) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)
_ONEDNN = torch.ops.accrewrite.onednn_matmul.default


def onednn_matmul(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b + bias`` (a: (M, K), b: (K, N), bias: (N,) or None) by oneDNN's inner product."""
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")


_library.impl("onednn_matmul", onednn_matmul, "CPU")


@torch.library.register_fake("accrewrite::onednn_matmul", lib=_library)
def _(a, b, bias=None):
    return a.new_empty(a.shape[0], b.shape[1])


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor id ("AuthenticAMD", "GenuineIntel"), or "" where it is not known."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def choose(a, b, bias, policy: str) -> tuple[str, str]:
    """ATen's kernel ("inductor") or oneDNN's ("accrewrite") for ``a @ b + bias`` (fake tensors;
    bias may be None) under ``policy`` (the ``kernels`` option), and why."""
    if policy == "inductor":
        return "inductor", "kernels='inductor'"
    unfit = _unfit(a, b, bias)
    if unfit:
        return "inductor", f"oneDNN's kernel does not take it: {unfit}"
    if policy == "accrewrite":
        return "accrewrite", "kernels='accrewrite'"
    if cpu_vendor() != "AuthenticAMD":
        return "inductor", f"ATen's GEMM (MKL) on a {cpu_vendor() or 'CPU of unknown vendor'}"
    (m, k), n = a.shape, b.shape[1]
    if min(k, n) < _MIN_COLUMNS:
        return "inductor", f"ATen's GEMM: oneDNN is slower with K or N under {_MIN_COLUMNS}"
    # A symbolic M (batch x tokens under dynamic shapes) is not checked: where it turns out
    # small, oneDNN's call costs tens of microseconds more; where large, it is 10% faster.
    if isinstance(m, int) and 2 * m * k * n < _MIN_FLOP:
        return "inductor", f"ATen's GEMM: oneDNN is slower under {_MIN_FLOP >> 20} MFLOP"
    return "accrewrite", "oneDNN's GEMM: faster than MKL's on AMD CPUs"


def _unfit(a, b, bias) -> str | None:
    """Why oneDNN's inner product cannot take ``a @ b + bias``, or None."""
    tensors = [t for t in (a, b, bias) if t is not None]
    if any(t.dtype != torch.float32 for t in tensors):
        return f"{a.dtype}, not float32 (ATen runs bfloat16 matmuls on oneDNN already)"
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


def _onednn_matmul(graph: torch.fx.Graph, a, b, bias) -> torch.fx.Node:
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


class MatmulSelectionPass(CustomInferenceAwareGraphPass):
    """Inductor's ``post_grad_custom_post_pass``: each float32 ``mm``/``addmm`` on the CPU gets
    the kernel that ``choose`` gives; the matmuls found are appended to ``matches``."""

    def __init__(self, policy: str, matches: list):
        self.policy = policy
        self.matches = matches

    def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
        for node in [*graph.find_nodes(op="call_function", target=_aten.mm.default),
                     *graph.find_nodes(op="call_function", target=_aten.addmm.default)]:
            bias, a, b = node.args if node.target is _aten.addmm.default else (None, *node.args)
            a_val, b_val = a.meta["val"], b.meta["val"]
            if a_val.device.type != "cpu":
                continue
            if node.kwargs:  # addmm's alpha and beta
                choice, reason = "inductor", f"addmm with {dict(node.kwargs)}"
            else:
                bias_val = None if bias is None else bias.meta["val"]
                choice, reason = choose(a_val, b_val, bias_val, self.policy)
            self.matches.append(KernelMatch(
                "matmul", (*a_val.shape, b_val.shape[1]), a_val.dtype, "cpu",
                not is_inference, choice, reason,
            ))
            if choice == "accrewrite":
                with graph.inserting_before(node):
                    replacement = _onednn_matmul(graph, a, b, bias)
                replacement.meta.update(node.meta)
                node.replace_all_uses_with(replacement)
                graph.erase_node(node)

    def uuid(self):
        # Part of inductor's cache key: the code, the policy and what "auto" depends on.
        return get_hash_for_files((__file__, graph_nodes.__file__)), self.policy, cpu_vendor()
