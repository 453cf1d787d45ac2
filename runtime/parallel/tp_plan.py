"""Tensor-parallel plans read off what a block computes, not off its module names.

``derive_plan(block)`` traces the block's forward with torch.fx (symbolically: no inputs are
needed; projections and torch.nn's modules stay whole, but for its transformer layers, which
are traced through) and follows the data from each projection:

- a projection whose output reaches another projection through elementwise ops only (an
  activation, dropout, the product with another such projection's output as in gated MLPs) is
  split column-wise and the one it reaches row-wise: the pair computes on a slice of the
  intermediate features, and the row-wise projection sums the slices;
- projections whose outputs meet in attention (``scaled_dot_product_attention``, or ``q @ k.T``
  then ``@ v``) are split by head: q, k and v column-wise (a fused q/k/v projection whose output
  is split or chunked in three: each third alike, ``colwise_fused``), the projection that reads
  the attention's output row-wise, and the head counts of the module that holds the q/k/v
  projections divided by the tp size (``heads``);
- an ``nn.MultiheadAttention`` is split by head as a whole (``heads``; ``mha.py`` converts it
  into separate projections when the plan is applied).

A projection is a module that multiplies its input by its 2-D ``weight``: ``nn.Linear``
(weight out x in), or one that computes ``x @ W + b`` as GPT-2's ``Conv1D`` (weight in x out),
told apart by tracing the module itself.

Where no split is safe the error names the block, the op and the fix: a normalization,
reduction or other op that mixes the features between two projections, a tensor that is not
split with the features but combined with them, an intermediate result that leaves the block,
a view sized from the unsplit width. Where part of a block splits, the rest stays whole with a
warning that says why.
Names are read only when a block cannot be traced (Python branches on its inputs' values): the
known layouts' names are then the hint.
"""

import operator
import warnings
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from accrewrite.base import torch_compat
from .mha import SplitQKVMultiheadAttention

COLWISE, COLWISE_FUSED, ROWWISE, HEADS = "colwise", "colwise_fused", "rowwise", "heads"
OUT_IN, IN_OUT = "out_in", "in_out"  # how a projection's weight is laid out

_ELEMENTWISE_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Mish, nn.LeakyReLU,
                        nn.ELU, nn.Softplus, nn.Hardswish, nn.Dropout, nn.Identity)
_ELEMENTWISE_FUNCTIONS = frozenset({
    F.relu, F.relu6, F.gelu, F.silu, F.mish, F.leaky_relu, F.elu, F.softplus, F.hardswish, F.dropout,
    torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.erf, torch.square, torch.neg, torch.pow,
    torch.clamp, torch.mul, torch.add, torch.sub, torch.div,
    operator.mul, operator.add, operator.sub, operator.truediv, operator.neg, operator.pow,
})
_ELEMENTWISE_METHODS = frozenset({"relu", "sigmoid", "tanh", "exp", "square", "neg", "pow", "clamp", "mul", "add",
                        "sub", "div", "float", "half", "bfloat16", "to", "type_as"})
# Ops that move elements between dimensions: sound on split features when the block views them
# as heads (each rank holds whole heads), which the divided head counts keep consistent.
_RESHAPE_FUNCTIONS = frozenset({torch.reshape, torch.transpose, torch.permute, torch.split, torch.chunk, torch.flatten,
                      torch.unflatten, torch.unbind, torch.cat, torch.stack, torch.repeat_interleave,
                      operator.getitem})
_RESHAPE_METHODS = frozenset({"view", "reshape", "transpose", "permute", "contiguous", "split", "chunk", "unflatten",
                    "flatten", "unbind", "expand", "repeat_interleave", "unsqueeze", "squeeze"})
_SPLITS = frozenset({torch.split, torch.chunk, torch.unbind, "split", "chunk", "unbind"})
# Attention: the score and value products; softmax and masking are sound only inside it.
_PRODUCTS = frozenset({torch.matmul, operator.matmul, torch.bmm, "matmul", "bmm"})
_ATTENTION_ONLY = frozenset({F.softmax, torch.softmax, torch.baddbmm, "softmax", "masked_fill", "baddbmm"})
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "type"})
_TRANSPOSES = frozenset({"T", "mT", "H", "mH"})  # attributes that are tensors; the rest (shape, dtype) are not
# Why an op stops a split (after "fc1 reach fc2, but <op> ...").
_MIXES = "mixes the features a split divides"
_UNSPLIT = "combines them with a tensor that is not split with them"
_LEAVES = "gets them, where they would be one rank's slice"

