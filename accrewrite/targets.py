"""Target profiles: how each target spells the concepts that rules ask for.

Rules decide *where* a change goes and *which concept* it needs ("the device", "the seed call");
a profile in ``rules/targets/<name>.toml`` decides the spelling: a code template and the import
lines it needs. A concept missing from a profile means the target lacks it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import sys
from dataclasses import dataclass, field
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


class ConceptMissing(LookupError):
    """The target has no spelling for a concept a rule needs."""

    def __init__(self, target: str, concept: str):
        super().__init__(f"target {target!r} has no {concept!r}")
        self.target = target
        self.concept = concept


@dataclass(frozen=True)
class Concept:
    """One concept's spelling: an expression or statements, with ``{placeholder}`` fields."""

    name: str
    expr: str | None = None
    stmts: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    # The statements follow the original code instead of replacing it.
    keep: bool = False
    # The result stands in for the original object everywhere (same attributes), so it may be
    # bound to the original's name.
    rebind: bool = True

    def render_expr(self, **values: str) -> str:
        if self.expr is None:
            raise ValueError(f"concept {self.name!r} is spelled as statements, not an expression")
        return self.expr.format(**values)

    def render_stmts(self, **values: str) -> list[str]:
        if not self.stmts:
            raise ValueError(f"concept {self.name!r} is spelled as an expression, not statements")
        return [stmt.format(**values) for stmt in self.stmts]


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    # Name of the switch function that --guard writes (TorchAcc's migration guide: enable_torchacc_compiler).
    guard_function: str = "enable_accelerator"
    imports: dict[str, str] = field(default_factory=dict)
    concepts: dict[str, Concept] = field(default_factory=dict)
    # The package of the target's own modules (``torch_xla``): a file importing from it is
    # written for this target.
    package: str = ""

    def has(self, *concepts: str) -> bool:
        return all(name in self.concepts for name in concepts)

    def concept(self, name: str) -> Concept:
        try:
            return self.concepts[name]
        except KeyError:
            raise ConceptMissing(self.name, name) from None

    def import_line(self, key: str) -> str:
        return self.imports[key]

    def clear_of(self, bound: dict[str, str]) -> "Target":
        """This profile with its import aliases renamed where the file binds the same name to
        something else (a module of the project's own called ``xm``): ``xm`` becomes
        ``xm_runtime``. A file importing another target's modules never gets here (the engine
        refuses it)."""
        renames = {}
        for line in self.imports.values():
            for local, qualified in _import_bindings(line).items():
                if local in bound and bound[local] != qualified:
                    renames[local] = f"{local}_{self.name}"
        if not renames:
            return self
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b(?=\.)|(?<= as )(" + "|".join(map(re.escape, renames)) + r")$")

        def rename(text: str) -> str:
            return pattern.sub(lambda m: renames[m.group(1) or m.group(2)], text)

        concepts = {
            name: dataclasses.replace(
                concept,
                expr=rename(concept.expr) if concept.expr is not None else None,
                stmts=tuple(rename(stmt) for stmt in concept.stmts),
            )
            for name, concept in self.concepts.items()
        }
        return dataclasses.replace(self, imports={k: rename(v) for k, v in self.imports.items()}, concepts=concepts)


def _parse(data: dict, origin: str) -> Target:
    imports = dict(data.get("imports", {}))
    concepts = {}
    for name, spec in data.get("concepts", {}).items():
        unknown = set(spec) - {"expr", "stmts", "imports", "keep", "rebind"}
        if unknown:
            raise ValueError(f"{origin}: concept {name!r} has unknown keys {sorted(unknown)}")
        if ("expr" in spec) == ("stmts" in spec):
            raise ValueError(f"{origin}: concept {name!r} needs exactly one of expr or stmts")
        for key in spec.get("imports", ()):
            if key not in imports:
                raise ValueError(f"{origin}: concept {name!r} imports {key!r}, not in [imports]")
        concepts[name] = Concept(
            name=name,
            expr=spec.get("expr"),
            stmts=tuple(spec.get("stmts", ())),
            imports=tuple(spec.get("imports", ())),
            keep=bool(spec.get("keep", False)),
            rebind=bool(spec.get("rebind", True)),
        )
    return Target(
        name=data["name"],
        summary=data.get("summary", ""),
        guard_function=data.get("guard_function", Target.guard_function),
        imports=imports,
        concepts=concepts,
        package=_package(imports.values(), origin),
    )


