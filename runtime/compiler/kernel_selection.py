"""Kernel selection, RAF's "operator dialect": which implementation runs each fusable subgraph.

AOTAutograd's joint (forward + backward) graph is searched for the aten subgraphs that an
accrewrite kernel implements (``PATTERNS``). Each match is either left to inductor, which
generates its own fused code for it (or calls ATen's kernel for it), or replaced by the kernel's
custom op from ``ops.py`` (forward and backward); causal attention and cross-entropy on the CPU
by accrewrite's C++ kernels (``attention.py``, ``cross_entropy.py``). The choice (``choose``)
depends on the ``kernels`` option, the device and the shape, and every match is recorded with
its choice and the reason in a ``KernelMatch``.

Patterns are written as the PyTorch code users write; inductor's pattern matcher traces them
into aten with the same decompositions as the model, once per dtype and once for training
(forward + backward) and inference (forward only), and re-checks each match at its real shapes
(a pattern with ``view_shapes`` instead checks the shapes of its views).
"""

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch._inductor import pattern_matcher
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.fx_passes.joint_graph import early_patterns
from torch._inductor.fx_passes.post_grad import remove_noop_ops
from torch.fx.experimental.symbolic_shapes import statically_known_true

from accrewrite.kernels.dispatch import triton_available
from accrewrite.runtime.compiler import attention, cross_entropy, graph_nodes, ops

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
# swin_fmha holds each row of N scores in registers and sums the relative position bias's
# gradient over the windows inside its backward, where inductor runs a reduction of its own over
# the whole gradient: that should pay where many windows (images * windows per image) share the
# bias and rows are short (Swin's windows have 7x7 to 12x12 tokens).
_SWIN_FMHA_MIN_WINDOWS = 512
_SWIN_FMHA_MAX_TOKENS = 256


def _cuda_choice(kernel: str, shape) -> tuple[str, str]:
    if kernel == "layer_norm":
        if shape[-1] >= _LAYER_NORM_MIN_HIDDEN:
            return "accrewrite", f"hidden size {shape[-1]} >= {_LAYER_NORM_MIN_HIDDEN}"
        return "inductor", f"hidden size {shape[-1]} < {_LAYER_NORM_MIN_HIDDEN}"
    if kernel == "swin_fmha":
        windows, tokens = shape[0], shape[-1]
        fits = windows >= _SWIN_FMHA_MIN_WINDOWS and tokens <= _SWIN_FMHA_MAX_TOKENS
        return "accrewrite" if fits else "inductor", (
            f"{windows} windows of {tokens} tokens; the kernel takes >= {_SWIN_FMHA_MIN_WINDOWS} "
            f"windows of <= {_SWIN_FMHA_MAX_TOKENS} tokens"
        )
    # bias_dropout_add too: inductor draws its dropout mask inside the fused kernel as well
    return "inductor", "pointwise: inductor fuses it into the neighbouring kernels"


# causal_attention on the CPU (attention.py): accrewrite's kernel took 0.50-0.86x the time of
# ATen's for a training step of the attention alone (64 to 1024 tokens, head sizes 32 to 128,
# float32, 2 cores). Its blocks of scores (32 or 64 queries x all tokens) were not measured
# beyond 1024 tokens, where ATen's kernel, which works through keys in blocks, stays.
_ATTENTION_MAX_TOKENS = 1024

# cross_entropy on the CPU (cross_entropy.py): measured on rows of 4096 and 32000 classes, where
# inductor's code reads each row more often than the kernel does (a compiled head and loss took
# 0.90-0.93x the time with the kernel); a classifier's few classes stay inductor's.
_CROSS_ENTROPY_MIN_CLASSES = 1024


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
    if kernel == "causal_attention":
        tokens = x.shape[-2]
        if tokens > _ATTENTION_MAX_TOKENS:
            return "inductor", (
                f"ATen's kernel: {tokens} tokens, over the {_ATTENTION_MAX_TOKENS} that "
                "accrewrite's is measured at"
            )
        return "accrewrite", "accrewrite's C++ kernel: 0.50-0.86x ATen's time on the CPU"
    if kernel == "cross_entropy":
        classes = x.shape[-1]
        if classes < _CROSS_ENTROPY_MIN_CLASSES:
            return "inductor", (
                f"inductor's code: {classes} classes, under {_CROSS_ENTROPY_MIN_CLASSES}"
            )
        return "accrewrite", "accrewrite's C++ kernel: fewer passes over the logits than inductor's"
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
    decided: set = dataclasses.field(default_factory=set)  # output nodes of the matches