_BY_NAME = MappingProxyType({  # the hint for blocks that cannot be traced
    **dict.fromkeys(("q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v",
                     "wq", "wk", "wv", "gate_proj", "up_proj", "w1", "w3", "fc1", "c_fc", "fc_in"), COLWISE),
    **dict.fromkeys(("c_attn", "qkv", "qkv_proj", "Wqkv"), COLWISE_FUSED),
    **dict.fromkeys(("o_proj", "out_proj", "o", "wo", "down_proj", "w2", "fc2", "c_proj", "fc_out"), ROWWISE),
})
ATTENTION_INPUT_NAMES = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v", "wq", "wk", "wv",
                         "c_attn", "qkv", "qkv_proj", "Wqkv"})

_layouts: dict[type, str | None] = {}


def projection_layout(module: nn.Module) -> str | None:
    """``OUT_IN`` (``F.linear``), ``IN_OUT`` (``x @ W + b``) or None for a module that is not
    a projection; read from the module's own trace, once per class."""
    if isinstance(module, nn.Linear):
        return OUT_IN
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if (weight is None or weight.dim() != 2 or set(params) - {"weight", "bias"} or next(module.children(), None)
            or isinstance(module, (nn.Embedding, nn.EmbeddingBag))):
        return None
    if type(module) not in _layouts:
        _layouts[type(module)] = _traced_layout(module)
    return _layouts[type(module)]


def _traced_layout(module: nn.Module) -> str | None:
    try:
        graph = torch_compat.trace_forward(module, lambda m, default: default)
    except Exception:  # a module fx cannot trace is not one we can split
        return None
    for node in graph.nodes:
        if node.op == "get_attr" and node.target == "weight":
            for user in node.users:
                if user.target is F.linear and user.args[1] is node:
                    return OUT_IN
                if user.target in (torch.addmm, "addmm") and user.args[2] is node:
                    return IN_OUT
                if user.target in (torch.matmul, operator.matmul, torch.mm, "matmul", "mm") and user.args[1] is node:
                    return IN_OUT
    return None


def _is_attention_module(module: nn.Module) -> bool:
    return isinstance(module, (nn.MultiheadAttention, SplitQKVMultiheadAttention))


def derive_plan(block: nn.Module) -> dict:
    """``{submodule name: style}`` for ``block`` (see the module docstring); raises a
    ``ValueError`` naming the block, the op and the fix where nothing can be split."""
    try:
        graph = torch_compat.trace_forward(
            block, lambda m, default: (default and not isinstance(m, (nn.TransformerEncoderLayer,
                                                                      nn.TransformerDecoderLayer)))
            or projection_layout(m) is not None or _is_attention_module(m))
    except Exception as error:  # fx raises many kinds on code it cannot trace
        return _plan_by_name(block, f"{type(error).__name__}: {error}")
    return _Flow(block, graph).plan()