def _package(lines, origin: str) -> str:
    """The package that a profile's import lines have in common, leaving out the modules a plain
    PyTorch script imports already (the standard library's, torch's)."""
    own = [
        module.split(".") for module in (line.split()[1] for line in lines)
        if module.split(".")[0] not in sys.stdlib_module_names and module.split(".")[0] != "torch"
    ]
    common = os.path.commonprefix(own)  # element by element: dotted names' parts
    if not common:
        raise ValueError(f"{origin}: the target's own imports have no package in common")
    return ".".join(common)


@functools.cache
def all_targets() -> dict[str, Target]:
    """Every bundled target profile by name, in a stable order."""
    folder = resources.files("accrewrite.rules").joinpath("targets")
    targets = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            target = _parse(tomllib.loads(entry.read_text(encoding="utf-8")), entry.name)
            targets[target.name] = target
    return targets


def get_target(name: str) -> Target:
    targets = all_targets()
    if name not in targets:
        raise KeyError(unknown_target(name))
    return targets[name]


def unknown_target(name: str) -> str:
    """What to say about a target that does not exist: the closest name, and every name."""
    names = list(all_targets())
    close = difflib.get_close_matches(name.replace("-", "_").lower(), names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown target {name!r}{hint} (choose from {', '.join(names)})"


def _import_bindings(line: str) -> dict[str, str]:
    """Local name -> qualified name, for one import line of a profile."""
    words = line.split()
    if words[0] == "import":
        module = words[1]
        return {words[3]: module} if len(words) == 4 and words[2] == "as" else {module.split(".")[0]: module.split(".")[0]}
    module, names = words[1], " ".join(words[3:])
    bound = {}
    for part in names.split(","):
        name, _, alias = part.strip().partition(" as ")
        bound[alias.strip() or name] = f"{module}.{name}"
    return bound


@functools.cache
def spelled_callees(concept: str) -> frozenset[str]:
    """The qualified names of what each target's spelling of ``concept`` calls (or names): how a
    migrated file is recognised, from the profiles, whatever its target."""
    found = set()
    for target in all_targets().values():
        spelled = target.concepts.get(concept)
        if spelled is None:
            continue
        bound: dict[str, str] = {}
        for key in spelled.imports:
            bound.update(_import_bindings(target.imports[key]))
        for text in (spelled.expr or "", *spelled.stmts):
            head = re.sub(r"^\s*\w+\s*=\s*", "", text).split("(", 1)[0].strip()
            root, _, rest = head.partition(".")
            if root in bound:
                found.add(f"{bound[root]}.{rest}" if rest else bound[root])
    return frozenset(found)


@functools.cache
def called_names(concept: str) -> frozenset[str]:
    """The names of the functions that each target's spelling of ``concept`` is a call of
    (``add_step_closure``, ``reduce_gradients``, ``_fetch_gradients``): how a rule tells its own
    output, in any file."""
    found = set()
    for target in all_targets().values():
        spelled = target.concepts.get(concept)
        if spelled is not None:
            for text in (spelled.expr or "", *spelled.stmts):
                outer = re.match(r"\s*(?:\w+\s*=\s*)?[\w.]*?(\w+)\(", text)  # the call the line is
                if outer:
                    found.add(outer.group(1))
    return frozenset(found)


def written_for(module: str) -> str | None:
    """The target whose package ``module`` (a qualified name) is in: a file that imports it is
    written for that target."""
    return next(
        (name for name, target in all_targets().items() if module == target.package or module.startswith(target.package + ".")),
        None,
    )


DEFAULT_TARGET = "runtime"
