"""The names an expression reads, and those an assignment target or an expression binds."""

from __future__ import annotations

import libcst as cst

from accrewrite.nodes import dotted, walk


# Names ----------------------------------------------------------------------------------------


def read_names(node: cst.CSTNode) -> set[str]:
    """The names an expression reads: ``a`` and ``c`` of ``a.b(k=c)`` (not attribute names or keywords)."""
    return _reads(node, chains=False)


def read_chains(node: cst.CSTNode) -> set[str]:
    """The names and dotted chains an expression reads: ``a``, ``a.b`` and ``c`` of ``a.b(k=c)``."""
    return _reads(node, chains=True)


def _reads(node: cst.CSTNode, chains: bool) -> set[str]:
    found: set[str] = set()
    labels: set[int] = set()  # the attribute names and keywords met: they name nothing read

    def enter(child):
        kind = type(child)
        if kind is cst.Name:
            if id(child) not in labels:
                found.add(child.value)
        elif kind is cst.Attribute:
            labels.add(id(child.attr))
            chain = dotted(child) if chains else None
            if chain:
                found.add(chain)
        elif kind is cst.Arg and child.keyword is not None:
            labels.add(id(child.keyword))

    walk(node, enter)
    return found


def target_names(target: cst.CSTNode) -> set[str]:
    """The plain names an assignment target binds (``a``, ``a, (b, *c)``; not ``a.b`` or ``a[i]``)."""
    return {name.value for name in target_nodes(target)}


def target_nodes(target: cst.CSTNode) -> list[cst.Name]:
    """The ``Name`` nodes of the names an assignment target binds."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in target_nodes(element.value)]
    if isinstance(target, cst.StarredElement):
        return target_nodes(target.value)
    return []


def bound_names(node: cst.CSTNode) -> set[str]:
    """The names an expression binds for itself: comprehension targets and lambda parameters."""
    found: set[str] = set()

    def enter(child):
        if isinstance(child, cst.CompFor):
            found.update(target_names(child.target))
        elif isinstance(child, cst.Lambda):
            found.update(p.name.value for p in child.params.params)
        return True

    walk(node, enter)
    return found
