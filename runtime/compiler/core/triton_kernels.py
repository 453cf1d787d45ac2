"""How one of accrewrite's Triton kernels (``accrewrite.kernels``) becomes the implementation
"triton" of an op: ``triton_implementation``, called by the kernel's own module in ``cuda/``.

The kernel is its ``torch.library`` operator, the one that eager code calls too. Off CUDA the
operator runs the kernel's PyTorch reference, so the cost rules never pick it there;
kernels="accrewrite" still does, which is how its place in a graph is tested on the CPU. The
CUDA rules are heuristics to be tuned with benchmarks/kernels.py (or kernels="autotune") on the
target GPU: an operator is opaque to inductor, so it only pays where the hand-written kernel
beats inductor's code by more than the fusion it prevents.
"""

from collections.abc import Callable

from accrewrite.kernels.dispatch import triton_available
from accrewrite.runtime.compiler.core.registry import FLOATS, Cost, Implementation, never


def triton_implementation(
    op: str,
    input_name: str,
    kernel: Callable,
    cost: Callable[[dict], Cost],
    unsupported: Callable[[dict], str | None] | None = None,
) -> Implementation:
    """The implementation "triton" of ``op``: ``kernel`` (the op from its arguments by name,
    calling the kernel's operator), ``cost`` (its rule for CUDA arguments) and ``unsupported``
    (the arguments it cannot take, beyond a missing triton); ``input_name``: the argument whose
    device decides."""

    def cost_anywhere(args):
        x = args[input_name]
        if x.device.type != "cuda":
            return never(f"on {x.device.type} the kernel is its PyTorch reference")
        return cost(args)

    def why_not(args):
        if args[input_name].device.type == "cuda" and not triton_available():
            return "triton is not installed"
        return unsupported(args) if unsupported else None

    return Implementation(op, "triton", ("cuda", "cpu"), FLOATS, cost_anywhere, kernel=kernel,
                          unsupported=why_not, ours=True)


def left_to_inductor(args) -> Cost:
    """The cost rule of a pointwise kernel."""
    return never("pointwise: inductor fuses it into the neighbouring kernels")
