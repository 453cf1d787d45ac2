"""The registry of kernel implementations, RAF's operator dialects: for each op, every
implementation that can run it, each with the devices, dtypes and shapes it takes and a cost rule.

An op says how the compiler finds it in a graph (patterns written as users write the op, or
the aten nodes it is) and which implementation leaves the graph as it is (inductor's generated
code, or the ATen kernel that inductor calls). Every other implementation brings a kernel that
replaces it. Modules register with ``register`` when they are imported; ``load`` imports every
module of the packages in ``_PACKAGES``: ``ops/`` (the ops that are not accrewrite's kernels),
``cpu/``, and ``cuda/``, whose ``triton_kernels.py`` registers the op that each module of
``accrewrite.kernels`` declares (``COMPILER_OP``), so that a new kernel is its own module only.
The selector (``selection.py``) chooses among them and the compile report lists each choice.
"""

import dataclasses
import functools
import importlib
import pathlib
import pkgutil
import sys
from collections.abc import Callable

import torch

from accrewrite.kernels.compiler_op import Cost, never  # noqa: F401 - the cost rules' vocabulary

# the packages whose modules register ops and implementations
_PACKAGES = ("ops", "cpu", "cuda")
_COMPILER = "accrewrite.runtime.compiler"

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# the devices of an op's default implementation: wherever torch runs the op (ATen's kernels,
# inductor's code), so that a graph on any accelerator keeps its default
EVERY_DEVICE = None


def same_cost(reason: str) -> Callable[[dict], Cost]:
    """The cost rule of an op's default implementation."""
    return lambda args: Cost(1.0, reason)


def inductors_code(op: str, reason="inductor's code, fused with its neighbours"):
    """The default implementation of an op whose code inductor generates on every device."""
    return Implementation(op, "inductor", EVERY_DEVICE, FLOATS, same_cost(reason),
                          generated=True)


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to run ``op``.

    ``kernel``: the op computed from its arguments by name (tensors and scalars), eagerly or
    traced into the graph; None for the op's default implementation, which leaves the graph as
    it is. ``insert(graph, **nodes)``: for ops found as aten nodes, the nodes that compute it.
    ``unsupported(args)``: why it cannot take these arguments (fake tensors by name), or None.
    ``devices``: the device types it runs on, or ``EVERY_DEVICE``. ``cost(args)``: its
    ``Cost``. ``ours``: one of accrewrite's kernels, which kernels="accrewrite" forces.
    ``generated``: its code is inductor's, generated for the graph (autotuning compiles it to
    time it). ``finish(graph)``: runs after the pass where it replaced a match (a rewrite of
    what the match's neighbours compute)."""

    op: str
    name: str
    devices: tuple[str, ...] | None
    dtypes: tuple[torch.dtype, ...]
    cost: Callable[[dict], Cost]
    kernel: Callable | None = None
    insert: Callable | None = None
    unsupported: Callable[[dict], str | None] | None = None
    ours: bool = False
    generated: bool = False
    finish: Callable[[torch.fx.Graph], None] | None = None

    def why_not(self, args: dict, x: torch.Tensor) -> str | None:
        """Why this implementation cannot run the op on ``args`` (``x``: the op's main input, on
        one of its devices)."""
        if x.dtype not in self.dtypes:
            dtypes = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"{str(x.dtype).removeprefix('torch.')}, not {dtypes}"
        return self.unsupported(args) if self.unsupported else None


@dataclasses.dataclass(frozen=True)
class Op:
    """An op the compiler chooses implementations for.

    Found either by ``patterns`` (``patterns.Pattern``; matched in the joint graph) or by
    ``nodes(graph)``, which yields ``(node, {argument name: node or None})`` for the aten nodes
    that are the op (matched in each forward and backward graph). ``input``: the argument whose
    shape, dtype and device the choice and the report go by; ``shape(args)`` the shape reported
    (default: that argument's). ``reference``: the op in PyTorch, by argument name, which
    autotuning times for the default implementation."""

    name: str
    input: str
    reference: Callable
    patterns: tuple = ()
    nodes: Callable | None = None
    shape: Callable[[dict], tuple] | None = None

    def shape_of(self, args: dict) -> tuple:
        return tuple(self.shape(args) if self.shape else args[self.input].shape)


_OPS: dict[str, Op] = {}
_IMPLEMENTATIONS: dict[str, list[Implementation]] = {}
_FILES: set[str] = set()  # the modules that registered


def register(entry: Op | Implementation, source: str | None = None) -> None:
    """Register an op or an implementation; called on import by the module that defines it, or
    that registers it for ``source``, the file that declares it (both are part of the cache key)."""
    _FILES.add(sys._getframe(1).f_code.co_filename)
    if source is not None:
        _FILES.add(source)
    if isinstance(entry, Op):
        _OPS[entry.name] = entry
    else:
        _IMPLEMENTATIONS.setdefault(entry.op, []).append(entry)


@functools.cache
def load() -> None:
    """Import every module of the registering packages, once."""
    for package in _PACKAGES:
        module = importlib.import_module(f"{_COMPILER}.{package}")
        for info in pkgutil.iter_modules(module.__path__):
            importlib.import_module(f"{_COMPILER}.{package}.{info.name}")
    # the passes try the ops in name order, whichever module registered them
    ordered = sorted(_OPS.items())
    _OPS.clear()
    _OPS.update(ordered)


def ops() -> dict[str, Op]:
    load()
    return _OPS


def implementations(op: str, device: str | None = None) -> list[Implementation]:
    """``op``'s implementations (for ``device``, if given), the default first, then by name."""
    load()
    found = [i for i in _IMPLEMENTATIONS.get(op, [])
             if device is None or i.devices is EVERY_DEVICE or device in i.devices]
    return sorted(found, key=lambda i: (i.kernel is not None, i.name))


def default(op: str, device: str) -> Implementation:
    """The implementation that leaves ``op`` on ``device`` as the graph has it."""
    return next(i for i in implementations(op, device) if i.kernel is None)


def replaceable(op: str, device: str) -> bool:
    """Whether ``op`` has an implementation on ``device`` that replaces the graph's code."""
    return any(i.kernel is not None for i in implementations(op, device))


def source_files() -> list[str]:
    """The files whose code decides what a compiled graph runs: the compiler's core and the
    modules of every registered op and implementation (part of inductor's cache key). Kernels
    that a graph calls, but that are not part of its code (C++ and Triton), are not."""
    load()
    core = pathlib.Path(__file__).parent
    return sorted({*map(str, core.glob("*.py")), *_FILES})
