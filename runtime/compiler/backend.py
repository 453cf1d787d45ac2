"""The dynamo backend ``"accrewrite"``: AOTAutograd's joint graph, our FX passes, then inductor.

Inductor's ``compile_fx`` already runs AOTAutograd (joint forward + backward graph, then the
min-cut rematerialisation partitioner) and lowers what remains; this backend runs it with the
kernel-selection passes (``core/patterns.py`` as inductor's joint-graph pre-pass,
``core/selection_pass.py`` as its post-grad pass on each forward and backward graph), with the
activation-memory budget set for the partitioner, and with each graph's C++ kernels built as
one library per compile thread (``cpu/cpp_library.py``). Every setting is scoped to the
compilation: a plain ``torch.compile`` in the same process compiles as it would without it.
``torch.compile(model, backend="accrewrite", options={...})`` uses it directly;
``accrewrite.runtime.compile`` builds one ``Backend`` per model so that the model's report
collects what each of its graphs did.
"""

import collections
import dataclasses
import functools
import logging

import torch

from accrewrite.base import torch_compat as compat
from accrewrite.runtime.compiler.core import regional
from accrewrite.runtime.compiler.core.memory_budget import activation_budget, check_budget
from accrewrite.runtime.compiler.core.selection_pass import NodeSelectionPass
from accrewrite.runtime.compiler.core.patterns import KernelSelectionPass
from accrewrite.runtime.compiler.core.selection import KernelMatch, check_policy
from accrewrite.runtime.compiler.cpu import cpp_library

log = logging.getLogger(__name__)

OPTIONS = ("kernels", "memory_budget")


@dataclasses.dataclass
class CompileReport:
    """What compiling one model or optimizer did: each compiled graph (by the code it came
    from), each op matched with the implementation chosen and why, and other choices (notes);
    printed, equal matches are one line with their count. A graph that
    inductor loads from its on-disk cache is not traced again, so its matches are not listed
    (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` shows them)."""

    # each compiled graph: where it came from, or the region of blocks that share it
    graphs: list["str | regional.Region"] = dataclasses.field(default_factory=list)
    matches: list[KernelMatch] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # choices made without a graph

    def __str__(self):
        lines = [f"{len(self.graphs)} graph(s) compiled"]
        lines += [f"  graph: {graph}" for graph in self.graphs]
        lines += [f"  {note}" for note in self.notes]
        # a model compiled whole repeats each block's matches once per block
        repeats = collections.Counter(str(match) for match in self.matches)
        lines += [
            f"  kernel selection: {f'{n}x ' if n > 1 else ''}{match}"
            for match, n in repeats.items()
        ]
        return "\n".join(lines)


class Backend:
    """A dynamo backend compiling with the given options; ``report`` collects what it did.

    ``blocks``: the qualified names (with their class names) of the repeated blocks of the
    module whose forward is compiled; its graphs are then compiled by region
    (``regional.compile_by_region``).
    """

    def __init__(self, *, mode=None, kernels="auto", memory_budget=None, blocks=None):
        check_policy(kernels)
        _check_torch()
        self.mode = None if mode in (None, "default") else mode
        self.kernels = kernels
        self.memory_budget = check_budget(memory_budget)
        self.report = CompileReport()
        self.regions = regional.RegionCache(blocks) if blocks else None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        if self.regions:
            return regional.compile_by_region(
                gm, example_inputs, self.regions, self.compile_graph, self.report
            )
        self.report.graphs.append(regional.compile_origin(gm))
        return self.compile_graph(gm, example_inputs)

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs):
        """AOTAutograd, the kernel-selection passes and inductor on one graph."""
        patches = dict(compat.list_mode_options(self.mode)) if self.mode else {}
        patches["joint_custom_pre_pass"] = KernelSelectionPass(self.kernels, self.report.matches)
        patches["post_grad_custom_post_pass"] = NodeSelectionPass(
            self.kernels, self.report.matches
        )
        # batched here for the graphs that compile_fx loads from inductor's caches, which do not
        # go through inner_compile
        with activation_budget(self.memory_budget), cpp_library.batched():
            return compat.compile_fx(
                gm, example_inputs, inner_compile=_compile_inner, config_patches=patches
            )


def _compile_inner(gm, example_inputs, **kwargs):
    """Inductor's compilation of one forward or backward graph. AOTAutograd compiles the
    backward graph at the first backward, out of ``compile_graph``: its C++ kernels are
    batched here (see ``cpp_library``)."""
    with cpp_library.batched():
        return compat.compile_fx_inner(gm, example_inputs, **kwargs)


@functools.cache
def _check_torch() -> None:
    unsupported = compat.check_version()
    if unsupported:
        log.warning("%s: its private APIs may have moved (accrewrite/base/torch_compat.py)", unsupported)


@compat.register_backend(name="accrewrite")
def accrewrite(gm, example_inputs, *, mode=None, options=None):
    """``torch.compile(..., backend="accrewrite", mode=..., options={"kernels": ...,
    "memory_budget": ...})``."""
    options = dict(options or {})
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown accrewrite backend options {sorted(unknown)}; expected {OPTIONS}"
        )
    return Backend(mode=mode, **options)(gm, example_inputs)
