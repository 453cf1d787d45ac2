"""The Triton kernels as implementations "triton" of layer_norm, quick_gelu, bias_dropout_add
and swin_fmha (their operators: ``triton_ops.py``).

Off CUDA the operators run the kernels' PyTorch references, so the rules never pick them there;
kernels="accrewrite" still does, which is how their place in a graph is tested on the CPU. The
CUDA rules are heuristics to be tuned with benchmarks/kernels.py (or kernels="autotune") on the
target GPU: an operator is opaque to inductor, so it only pays where the hand-written kernel
beats inductor's code by more than the fusion it prevents.
"""

import functools

import torch

from accrewrite.kernels.dispatch import triton_available
from accrewrite.runtime.compiler.core.registry import FLOATS, Cost, Implementation, never, register
from accrewrite.runtime.compiler.cuda import triton_ops

_LAYER_NORM_MIN_HIDDEN = 4096
# swin_fmha holds each row of N scores in registers and sums the relative position bias's
# gradient over the windows inside its backward, where inductor runs a reduction of its own over
# the whole gradient: that should pay where many windows (images * windows per image) share the
# bias and rows are short (Swin's windows have 7x7 to 12x12 tokens).
_SWIN_FMHA_MIN_WINDOWS = 512
_SWIN_FMHA_MAX_TOKENS = 256


def _rule(rule, input_name: str):
    """``rule`` (CUDA shapes -> Cost) as a cost rule for every device."""

    def cost(args):
        x = args[input_name]
        if x.device.type != "cuda":
            return never(f"on {x.device.type} the kernel is its PyTorch reference")
        return rule(args)

    return cost


def _triton_missing(input_name: str, unsupported=None):
    """``unsupported`` for a kernel, and on CUDA "triton is not installed" where it is not."""

    def check(args):
        x = args[input_name]
        if x.device.type == "cuda" and not triton_available():
            return "triton is not installed"
        return unsupported(args) if unsupported else None

    return check


def _layer_norm_cost(args) -> Cost:
    hidden = args["x"].shape[-1]
    if hidden >= _LAYER_NORM_MIN_HIDDEN:
        return Cost(0.9, f"hidden size {hidden} >= {_LAYER_NORM_MIN_HIDDEN}")
    return never(f"hidden size {hidden} < {_LAYER_NORM_MIN_HIDDEN}")


def _pointwise_cost(args) -> Cost:
    # bias_dropout_add too: inductor draws its dropout mask inside the fused kernel as well
    return never("pointwise: inductor fuses it into the neighbouring kernels")


def _swin_fmha_cost(args) -> Cost:
    windows, tokens = args["attn"].shape[0], args["attn"].shape[-1]
    reason = (
        f"{windows} windows of {tokens} tokens; the kernel takes >= {_SWIN_FMHA_MIN_WINDOWS} "
        f"windows of <= {_SWIN_FMHA_MAX_TOKENS} tokens"
    )
    fits = windows >= _SWIN_FMHA_MIN_WINDOWS and tokens <= _SWIN_FMHA_MAX_TOKENS
    return Cost(0.9, reason) if fits else never(reason)


def _bias_dropout_add_unsupported(args):
    x, bias, residual = args["x"], args.get("bias"), args["residual"]
    if residual.shape != x.shape:
        return f"residual {list(residual.shape)} is broadcast to x {list(x.shape)}"
    if bias is not None and bias.shape != x.shape[-1:]:
        return f"bias {list(bias.shape)} is not over x's last dimension only"
    return None


def _swin_fmha_unsupported(args):
    attn, bias, mask = args["attn"], args["relative_pos_bias"], args.get("attn_mask")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        return f"attn {list(attn.shape)} is not (windows, heads, N, N)"
    if bias.shape != attn.shape[1:]:
        return f"relative_pos_bias {list(bias.shape)} is not (heads, N, N)"
    if mask is not None and (mask.dim() != 3 or mask.shape[1:] != attn.shape[2:]):
        return f"attn_mask {list(mask.shape)} is not (windows per image, N, N)"
    return None


def _layer_norm(x, weight, bias, eps):
    return triton_ops.layer_norm(x, weight, bias, eps)


def _bias_dropout_add(x, residual, p, bias=None):
    # The seed is drawn by the graph, at every call and on x's device (see triton_ops).
    seed = torch.randint(2**31 - 1, (), device=x.device)
    return triton_ops.bias_dropout_add(x, bias, residual, p, seed)


def _swin_fmha(attn, relative_pos_bias, attn_mask=None):
    # Eager Swin adds in the promoted dtype (under autocast a bf16 attn plus the fp32 bias gives
    # fp32 probabilities), the kernel in fp32 returning attn's dtype: give it the promoted one.
    dtypes = [t.dtype for t in (attn, relative_pos_bias, attn_mask) if t is not None]
    attn = attn.to(functools.reduce(torch.promote_types, dtypes))
    return triton_ops.swin_fmha(attn, relative_pos_bias, attn_mask)


_DEVICES = ("cuda", "cpu")
register(Implementation(
    "layer_norm", "triton", _DEVICES, FLOATS, _rule(_layer_norm_cost, "x"), kernel=_layer_norm,
    unsupported=_triton_missing("x"), ours=True,
))
register(Implementation(
    "quick_gelu", "triton", _DEVICES, FLOATS, _rule(_pointwise_cost, "x"),
    kernel=triton_ops.quick_gelu, unsupported=_triton_missing("x"), ours=True,
))
register(Implementation(
    "bias_dropout_add", "triton", _DEVICES, FLOATS, _rule(_pointwise_cost, "x"),
    kernel=_bias_dropout_add, unsupported=_triton_missing("x", _bias_dropout_add_unsupported),
    ours=True,
))
register(Implementation(
    "swin_fmha", "triton", _DEVICES, FLOATS, _rule(_swin_fmha_cost, "attn"), kernel=_swin_fmha,
    unsupported=_triton_missing("attn", _swin_fmha_unsupported), ours=True,
))
