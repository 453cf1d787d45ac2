"""Benchmark cases for ``benchmarks/kernels.py``, one module per kernel.

Each module here defines::

    def cases(device: str, *, smoke: bool = False, compile=torch.compile) -> list[Case]

``smoke=True`` asks for tiny shapes (the CPU test runs every callable once with them);
``compile`` is what the ``compiled`` baseline must use to compile the reference (the test passes
a cheap dynamo-only backend). Every callable is one full unit of work taking no argument: a
forward + backward (``forward_backward`` builds that) or one optimizer step.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Case:
    """One shape/dtype of one kernel: ours and what it is measured against."""

    name: str
    ours: Callable[[], object]
    eager: Callable[[], object]  # the PyTorch reference run eagerly (what users run today)
    compiled: Callable[[], object]  # torch.compile of that reference
    # further baselines a goal names, e.g. {"torch fused": ...} for AdamW
    others: dict[str, Callable[[], object]] = field(default_factory=dict)

    def baselines(self) -> dict[str, Callable[[], object]]:
        return {"eager": self.eager, "compile": self.compiled, **self.others}


def forward_backward(fn: Callable, inputs: tuple, grad_out: torch.Tensor) -> Callable[[], None]:
    """A callable running ``fn(*inputs).backward(grad_out)``; the inputs' grads are dropped first
    so that each run allocates them afresh, as a training step does."""

    def run():
        for t in inputs:
            if isinstance(t, torch.Tensor):
                t.grad = None
        fn(*inputs).backward(grad_out)

    return run


def kernel_names() -> list[str]:
    """The kernels that have a case module here."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load(name: str):
    """The case module of kernel ``name``."""
    return importlib.import_module(f"{__name__}.{name}")
