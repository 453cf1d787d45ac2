"""Kernel selection, RAF's "operator dialect": which implementation runs each fusable subgraph.

AOTAutograd's joint (forward + backward) graph is searched for the aten subgraphs that an
accrewrite kernel implements (``PATTERNS``). Each match is either left to inductor, which
generates its own fused code for it, or replaced by the kernel's custom op from ``ops.py``
(forward and backward). The choice (``choose``) depends on the ``kernels`` option, the device and
the shape, and every match is recorded with its choice and the reason in a ``KernelMatch``.

Patterns are written as the PyTorch code users write; inductor's pattern matcher traces them
into aten with the same decompositions as the model, once per dtype and once for training
(forward + backward) and inference (forward only), and re-checks each match at its real shapes.
"""

import contextlib
import contextvars
import dataclasses
import functools
import logging

import torch
import torch.nn.functional as F
from torch._inductor import pattern_matcher
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.fx_passes.post_grad import remove_noop_ops

from accrewrite.kernels.dispatch import triton_available
from accrewrite.runtime.compiler import ops

log = logging.getLogger(__name__)

CHOICES = ("auto", "accrewrite", "inductor")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class KernelMatch:
    """One matched subgraph and the implementation chosen for it."""

    kernel: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    training: bool
    choice: str  # "accrewrite" (the kernel's custom op) or "inductor"
    reason: str

    def __str__(self):
        phase = "training" if self.training else "inference"
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"{self.kernel} {list(self.shape)} {dtype} on {self.device} ({phase}): "
            f"{self.choice} ({self.reason})"
        )


# Shape rules for CUDA under kernels="auto". They are heuristics to be tuned with
# benchmarks/kernels.py on the target GPU: a custom op is opaque to inductor, so it only pays
# where the hand-written kernel beats inductor's code by more than the fusion it prevents.
_LAYER_NORM_MIN_HIDDEN = 4096


def _cuda_choice(kernel: str, shape) -> tuple[str, str]:
    if kernel == "layer_norm":
        if shape[-1] >= _LAYER_NORM_MIN_HIDDEN:
            return "accrewrite", f"hidden size {shape[-1]} >= {_LAYER_NORM_MIN_HIDDEN}"
        return "inductor", f"hidden size {shape[-1]} < {_LAYER_NORM_MIN_HIDDEN}"
    return "inductor", "pointwise: inductor fuses it into the neighbouring kernels"


def check_policy(policy) -> str:
    """``policy`` (the ``kernels`` option) validated."""
    if policy not in CHOICES:
        raise ValueError(f"kernels={policy!r}: expected one of {', '.join(map(repr, CHOICES))}")
    return policy


def choose(kernel: str, x: torch.Tensor, policy: str) -> tuple[str, str]:
    """The implementation for ``kernel`` applied to ``x`` (a fake tensor) under ``policy``, and
    why."""
    if policy != "auto":
        return policy, f"kernels={policy!r}"
    if x.device.type != "cuda":
        return "inductor", f"on {x.device.type} the kernel is its PyTorch reference"
    if not triton_available():
        return "inductor", "triton is not installed"
    return _cuda_choice(kernel, x.shape)


@dataclasses.dataclass
class _Selection:
    policy: str
    training: bool
    matches: list


_ACTIVE: contextvars.ContextVar[_Selection] = contextvars.ContextVar("accrewrite_selection")


def _check(kernel: str, input_name: str, training: bool):
    """``extra_check`` for a pattern: record the match and say whether to replace it."""

    def check(match) -> bool:
        selection = _ACTIVE.get(None)
        if selection is None or selection.training != training:
            return False
        x = match.kwargs[input_name].meta["val"]
        choice, reason = choose(kernel, x, selection.policy)
        selection.matches.append(
            KernelMatch(kernel, tuple(x.shape), x.dtype, str(x.device), training, choice, reason)
        )
        return choice == "accrewrite"

    return check


# --- the patterns: (kernel, search, replacement, example inputs, input name, scalar workaround)


def _layer_norm_search(x, weight, bias, eps):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _layer_norm_replace(x, weight, bias, eps):
    return ops.layer_norm(x, weight, bias, eps)


def _layer_norm_inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
        torch.empty(8, dtype=dtype, requires_grad=grad),
    ]


def _quick_gelu_search(x):
    return x * torch.sigmoid(1.702 * x)


def _quick_gelu_replace(x):
    return ops.quick_gelu(x)


def _quick_gelu_inputs(dtype, grad):
    return [torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad)]


PATTERNS = (
    ("layer_norm", _layer_norm_search, _layer_norm_replace, _layer_norm_inputs, "x", {"eps": 1e-5}),
    ("quick_gelu", _quick_gelu_search, _quick_gelu_replace, _quick_gelu_inputs, "x", {}),
)


@functools.cache
def _patterns() -> pattern_matcher.PatternMatcherPass:
    """Every pattern traced and registered, once per process (it takes about a second)."""
    patterns = pattern_matcher.PatternMatcherPass(pass_name="accrewrite_kernel_selection")
    for kernel, search, replace, inputs, input_name, scalars in PATTERNS:
        for dtype in DTYPES:
            for training in (True, False):
                trace = pattern_matcher.joint_fwd_bwd if training else pattern_matcher.fwd_only
                pattern_matcher.register_replacement(
                    search,
                    replace,
                    inputs(dtype, training),
                    trace,
                    patterns,
                    extra_check=_check(kernel, input_name, training),
                    scalar_workaround=scalars,
                    # a pointwise pattern traces to the same graph for every dtype
                    skip_duplicates=True,
                )
    return patterns


class KernelSelectionPass(CustomGraphPass):
    """Inductor's ``joint_custom_pre_pass``: runs on the joint graph before partitioning (and on
    the forward graph of an inference compile). Matches found are appended to ``matches``."""

    def __init__(self, policy: str, matches: list):
        self.policy = check_policy(policy)
        self.matches = matches

    def __call__(self, graph: torch.fx.Graph) -> None:
        training = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
        selection = _Selection(self.policy, training, [])
        # The patterns were traced without no-op aliases and views (see joint_fwd_bwd);
        # inductor removes them right after this pass anyway.
        remove_noop_ops(graph)
        with _activated(selection):
            replaced = _patterns().apply(graph)
        if replaced:
            # Replacements are inserted where the match's output was; a backward op may now
            # precede the gradient it consumes, so restore a valid order.
            pattern_matcher.stable_topological_sort(graph)
            graph.lint()
        for match in selection.matches:
            log.info("kernel selection: %s", match)
        self.matches.extend(selection.matches)

    def uuid(self):
        # Part of inductor's cache key: the code of the pass and its ops, and the policy.
        return (get_hash_for_files((__file__, ops.__file__)), self.policy)


@contextlib.contextmanager
def _activated(selection: _Selection):
    token = _ACTIVE.set(selection)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
