"""Finding rules and choosing which run.

Built-in rules are the ``Rule`` subclasses of the modules in ``accrewrite.rules``. Third-party
packs register through the ``accrewrite.rules`` entry-point group: an entry point's value is a
module (every Rule subclass defined in it is registered) or a single Rule class.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import pkgutil
from dataclasses import dataclass

from accrewrite.concepts import CATALOGUE, Definition
from accrewrite.plugins import entry_points
from accrewrite.rule import Rule
from accrewrite.targets import check_defined

ENTRY_POINT_GROUP = "accrewrite.rules"


class SelectionError(ValueError):
    """A rule asked for by a name or code that no rule has (``entry``: the select/ignore entry)."""

    def __init__(self, message: str, entry: str | None = None):
        super().__init__(message)
        self.entry = entry


def _rules_in(module) -> list[type[Rule]]:
    """The rules a module defines (classes with a code; shared base classes have none)."""
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Rule) and "code" in vars(obj)
        and obj.__module__ == module.__name__
    ]


@functools.cache
def all_rules() -> dict[str, type[Rule]]:
    """Every registered rule, by code, in code order."""
    import accrewrite.rules as package

    found: list[type[Rule]] = []
    for info in pkgutil.iter_modules(package.__path__):
        found += _rules_in(importlib.import_module(f"{package.__name__}.{info.name}"))
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry_point.load()
        found += _rules_in(loaded) if inspect.ismodule(loaded) else [loaded]
    defined = _definitions(found)
    by_code: dict[str, type[Rule]] = {}
    by_name: dict[str, type[Rule]] = {}
    for rule in found:
        own = {definition.name for definition in rule.defines}
        for concept in rule.concepts:
            if concept not in CATALOGUE and concept not in own:
                close = difflib.get_close_matches(concept, [*CATALOGUE, *own], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise RuntimeError(f"rule {rule.code} ({rule.__module__}) needs concept {concept!r}, which is not in "
                                   f"the catalogue (accrewrite/concepts.py) or its `defines`{hint}")
        for table, key in ((by_code, rule.code), (by_name, rule.name)):
            clash = table.setdefault(key, rule)
            if clash is not rule:
                raise RuntimeError(f"rules {clash.__module__} and {rule.__module__} both claim {key!r}")
    check_defined(defined)  # the profiles' spellings of the rules' own concepts
    return dict(sorted(by_code.items()))


def _definitions(rules: list[type[Rule]]) -> dict[str, Definition]:
    """The concepts the rules define themselves (``Rule.defines``), by name: each one rule's, and
    none the catalogue's."""
    defined: dict[str, Definition] = {}
    owners: dict[str, type[Rule]] = {}
    for rule in rules:
        for definition in rule.defines:
            name = definition.name
            if name in CATALOGUE:
                raise RuntimeError(f"rule {rule.code} ({rule.__module__}) defines concept {name!r}, which the "
                                   "catalogue (accrewrite/concepts.py) defines already")
            owner = owners.setdefault(name, rule)
            if owner is not rule:
                raise RuntimeError(f"rules {owner.__module__} and {rule.__module__} both define concept {name!r}")
            defined[name] = definition
    return defined


def find_rule(code_or_name: str) -> type[Rule]:
    key = code_or_name.strip()
    for rule in all_rules().values():
        if key.upper() == rule.code or key == rule.name:
            return rule
    raise SelectionError(f"no rule is called {code_or_name!r} (see `accrewrite rules`)")


@dataclass(frozen=True)
class Selection:
    """The rules that run on a file, and which of them may only offer their fixes."""

    rules: tuple[type[Rule], ...]
    withheld: frozenset[type[Rule]]


def _matches(rule: type[Rule], entry: str) -> bool:
    entry = entry.strip()
    return entry.upper() == "ALL" or rule.code.startswith(entry.upper()) or entry == rule.name


def selected_exactly(rule: type[Rule], entries) -> bool:
    """Whether ``entries`` (--select) name ``rule`` by its exact code or name."""
    return any(e.strip().upper() == rule.code or e.strip() == rule.name for e in entries)


def select(select: list[str] | None, ignore: list[str] | None, unsafe_fixes: bool) -> Selection:
    """Rules chosen as ruff chooses: ``select`` entries are codes, code prefixes (``ACC00``),
    names or ``ALL``; the default is every rule that is not opt-in. ``ignore`` removes rules the
    same way. An unsafe rule's fix is applied with ``unsafe_fixes`` or when the rule is selected
    by its exact code or name; otherwise it is only offered. Opt-in rules need their exact code
    or name."""
    rules = all_rules().values()
    for entry in [*(select or []), *(ignore or [])]:
        if not any(_matches(rule, entry) for rule in rules):
            raise SelectionError(f"{entry!r} matches no rule (see `accrewrite rules`)", entry)
    if select:
        chosen = [
            r for r in rules
            if (selected_exactly(r, select) or (not r.opt_in and any(_matches(r, e) for e in select)))
        ]
    else:
        chosen = [r for r in rules if not r.opt_in]
    chosen = [r for r in chosen if not any(_matches(r, e) for e in ignore or [])]
    withheld = frozenset(
        r for r in chosen if not r.safe and not unsafe_fixes and not selected_exactly(r, select or [])
    )
    return Selection(tuple(chosen), withheld)
