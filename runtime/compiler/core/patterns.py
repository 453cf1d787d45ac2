"""The kernel-selection pass on the joint graph: finds the ops that have patterns (``ops/``, and
the kernels' declared ``COMPILER_OP``) and lets the selector (``selection.py``) choose each
match's implementation.

AOTAutograd's joint (forward + backward) graph is searched with the pattern set of its device:
the patterns of the ops that have an implementation replacing the graph's code there. A match
left to the default implementation stays as it is (inductor generates its code or calls ATen);
any other is replaced by the chosen implementation's kernel, traced at the match's shapes.

Patterns are written as the PyTorch code users write; inductor's pattern matcher traces them
into aten with the same decompositions as the model, on the device's tensors, once per dtype
and once for training (forward + backward) and inference (forward only), and re-checks each
match at its real shapes (a pattern with ``view_shapes`` instead checks the shapes of its views).
"""

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from accrewrite.base import torch_compat as compat
from accrewrite.kernels.compiler_op import Pattern
from accrewrite.runtime.compiler.core import registry, selection

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Selection:
    """The state of one run of the pass, read by the patterns' checks and replacements."""

    policy: str
    training: bool
    matches: list
    chosen: dict = dataclasses.field(default_factory=dict)  # match output node -> implementation
    current: registry.Implementation | None = None  # the one the replacement traces
    used: set = dataclasses.field(default_factory=set)  # implementations that replaced a match

    def record(self, op: str, args: dict) -> registry.Implementation:
        return selection.record(op, args, self.policy, self.training, self.matches)


_ACTIVE: contextvars.ContextVar[_Selection] = contextvars.ContextVar("accrewrite_selection")


def _check(pattern: Pattern, training: bool):
    """``extra_check`` for a pattern: choose the match's implementation (once per match: a
    pattern inside another, residual + dropout(x) inside residual + dropout(x + bias), matches
    again what was left to the default) and say whether to replace it."""

    def check(match) -> bool:
        state = _ACTIVE.get(None)
        if state is None or state.training != training:
            return False
        args = {
            name: value.meta["val"] if isinstance(value, torch.fx.Node) else value
            for name, value in match.kwargs.items()
        }
        if pattern.view_shapes and not _views_have(match, pattern.view_shapes(args)):
            return False
        if _sets_unnamed_keyword(match):
            return False
        output = match.output_nodes()[0]
        if output in state.chosen:
            return False
        device = args[registry.ops()[pattern.op].input].device.type
        if not registry.replaceable(pattern.op, device):
            return False  # a device this op has no other implementation for: nothing to choose
        implementation = state.chosen[output] = state.record(pattern.op, args)
        if implementation.kernel is None:
            return False
        state.current = implementation
        state.used.add(implementation)
        return True

    return check


def _replacement(pattern: Pattern):
    """The replacement of ``pattern``'s matches: the chosen implementation's kernel, traced on
    the match's arguments by name."""
    names = list(inspect.signature(pattern.search).parameters)

    def replace(*values):
        return _ACTIVE.get().current.kernel(**dict(zip(names, values)))

    return replace


def _views_have(match, shapes) -> bool:
    # A symbolic size not provably the expected one is declined: the views may group otherwise.
    views = sorted(n for n in match.nodes if n.target is torch.ops.aten.view.default)
    return len(views) == len(shapes) and all(
        len(view.meta["val"].shape) == len(shape)
        and all(statically_known_true(a == b) for a, b in zip(view.meta["val"].shape, shape))
        for view, shape in zip(views, shapes)
    )


def _sets_unnamed_keyword(match) -> bool:
    """Whether a matched call sets a keyword argument that its pattern does not name to other
    than its default: the matcher ignores such arguments (the attention pattern would match a
    call with a scale of its own, a keyword argument), so the call is not what the pattern
    traced."""
    for expr, node in match.ctx.pattern_to_node.items():
        if not isinstance(expr, compat.pattern_matcher.CallFunction) or not isinstance(
            node, torch.fx.Node
        ):
            continue
        schema = getattr(node.target, "_schema", None)
        defaults = {a.name: a.default_value for a in schema.arguments} if schema else {}
        for name, value in node.kwargs.items():
            if name not in expr.kwargs and (name not in defaults or value != defaults[name]):
                return True
    return False