class _Flow:
    """The groups of projections in one traced block."""

    def __init__(self, block: nn.Module, graph):
        self.block, self.graph = block, graph
        self.modules = dict(block.named_modules())
        self.assigned: dict = {}  # projection node: style
        self.found: dict = {}
        self.left_whole: list[str] = []  # why a projection that could have paired did not

    def plan(self) -> dict:
        for node in self.graph.nodes:
            if node.op == "call_module" and _is_attention_module(self.modules[node.target]):
                self.found[node.target] = HEADS
        for node in self.graph.nodes:
            if self._is_projection(node) and node not in self.assigned:
                self._group(node)
        for node, style in self.assigned.items():
            if style is not None:
                self.found[node.target] = style
        name = type(self.block).__name__
        if not self.found:
            projections = [n.target for n in self.graph.nodes if self._is_projection(n)]
            reasons = "; ".join(self.left_whole) or (
                f"no projection's output reaches another through elementwise ops or attention "
                f"(its projections: {projections})" if projections else
                "it has no projections (nn.Linear, or modules computing x @ W + b)")
            raise ValueError(
                f"cannot derive a tensor-parallel plan for {name}: {reasons}. Shard it with "
                f"config.dist.fsdp.size instead of splitting it, or give in config.dist.tp.plan a split "
                f"you know is sound, as {{'mlp.fc1': 'colwise', 'mlp.fc2': 'rowwise'}}")
        if self.left_whole:
            warnings.warn(f"tensor parallel leaves part of {name} whole on every tp rank: "
                          f"{'; '.join(self.left_whole)}", stacklevel=4)
        return self.found

    # -- kinds of nodes --------------------------------------------------------------------------

    def _is_projection(self, node) -> bool:
        return node.op == "call_module" and projection_layout(self.modules[node.target]) is not None

    def _kind(self, node) -> str:
        target = node.target
        if node.op == "call_module":
            module = self.modules[target]
            if projection_layout(module) is not None:
                return "projection"
            return "elementwise" if isinstance(module, _ELEMENTWISE_MODULES) else "mixing"
        if node.op == "call_function":
            if target is getattr and node.args[1] in _TRANSPOSES:
                return "reshape"
            if target is getattr or target is len:
                return "shape"
            if target is operator.getitem and self._is_shape(node.args[0]):
                return "shape"
        if node.op in ("call_function", "call_method"):
            if node.op == "call_method" and target in _SHAPE_METHODS:
                return "shape"
            if target in _ELEMENTWISE_FUNCTIONS or target in _ELEMENTWISE_METHODS:
                return "elementwise"
            if target in _RESHAPE_FUNCTIONS or target in _RESHAPE_METHODS:
                return "reshape"
            if target is F.scaled_dot_product_attention:
                return "attention"
            if target in _PRODUCTS:
                return "product"
            if target in _ATTENTION_ONLY:
                return "attention_only"
        return "mixing"

    def _is_shape(self, node) -> bool:
        """Whether ``node`` is a size, a tuple of sizes or arithmetic on them, not a tensor."""
        if not isinstance(node, torch.fx.Node):
            return True
        if node.op == "call_method":
            return node.target in _SHAPE_METHODS
        if node.op == "call_function":
            if node.target is getattr:
                return node.args[1] not in _TRANSPOSES
            if node.target is len:
                return True
            if node.target in (operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
                               operator.truediv, operator.neg):
                return all(self._is_shape(a) for a in _nodes(node.args))
        return False

    def _tensors(self, node) -> list:
        nodes = _nodes((node.args, node.kwargs))
        if self._kind(node) == "reshape" and node.target not in (torch.cat, torch.stack):
            nodes = nodes[:1]  # the rest are sizes or dims
        return [n for n in nodes if not self._is_shape(n)]

    def _width_source(self, node):
        """The tensor whose last dimension ``node`` (a view or reshape) takes a size from, as
        ``B, T, C = x.shape; y.view(B, T, C)``: that width is the whole one."""
        if node.target not in ("view", "reshape", "unflatten", torch.reshape, torch.unflatten):
            return None
        sizes = _nodes((node.args[1:], node.kwargs))
        while sizes:
            size = sizes.pop()
            if size.op == "call_method" and size.target == "size" and len(size.args) > 1:
                if size.args[1] == -1:
                    return size.args[0]
            elif size.target is operator.getitem and isinstance(size.args[1], int):
                shape = size.args[0]
                taken = [u.args[1] for u in shape.users if u.target is operator.getitem and isinstance(u.args[1], int)]
                unpacked = len(set(taken)) > 1 and size.args[1] == max(taken)  # B, T, C = x.shape
                if shape.target in ("size", getattr) and (size.args[1] == -1 or unpacked):
                    return shape.args[0]
            elif self._is_shape(size):
                sizes += _nodes(size.args)
        return None

    def _describe(self, node) -> str:
        if node.op == "call_module":
            return f"{node.target} ({type(self.modules[node.target]).__name__})"
        if node.op == "output":
            return "the block's output"
        if node.op == "placeholder":
            return f"the block's input {node.target}"
        if node.op == "call_method":
            return f".{node.target}()"
        return getattr(node.target, "__name__", str(node.target))

    # -- one group ------------------------------------------------------------------------------

    def _group(self, start) -> None:
        members, component, rows = [start], set(), []
        blockers, foreign, products = [], [], []
        todo = [start]
        while todo:
            node = todo.pop()
            if node in component:
                continue
            component.add(node)
            for user in node.users:
                kind = self._kind(user)
                if kind == "shape":
                    continue
                if kind == "projection":
                    if user.args[0] is node and self.assigned.get(user) in (None, ROWWISE) and user not in members:
                        rows += [] if user in rows else [user]
                    else:
                        blockers.append((user, "is split otherwise, or reads them as other than its input"))
                    continue
                if kind == "mixing":
                    blockers.append((user, _LEAVES if user.op == "output" else _MIXES))
                    continue
                for other in self._tensors(user):
                    if other is node or other in component:
                        continue
                    upstream = self._upstream_projections(other, set())
                    if upstream:
                        for projection in upstream:
                            if projection not in members:
                                members.append(projection)
                                todo.append(projection)
                    else:
                        foreign.append((user, other))
                if kind in ("product", "attention"):
                    products.append(user)
                todo.append(user)
        attention = any(self._kind(p) == "attention" for p in products) or any(
            all(t in component for t in self._tensors(p)[:2]) for p in products)
        if not attention:
            blockers += [(user, _UNSPLIT) for user, _ in foreign]
            blockers += [(n, _MIXES) for n in component if self._kind(n) in ("attention_only", "product", "attention")]
        else:
            for product in products:  # q, k, v (and the scores) must all be split by head
                operands = self._tensors(product)[:3 if self._kind(product) == "attention" else 2]
                blockers += [(product, _UNSPLIT) for t in operands if t not in component]
        for node in component:
            unsplit = self._width_source(node)
            if unsplit is not None and unsplit not in component:
                blockers.append((node, f"sizes them from {self._describe(unsplit)}'s last dimension, which the "
                                       f"split does not divide (size them with -1, or from a split tensor)"))
        names = ", ".join(m.target for m in members)
        if blockers or not rows:
            why = None
            for blocker, reason in blockers:
                reached = rows[0] if rows else self._reached_through(blocker)
                if reached is not None:
                    verb = "reaches" if len(members) == 1 else "reach"
                    why = f"{names} {verb} {reached.target}, but {self._describe(blocker)} {reason}"
                    break
            return self._leave_whole(members + rows, why)
        styles = dict.fromkeys(members, COLWISE)
        for member in members:
            split = next((u for u in member.users if u.target in _SPLITS), None)
            if split is None:
                continue
            parts = len({g.args[1] for g in split.users if g.target is operator.getitem})
            if not attention or len(members) > 1 or parts != 3:
                return self._leave_whole(members + rows, f"{member.target}'s output is split in {parts} parts, "
                                                         f"which only a fused q/k/v projection in three can be")
            styles[member] = COLWISE_FUSED
        if attention and len(members) == 1 and styles[start] != COLWISE_FUSED:
            return self._leave_whole(members + rows, f"q, k and v all come from {names}, but not by a split or "
                                                     f"chunk of its output: where each lies in it cannot be read")
        if attention:
            self.found[_common_parent([m.target for m in members])] = HEADS
        self.assigned.update(styles)
        self.assigned.update(dict.fromkeys(rows, ROWWISE))

    def _leave_whole(self, projections: list, why: str | None) -> None:
        for projection in projections:
            self.assigned.setdefault(projection, None)
        if why is not None:
            self.left_whole.append(why)

    def _upstream_projections(self, node, seen: set) -> list:
        """The unassigned projections whose outputs reach ``node`` through ops that keep a split
        (what else feeds those ops is checked on the walk from the projections)."""
        if node in seen:
            return []
        seen.add(node)
        if self._is_projection(node):
            return [node] if node not in self.assigned else []
        if self._kind(node) not in ("elementwise", "reshape", "product", "attention", "attention_only"):
            return []
        return [p for source in self._tensors(node) for p in self._upstream_projections(source, seen)]

    def _reached_through(self, blocker):
        """The projection that ``blocker`` feeds through ops of one tensor input (the straight
        line a pair would be on), if any."""
        node = blocker
        for _ in range(len(self.graph.nodes)):
            users = [u for u in node.users if self._kind(u) != "shape"]
            if len(users) != 1:
                return None
            node = users[0]
            if self._is_projection(node):
                return node
            if node.op == "output" or len(self._tensors(node)) != 1:
                return None
        return None


