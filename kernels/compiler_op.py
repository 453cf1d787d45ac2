"""How a kernel module declares its op to the graph compiler (``accrewrite.runtime.compile``),
next to its ``torch.library`` operator: a module-level ``COMPILER_OP = CompilerOp(...)``.

The compiler's registry imports every module of ``accrewrite.kernels`` and registers each
declared op: its patterns (found in a compiled graph as users write the op), inductor's code as
its default implementation, and the operator as its implementation "triton", which the selector
weighs against the default by the declared cost rule. A new kernel's compiler side is this one
declaration; the pattern matching, the selector and the report stay in the compiler.
"""

import dataclasses
import math
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Cost:
    """A cost rule's estimate: the implementation's time relative to the op's default
    implementation's (1.0), and why. ``math.inf``: the rule never picks it (not measured where
    it would pay, or known to be slower); kernels="accrewrite" or "autotune" still may."""

    relative: float
    reason: str


def never(reason: str) -> Cost:
    return Cost(math.inf, reason)


def left_to_inductor(args) -> Cost:
    """The cost rule of a pointwise kernel."""
    return never("pointwise: inductor fuses it into the neighbouring kernels")


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A subgraph that is the op ``op``: ``search`` written as users write it, traced with the
    example tensors ``inputs(dtype, requires_grad)`` and the example values ``scalars`` of its
    scalar arguments (values that occur nowhere else in the trace, which is how the matcher tells
    the argument from a constant). Its arguments, by name, are the op's.

    The matcher re-traces a pattern at each match's shapes and compares the sizes given to its
    views, which it cannot do where a size comes from a second symbolic dimension (it binds only
    the first as a graph input). A pattern with ``view_shapes`` leaves its views' sizes
    uncompared instead; ``view_shapes(args)`` gives the shapes the matched views must have, in
    graph order."""

    op: str
    search: Callable
    inputs: Callable
    scalars: dict = dataclasses.field(default_factory=dict)
    view_shapes: Callable | None = None


@dataclasses.dataclass(frozen=True)
class CompilerOp:
    """A kernel's op as the compiler knows it.

    ``name``: the op's name in the registry and the compile report. ``input``: the argument whose
    shape, dtype and device the choice goes by. ``reference``: the op in PyTorch by argument
    name (what autotuning times for the default). ``patterns``: where a graph computes it.
    ``kernel``: the op from its arguments by name, calling the kernel's operator. ``cost``: the
    kernel's rule for CUDA arguments; ``unsupported(args)``: why it cannot take them, or None.
    ``default``: why inductor's code, the default, is what it is."""

    name: str
    input: str
    reference: Callable
    patterns: tuple[Pattern, ...]
    kernel: Callable
    cost: Callable[[dict], Cost]
    unsupported: Callable[[dict], str | None] | None = None
    default: str = "inductor's code, fused with its neighbours"