class _AnySize:
    """Stands for the sizes of a view in a pattern traced for ``Pattern.view_shapes``."""


def _pattern_without_view_sizes(search, inputs, trace):
    """``search`` traced on ``inputs`` into a pattern that compares everything but the sizes
    given to its views."""
    gm = trace(search, inputs)
    for view in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default):
        view.args = (view.args[0], _AnySize())
    names = list(inspect.signature(search).parameters)
    return compat.pattern_matcher.fx_to_pattern(gm, ignore_types=(_AnySize,), argnames=names)


def _on(device: str, tensors: list) -> list:
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


@functools.cache
def pattern_set(device: str):
    """The patterns of every op that has a replacing implementation on ``device``, traced on
    its tensors and registered, once per process and device (about a second)."""
    matcher = compat.pattern_matcher
    patterns = matcher.PatternMatcherPass(pass_name=f"accrewrite_kernel_selection_{device}")
    for op in registry.ops().values():
        if not registry.replaceable(op.name, device):
            continue
        for pattern in op.patterns:
            for dtype in registry.FLOATS:
                for training in (True, False):
                    trace = matcher.joint_fwd_bwd if training else matcher.fwd_only
                    inputs = _on(device, pattern.inputs(dtype, training))
                    matcher.register_replacement(
                        pattern.search,
                        _replacement(pattern),
                        inputs,
                        trace,
                        patterns,
                        extra_check=_check(pattern, training),
                        scalar_workaround=pattern.scalars,
                        search_fn_pattern=(
                            _pattern_without_view_sizes(pattern.search, inputs, trace)
                            if pattern.view_shapes
                            else None
                        ),
                        # a pointwise pattern traces to the same graph for every dtype
                        skip_duplicates=True,
                    )
    return patterns


def graph_device(graph: torch.fx.Graph) -> str:
    """The device type of a graph's tensor inputs: the accelerator's if any input is on one."""
    devices = [
        node.meta["val"].device.type
        for node in graph.find_nodes(op="placeholder")
        if isinstance(node.meta.get("val"), torch.Tensor)
    ]
    return next((d for d in devices if d != "cpu"), "cpu")


class KernelSelectionPass(compat.CustomGraphPass):
    """Inductor's ``joint_custom_pre_pass``: runs on the joint graph before partitioning (and on
    the forward graph of an inference compile). The matches' choices are appended to
    ``matches``."""

    def __init__(self, policy: str, matches: list):
        self.policy = selection.check_policy(policy)
        self.matches = matches

    def __call__(self, graph: torch.fx.Graph) -> None:
        training = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
        state = _Selection(self.policy, training, [])
        # The patterns were traced without no-op aliases and views, pointless view pairs and
        # dead code (see joint_fwd_bwd); inductor removes them right after this pass anyway.
        # (With dynamic shapes, unused sym_size nodes would make a view look shared.)
        compat.remove_noop_ops(graph)
        compat.early_patterns.apply(graph)
        graph.eliminate_dead_code()
        with _activated(state):
            replaced = pattern_set(graph_device(graph)).apply(graph)
        if replaced:
            for implementation in state.used:
                if implementation.finish:
                    implementation.finish(graph)
            # Replacements are inserted where the match's output was; a backward op may now
            # precede the gradient it consumes, so restore a valid order.
            compat.pattern_matcher.stable_topological_sort(graph)
            graph.lint()
        for match in state.matches:
            log.info("kernel selection: %s", match)
        self.matches.extend(state.matches)

    def uuid(self):
        # Part of inductor's cache key: the code of the passes and of every implementation.
        return compat.get_hash_for_files(tuple(registry.source_files())), self.policy


@contextlib.contextmanager
def _activated(state: _Selection):
    token = _ACTIVE.set(state)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
