"""A map from strings that is never changed in place: ``set`` and ``without`` give a new map that
shares all but the path to the changed entry with the old one.

The analysis of values keeps the names bound where each statement starts (``accrewrite.values``).
As plain dicts, each statement of a long module level copied every name bound before it, and
time and memory grew with the square of the file. Here a key's hash picks a path through three
levels of 16-slot tuples to a small dict (4,096 of them: a few names each in the largest file
the size limit lets in); a change copies that path, and ``merge`` and ``==`` descend only where
maps differ (a part two maps share is the same object). An empty part is None, so that equal
maps have equal shapes.
"""

from __future__ import annotations

from typing import Callable

_BITS = 4
_MASK = (1 << _BITS) - 1
_SHIFTS = (0, _BITS, 2 * _BITS)
_LEAF = len(_SHIFTS)
_ABSENT = object()
_EMPTY = (None,) * (_MASK + 1)

Bucket = dict | None
Combine = Callable[[list[Bucket], Bucket], dict]


class PersistentMap:
    __slots__ = ("_root",)

    def __init__(self, root=None):
        self._root = root

    def get(self, key: str, default=None):
        node = self._root
        code = hash(key)
        for shift in _SHIFTS:
            if node is None:
                return default
            node = node[(code >> shift) & _MASK]
        return default if node is None else node.get(key, default)

    def set(self, key: str, value) -> PersistentMap:
        return PersistentMap(_put(self._root, hash(key), 0, key, value))

    def without(self, key: str) -> PersistentMap:
        if self.get(key, _ABSENT) is _ABSENT:
            return self
        return PersistentMap(_put(self._root, hash(key), 0, key, _ABSENT))

    @classmethod
    def of(cls, other: PersistentMap) -> PersistentMap:
        """A map of this class with ``other``'s entries (all of it shared)."""
        return cls(other._root)

    def __eq__(self, other) -> bool:
        return isinstance(other, PersistentMap) and _equal(self._root, other._root, 0)


def merge(maps: list[PersistentMap], combine: Combine, before: PersistentMap | None = None) -> PersistentMap:
    """One map made of ``maps``: a part that all of them share (and ``before`` too, when given)
    is kept as it is; elsewhere each bucket is ``combine(the maps' buckets, before's bucket)``
    (None for a map without one)."""
    base = before._root if before is not None else None
    return PersistentMap(_merge([m._root for m in maps], base, before is not None, 0, combine))


def _put(node, code: int, level: int, key: str, value):
    if level == _LEAF:
        bucket = dict(node) if node is not None else {}
        if value is _ABSENT:
            del bucket[key]
        else:
            bucket[key] = value
        return bucket or None
    slots = list(node) if node is not None else [None] * (_MASK + 1)
    index = (code >> _SHIFTS[level]) & _MASK
    slots[index] = _put(slots[index], code, level + 1, key, value)
    if value is _ABSENT and not any(slots):
        return None
    return tuple(slots)


def _merge(nodes: list, base, anchored: bool, level: int, combine: Combine):
    first = nodes[0]
    if _shared(nodes, first) and (not anchored or first is base):
        return first
    if level == _LEAF:
        return combine(nodes, base) or None
    # Slot by slot: a slot every map shares (and ``base`` too) is kept without a call.
    slots = []
    for column, below in zip(zip(*[node or _EMPTY for node in nodes]), base or _EMPTY):
        head = column[0]
        if _shared(column, head) and (not anchored or head is below):
            slots.append(head)
        else:
            slots.append(_merge(column, below, anchored, level + 1, combine))
    return tuple(slots) if any(slots) else None


def _shared(parts, head) -> bool:
    """Whether every one of ``parts`` is ``head``. (Merges join two maps but for a few: a plain
    test for those, the most common call of a merge.)"""
    if len(parts) == 2:
        return parts[1] is head
    return all(part is head for part in parts)


def _equal(first, second, level: int) -> bool:
    if first is second:
        return True
    if first is None or second is None:
        return False
    if level == _LEAF:
        return first == second
    return all(_equal(a, b, level + 1) for a, b in zip(first, second))