_ACTIVE: contextvars.ContextVar[_Selection] = contextvars.ContextVar("accrewrite_selection")


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A subgraph that ``kernel`` implements. ``search`` is written as users write it and
    ``replace`` computes it from the same arguments with the kernel's op; both are traced with
    the example tensors ``inputs(dtype, requires_grad)`` and the example values ``scalars`` of
    their scalar arguments (values that occur nowhere else in the trace, which is how the
    matcher tells the argument from a constant). The match's argument ``input_name`` gives the
    shape and device the choice depends on; ``unsupported(args)`` says why the kernel cannot
    take a match's arguments (fake tensors and scalars by name), or returns None; without it
    the kernel takes them all.

    The matcher re-traces a pattern at each match's shapes and compares the sizes given to its
    views, which it cannot do where a size comes from a second symbolic dimension (it binds only
    the first as a graph input). A pattern with ``view_shapes`` leaves its views' sizes
    uncompared instead; ``view_shapes(args)`` gives the shapes the matched views must have, in
    graph order."""

    kernel: str
    search: Callable
    replace: Callable
    inputs: Callable
    input_name: str = "x"
    scalars: dict = dataclasses.field(default_factory=dict)
    unsupported: Callable | None = None
    view_shapes: Callable | None = None


def _check(pattern: Pattern, training: bool):
    """``extra_check`` for a pattern: record the match and say whether to replace it."""

    def check(match) -> bool:
        selection = _ACTIVE.get(None)
        if selection is None or selection.training != training:
            return False
        args = {
            name: value.meta["val"] if isinstance(value, torch.fx.Node) else value
            for name, value in match.kwargs.items()
        }
        if pattern.view_shapes and not _views_have(match, pattern.view_shapes(args)):
            return False
        if _sets_unnamed_keyword(match):
            return False
        # A pattern that is part of another (residual + dropout(x) inside bias_dropout_add's
        # residual + dropout(x + bias)) matches again a subgraph left to inductor: list it once.
        output = match.output_nodes()[0]
        if output in selection.decided:
            return False
        selection.decided.add(output)
        x = args[pattern.input_name]
        unsupported = pattern.unsupported and pattern.unsupported(args)
        if unsupported:
            choice, reason = "inductor", f"the kernel does not take it: {unsupported}"
        else:
            choice, reason = choose(pattern.kernel, x, selection.policy)
        selection.matches.append(
            KernelMatch(
                pattern.kernel, tuple(x.shape), x.dtype, str(x.device), training, choice, reason
            )
        )
        return choice == "accrewrite"

    return check


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
        if not isinstance(expr, pattern_matcher.CallFunction) or not isinstance(
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
    return pattern_matcher.fx_to_pattern(gm, ignore_types=(_AnySize,), argnames=names)


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


# bias_dropout_add, with a bias and without (a Linear's bias is inside its matmul: most models
# write residual + dropout(proj(h))), and with the residual on either side of the sum (the
# matcher does not take the sum as commutative). The residual is traced without a gradient: its
# gradient is the incoming one, which the pattern then need not contain, so it matches either way.


def _dropout_add_search(residual_first: bool):
    def search(x, residual, p):
        dropped = F.dropout(x, p, training=True)
        return residual + dropped if residual_first else dropped + residual

    return search


def _bias_dropout_add_search(residual_first: bool):
    dropout_add = _dropout_add_search(residual_first)

    def search(x, bias, residual, p):
        return dropout_add(x + bias, residual, p)

    return search


def _bias_dropout_add_replace(x, bias, residual, p):
    # The seed is drawn by the graph, at every call and on x's device (see ops.bias_dropout_add).
    seed = torch.randint(2**31 - 1, (), device=x.device)
    return ops.bias_dropout_add(x, bias, residual, p, seed)


def _dropout_add_replace(x, residual, p):
    return _bias_dropout_add_replace(x, None, residual, p)


def _bias_dropout_add_inputs(dtype, grad):
    x, residual = _dropout_add_inputs(dtype, grad)
    return [x, torch.empty(8, dtype=dtype, requires_grad=grad), residual]


def _dropout_add_inputs(dtype, grad):
    return [
        torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad),
        torch.empty(2, 3, 8, dtype=dtype),
    ]


def _bias_dropout_add_unsupported(args):
    x, bias, residual = args["x"], args.get("bias"), args["residual"]
    if residual.shape != x.shape:
        return f"residual {list(residual.shape)} is broadcast to x {list(x.shape)}"
    if bias is not None and bias.shape != x.shape[-1:]:
        return f"bias {list(bias.shape)} is not over x's last dimension only"
    return None


# swin_fmha: Swin's WindowAttention, from the relative position bias to the softmax, without and
# with the shifted windows' mask. Swin's own code (and torchvision) writes the image count of the
# first view as B_ // nW, timm as -1, and either count and the number of windows per image may be
# symbolic: the masked form matches any sizes of its views and checks their shapes.


def _swin_fmha_search(attn, relative_pos_bias):
    return torch.softmax(attn + relative_pos_bias.unsqueeze(0), dim=-1)


def _swin_fmha_masked_search(attn, relative_pos_bias, attn_mask):
    _, heads, n, _ = attn.shape
    scores = (attn + relative_pos_bias.unsqueeze(0)).view(-1, attn_mask.shape[0], heads, n, n)
    scores = scores + attn_mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(scores.view(-1, heads, n, n), dim=-1)


def _swin_fmha_masked_views(args):
    attn, windows_per_image = args["attn"], args["attn_mask"].shape[0]
    if attn.dim() != 4:
        return []  # not Swin's scores: no views fit
    windows, heads, n, _ = attn.shape
    return [(windows // windows_per_image, windows_per_image, heads, n, n), tuple(attn.shape)]


def _swin_fmha_replace(attn, relative_pos_bias):
    return _swin_fmha_masked_replace(attn, relative_pos_bias, None)


def _swin_fmha_masked_replace(attn, relative_pos_bias, attn_mask):
    # Eager Swin adds in the promoted dtype (under autocast a bf16 attn plus the fp32 bias gives
    # fp32 probabilities), the kernel in fp32 returning attn's dtype: give it the promoted one.
    dtypes = [t.dtype for t in (attn, relative_pos_bias, attn_mask) if t is not None]
    attn = attn.to(functools.reduce(torch.promote_types, dtypes))
    return ops.swin_fmha(attn, relative_pos_bias, attn_mask)


def _swin_fmha_inputs(dtype, grad):
    return [
        torch.empty(4, 2, 5, 5, dtype=dtype, requires_grad=grad),
        torch.empty(2, 5, 5, dtype=dtype, requires_grad=grad),
    ]


def _swin_fmha_masked_inputs(dtype, grad):
    return [*_swin_fmha_inputs(dtype, grad), torch.empty(2, 5, 5, dtype=dtype)]


def _swin_fmha_unsupported(args):
    attn, bias, mask = args["attn"], args["relative_pos_bias"], args.get("attn_mask")
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        return f"attn {list(attn.shape)} is not (windows, heads, N, N)"
    if bias.shape != attn.shape[1:]:
        return f"relative_pos_bias {list(bias.shape)} is not (heads, N, N)"
    if mask is not None and (mask.dim() != 3 or mask.shape[1:] != attn.shape[2:]):
        return f"attn_mask {list(mask.shape)} is not (windows per image, N, N)"
    return None


# causal_attention: causal self-attention as ``F.scaled_dot_product_attention`` traces on the CPU
# (ATen's fused CPU kernel and its backward). Dropout, a mask (which excludes is_causal) and a
# scale of its own trace to other arguments and do not match (see _sets_unnamed_keyword).


def _causal_attention_search(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _causal_attention_replace(q, k, v):
    return attention.causal_attention(q, k, v)[0]


def _causal_attention_inputs(dtype, grad):
    return [torch.empty(2, 3, 8, 4, dtype=dtype, requires_grad=grad) for _ in range(3)]


def _causal_attention_unsupported(args):
    q, k, v = args["q"], args["k"], args["v"]
    if not q.shape == k.shape == v.shape:
        return f"q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} differ in shape"
    if q.dim() != 4:
        return f"q {list(q.shape)} is not (batch, heads, tokens, head size)"
    if not all(isinstance(size, int) for size in q.shape[-2:]):
        return f"the number of tokens or the head size ({list(q.shape[-2:])}) is symbolic"
    if q.dtype != torch.float32:
        return f"{q.dtype}, not float32"
    if any(isinstance(size, int) and size == 0 for size in q.shape):  # (a 0 is never symbolic)
        return f"q {list(q.shape)} is empty"
    return attention.unavailable()


# cross_entropy: F.cross_entropy(logits, target) with its defaults (mean over the targets that are
# not -100) on (rows, classes) logits. A class weight, label smoothing, another reduction or
# ignore_index trace to other graphs and do not match.


def _cross_entropy_search(logits, target):
    return F.cross_entropy(logits, target)


def _cross_entropy_replace(logits, target):
    return cross_entropy.cross_entropy(logits, target, -100)[0]


def _cross_entropy_inputs(dtype, grad):
    return [torch.empty(4, 5, dtype=dtype, requires_grad=grad), torch.zeros(4, dtype=torch.long)]


def _cross_entropy_unsupported(args):
    logits = args["logits"]
    if logits.device.type != "cpu":
        return f"on {logits.device.type}: the kernel is for the CPU"
    if logits.dtype != torch.float32:
        return f"{logits.dtype}, not float32"
    if not isinstance(logits.shape[1], int):
        return f"the number of classes ({logits.shape[1]}) is symbolic"
    return cross_entropy.unavailable()


PATTERNS = (
    Pattern("layer_norm", _layer_norm_search, _layer_norm_replace, _layer_norm_inputs,
            scalars={"eps": 1e-5}),
    Pattern("quick_gelu", _quick_gelu_search, _quick_gelu_replace, _quick_gelu_inputs),
    # with its bias before without, so that a match is the longest one
    *(
        Pattern("bias_dropout_add", search(residual_first), replace, inputs,
                scalars={"p": 0.113377}, unsupported=_bias_dropout_add_unsupported)
        for search, replace, inputs in (
            (_bias_dropout_add_search, _bias_dropout_add_replace, _bias_dropout_add_inputs),
            (_dropout_add_search, _dropout_add_replace, _dropout_add_inputs),
        )
        for residual_first in (True, False)
    ),
    Pattern("swin_fmha", _swin_fmha_search, _swin_fmha_replace, _swin_fmha_inputs, "attn",
            unsupported=_swin_fmha_unsupported),
    Pattern("swin_fmha", _swin_fmha_masked_search, _swin_fmha_masked_replace,
            _swin_fmha_masked_inputs, "attn", unsupported=_swin_fmha_unsupported,
            view_shapes=_swin_fmha_masked_views),
    Pattern("causal_attention", _causal_attention_search, _causal_attention_replace,
            _causal_attention_inputs, "q", unsupported=_causal_attention_unsupported),
    Pattern("cross_entropy", _cross_entropy_search, _cross_entropy_replace,
            _cross_entropy_inputs, "logits", unsupported=_cross_entropy_unsupported),
)


@functools.cache
def _patterns() -> pattern_matcher.PatternMatcherPass:
    """Every pattern traced and registered, once per process (it takes about a second)."""
    patterns = pattern_matcher.PatternMatcherPass(pass_name="accrewrite_kernel_selection")
    for pattern in PATTERNS:
        for dtype in DTYPES:
            for training in (True, False):
                trace = pattern_matcher.joint_fwd_bwd if training else pattern_matcher.fwd_only
                inputs = pattern.inputs(dtype, training)
                pattern_matcher.register_replacement(
                    pattern.search,
                    pattern.replace,
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


class KernelSelectionPass(CustomGraphPass):
    """Inductor's ``joint_custom_pre_pass``: runs on the joint graph before partitioning (and on
    the forward graph of an inference compile). Matches found are appended to ``matches``."""

    def __init__(self, policy: str, matches: list):
        self.policy = check_policy(policy)
        self.matches = matches

    def __call__(self, graph: torch.fx.Graph) -> None:
        training = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
        selection = _Selection(self.policy, training, [])
        # The patterns were traced without no-op aliases and views, pointless view pairs and
        # dead code (see joint_fwd_bwd); inductor removes them right after this pass anyway.
        # (With dynamic shapes, unused sym_size nodes would make a view look shared.)
        remove_noop_ops(graph)
        early_patterns.apply(graph)
        graph.eliminate_dead_code()
        with _activated(selection):
            replaced = _patterns().apply(graph)
        if replaced:
            # the bias gradient of the layer before a cross_entropy: the op's column sums
            cross_entropy.reuse_column_sums(graph)
            # Replacements are inserted where the match's output was; a backward op may now
            # precede the gradient it consumes, so restore a valid order.
            pattern_matcher.stable_topological_sort(graph)
            graph.lint()
        for match in selection.matches:
            log.info("kernel selection: %s", match)
        self.matches.extend(selection.matches)

    def uuid(self):
        # Part of inductor's cache key: the code of the pass and its replacements, and the policy.
        files = (__file__, ops.__file__, attention.__file__, cross_entropy.__file__,
                 graph_nodes.__file__)
        return get_hash_for_files(files), self.policy


@contextlib.contextmanager
def _activated(selection: _Selection):
    token = _ACTIVE.set(selection)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
