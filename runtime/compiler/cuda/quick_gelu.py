"""quick_gelu's Triton kernel (``accrewrite.kernels.quick_gelu``) as its implementation "triton"."""

from accrewrite.kernels.quick_gelu import quick_gelu_op
from accrewrite.runtime.compiler.core.registry import register
from accrewrite.runtime.compiler.core.triton_kernels import left_to_inductor, triton_implementation

register(triton_implementation("quick_gelu", "x", quick_gelu_op, left_to_inductor))