def _nodes(value) -> list:
    """The fx nodes in nested args."""
    found = []
    torch.fx.node.map_arg(value, found.append)
    return found


def _common_parent(names: list[str]) -> str:
    parts = [name.split(".")[:-1] for name in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _plan_by_name(block: nn.Module, why: str) -> dict:
    """The plan that the names of the known layouts give, for a block fx cannot trace."""
    plan = {}
    for name, module in block.named_modules():
        style = _BY_NAME.get(name.rpartition(".")[2])
        if style is not None and projection_layout(module) is not None:
            plan[name] = style
    for parent in {name.rpartition(".")[0] for name in plan}:
        children = [name for name in plan if name.rpartition(".")[0] == parent]
        styles = {plan[name] for name in children}
        if ROWWISE not in styles or styles == {ROWWISE}:  # half a pair cannot be split alone
            for name in children:
                del plan[name]
        elif any(name.rpartition(".")[2] in ATTENTION_INPUT_NAMES for name in children):
            plan[parent] = HEADS
    if not plan:
        names = [name for name, module in block.named_modules() if projection_layout(module) is not None]
        raise ValueError(
            f"cannot derive a tensor-parallel plan for {type(block).__name__}: torch.fx cannot trace it "
            f"({why}), and its projections {names} have no names of a known layout (q_proj/k_proj/"
            f"v_proj/o_proj, c_attn/c_proj, gate_proj/up_proj/down_proj, fc1/fc2); give one in "
            f"config.dist.tp.plan, as {{'attn.q': 'colwise', 'attn.out': 'rowwise'}}")
    return plan
