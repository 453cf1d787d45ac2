"""layer_norm's Triton kernel (``accrewrite.kernels.layer_norm``) as its implementation "triton"."""

from accrewrite.kernels.layer_norm import layer_norm_op
from accrewrite.runtime.compiler.core.registry import Cost, never, register
from accrewrite.runtime.compiler.core.triton_kernels import triton_implementation

_MIN_HIDDEN = 4096


def _cost(args) -> Cost:
    hidden = args["x"].shape[-1]
    if hidden >= _MIN_HIDDEN:
        return Cost(0.9, f"hidden size {hidden} >= {_MIN_HIDDEN}")
    return never(f"hidden size {hidden} < {_MIN_HIDDEN}")


def _layer_norm(x, weight, bias, eps):
    return layer_norm_op(x, list(x.shape[-1:]), weight, bias, eps)[0]


register(triton_implementation("layer_norm", "x", _layer_norm, _cost))
