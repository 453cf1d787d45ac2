"""accrewrite's Triton kernels (``accrewrite.kernels``) as implementations: each kernel module
that declares a ``COMPILER_OP`` (``accrewrite.kernels.compiler_op``) registers, on import of
this module, that op with its patterns, inductor's code as its default and the kernel as its
implementation "triton" (``triton_implementation``).

The kernel is its ``torch.library`` operator, the one that eager code calls too. Off CUDA the
operator runs the kernel's PyTorch reference, so the cost rules never pick it there;
kernels="accrewrite" still does, which is how its place in a graph is tested on the CPU. The
CUDA rules are heuristics to be tuned with benchmarks/kernels.py (or kernels="autotune") on the
target GPU: an operator is opaque to inductor, so it only pays where the hand-written kernel
beats inductor's code by more than the fusion it prevents.
"""

import importlib
import pkgutil
from collections.abc import Callable

import accrewrite.kernels
from accrewrite.kernels.compiler_op import CompilerOp
from accrewrite.kernels.dispatch import triton_available
from accrewrite.runtime.compiler.core.registry import (
    FLOATS, Cost, Implementation, Op, inductors_code, never, register,
)


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


def declared_ops() -> list[tuple[CompilerOp, str]]:
    """Each op that a module of ``accrewrite.kernels`` declares, with the module's file."""
    found = []
    for info in pkgutil.iter_modules(accrewrite.kernels.__path__):
        module = importlib.import_module(f"accrewrite.kernels.{info.name}")
        if isinstance(getattr(module, "COMPILER_OP", None), CompilerOp):
            found.append((module.COMPILER_OP, module.__file__))
    return found


def register_declared(op: CompilerOp, source: str) -> None:
    register(Op(op.name, op.input, op.reference, patterns=op.patterns), source)
    register(inductors_code(op.name, op.default), source)
    register(triton_implementation(op.name, op.input, op.kernel, op.cost, op.unsupported), source)


for _op, _source in declared_ops():
    register_declared(_op, _source)
