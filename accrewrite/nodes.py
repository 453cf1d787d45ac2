"""Small helpers over libcst nodes that the analysis and the rules share: dotted names, string
values, call arguments, a fast listing of a node's children, and the walks over it: read-only
(``walk``, ``descendants``) and rewriting (``rebuilt``)."""

from __future__ import annotations

import dataclasses
import difflib
import operator
import typing
from contextlib import contextmanager

import libcst as cst


def dotted(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    node_type = type(node)
    if node_type is cst.Name:
        return node.value
    if node_type is cst.Attribute:
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def string_value(node: cst.CSTNode) -> str | None:
    """The value of a plain (non-f, non-bytes) string literal, else None."""
    if type(node) is cst.SimpleString:
        prefix = node.prefix.lower()
        if "b" in prefix:
            return None
        raw = node.raw_value
        # Without escapes or carriage returns (which Python's reading turns into newlines), the
        # text is the value: libcst's evaluated_value would run ast.literal_eval.
        if "\r" in raw or "\\" in raw and "r" not in prefix:
            return node.evaluated_value
        return raw
    if type(node) is cst.ConcatenatedString:
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def call_arg(call: cst.Call, position: int, keyword: str | None = None) -> cst.Arg | None:
    """The argument passed at ``position`` or as ``keyword``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position < len(positional):
        return positional[position]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return None


# Fields that hold only whitespace, comments and punctuation: the analysis never needs them.
_SKIPPED_FIELDS = frozenset(
    {
        "leading_lines", "lines_after_decorators", "trailing_whitespace", "header", "footer",
        "lpar", "rpar", "comma", "semicolon", "equal", "colon", "dot", "star", "operator",
    }
)
_child_getters: dict[type, object] = {}
_TEXT = frozenset({str, bool, typing.Optional[str]})


def node_types(*bases: type) -> frozenset[type]:
    """Every libcst node class deriving from one of ``bases``. ``type(node) in`` such a set is
    several times faster than ``isinstance`` against libcst's abstract base classes, which is
    what walks that test every node do."""
    found: set[type] = set()
    pending = list(bases)
    while pending:
        kind = pending.pop()
        if kind not in found:
            found.add(kind)
            pending.extend(kind.__subclasses__())
    return frozenset(found)


NODE_TYPES = node_types(cst.CSTNode)
STATEMENT_TYPES = node_types(cst.SimpleStatementLine, cst.BaseCompoundStatement)


# A libcst visitor, not a walk: it learns the order in which libcst's visit reads the fields.
class _FieldOrder(cst.CSTVisitor):
    """The fields that libcst visits, in the order it visits them: source order, which a
    class's dataclass fields do not keep (``FunctionDef`` lists its decorators after its body)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if attribute not in self.fields:
            self.fields.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def _child_getter(node: cst.CSTNode):
    """A function giving the values of ``node``'s class's fields that may hold child nodes, in
    source order, as a tuple. The order is read once per class, from libcst visiting ``node``;
    the fields it left out there come last (a format spec, visited only where there is one),
    but for those of text (a name's value, a string's quotes)."""
    order = _FieldOrder()
    node._visit_and_replace_children(order)
    fields = order.fields + [
        f.name for f in dataclasses.fields(node)
        if f.name not in order.fields and f.type not in _TEXT and typing.get_origin(f.type) is not typing.Literal
    ]
    names = tuple(name for name in fields if name not in _SKIPPED_FIELDS and not name.startswith("whitespace"))
    if not names:
        getter = _no_fields
    elif len(names) == 1:
        single = operator.attrgetter(names[0])
        getter = lambda node: (single(node),)  # noqa: E731 - attrgetter of one name gives no tuple
    else:
        getter = operator.attrgetter(*names)
    _child_getters[type(node)] = getter
    return getter


def _no_fields(node):
    return ()


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node``'s child nodes in source order, without its whitespace, parentheses and
    punctuation: what read-only walks and the rules' walk descend into, read from the fields. The list
    is shared (inside ``remembering_children``): read it, never change it."""
    kind = type(node)
    getter = _child_getters.get(kind) or _child_getter(node)
    if getter is _no_fields:  # a leaf (a name, a number): nothing to remember
        return []
    memo = _memo
    if memo is not None:
        kept = memo.get(id(node))
        if kept is not None:
            return kept[1]
    found = []
    for value in getter(node):
        kind = type(value)
        if kind in NODE_TYPES:
            found.append(value)
        elif kind is tuple or kind is list:
            found.extend([item for item in value if type(item) in NODE_TYPES])
    if memo is not None:
        memo[id(node)] = (node, found)
    return found


# Each node's children while a file is migrated (``remembering_children``), by the node's id: a
# node hashes by a Python method of libcst's, an int in C. The node is kept beside its children,
# so that its id is not given to another node meanwhile.
_memo: dict[int, tuple[cst.CSTNode, list[cst.CSTNode]]] | None = None


@contextmanager
def remembering_children():
    """Within it, ``children`` keeps what it finds: the analysis, the data-flow analysis and the
    rules walk the same nodes of a file several times. Trees are immutable, so what was found
    stays true; it is all dropped on leaving."""
    global _memo
    outer = _memo
    if outer is None:
        _memo = {}
    try:
        yield
    finally:
        _memo = outer


# A libcst transformer, not a walk: the rebuilding of one node is libcst's own.
class Replacing(cst.CSTTransformer):
    """Rebuilds one node with some of its children replaced: libcst's own rebuilding (removals,
    flattening, the checks on what may be removed), entering no child."""

    def __init__(self, replacements: dict[cst.CSTNode, object]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        return self.replacements.get(original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def walk(node: cst.CSTNode, enter, leave=None) -> None:
    """Call ``enter`` on ``node`` and its descendants in source order, without libcst's visit
    (shared with its transformers, it rebuilds every node it passes); ``enter`` returning False
    skips a node's children. ``leave``, where given, is called on each node after the nodes
    under it."""
    stack = [node]
    if leave is None:
        while stack:
            current = stack.pop()
            if enter(current) is not False:
                stack.extend(reversed(children(current)))
        return
    pop, push = stack.pop, stack.append
    while stack:
        current = pop()
        if current is _LEAVING:
            leave(pop())
            continue
        if enter(current) is not False:
            below = children(current)
            if below:
                push(current)
                push(_LEAVING)
                stack.extend(reversed(below))
                continue
        leave(current)


# On ``walk``'s stack, above a node whose children are below it: leave that node next.
_LEAVING = object()


def descendants(node: cst.CSTNode, prune: frozenset[type] = frozenset()):
    """The nodes under ``node``, for a plain ``for`` loop (which may stop early): each before the
    nodes under it, later siblings first (unlike ``walk``: reversing every list of children
    doubles the cost of a walk). A node whose type is in ``prune`` comes, the nodes under it do not."""
    stack = list(children(node))
    while stack:
        current = stack.pop()
        yield current
        if type(current) not in prune:
            stack.extend(children(current))


def rebuilt(node: cst.CSTNode, leave, enter=None):
    """``node`` rewritten from the bottom up, as a libcst transformer's visit rewrites it:
    ``enter(node)`` first (False: its children stay as they are), then ``leave(original,
    updated)`` gives what stands for the node, ``updated`` being it with its children so
    rewritten. A node none of whose children changed is kept rather than copied. Whitespace,
    parentheses and punctuation are neither entered nor left (``children``)."""
    updated = node
    if enter is None or enter(node) is not False:
        changed = None
        for child in children(node):
            new = rebuilt(child, leave, enter)
            if new is not child:
                changed = changed or {}
                changed[child] = new
        if changed:
            updated = node._visit_and_replace_children(Replacing(changed))
    return leave(node, updated)


def origins(original: cst.CSTNode, updated: cst.CSTNode) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each node of ``updated`` -> the node of ``original`` it was made from, as far as the two
    have the same shape: a subtree that another rule rewrote (``x.cuda()`` -> ``x.to(device)``)
    stands for the original as a whole, and the nodes new inside it for nothing. Where a rule
    inserted or removed statements, the children are aligned by their code."""
    found = {}
    pairs = [(original, updated)]  # two trees in step, which ``walk`` (one tree's) cannot follow
    while pairs:
        before, after = pairs.pop()
        if type(before) is not type(after):
            continue
        found[after] = before
        inside, made = children(before), children(after)
        pairs.extend(zip(inside, made) if len(inside) == len(made) else _aligned(inside, made))
    return found


def _aligned(inside: list[cst.CSTNode], made: list[cst.CSTNode]):
    """The pairs of ``inside`` and ``made`` that a diff of their code lines up: unchanged ones,
    and changed ones where as many stand in the same place."""
    code = cst.Module([]).code_for_node
    matcher = difflib.SequenceMatcher(None, [code(node) for node in inside], [code(node) for node in made], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or tag == "replace" and i2 - i1 == j2 - j1:
            yield from zip(inside[i1:i2], made[j1:j2])


def holds(tree: cst.CSTNode, wanted) -> bool:
    """Whether ``tree`` is, or has inside it, a node of ``wanted`` (a node, or a set of nodes)."""
    targets = wanted if isinstance(wanted, (set, frozenset)) else {wanted}
    found = False

    def enter(child):
        nonlocal found
        found = found or child in targets
        return not found

    walk(tree, enter)
    return found
