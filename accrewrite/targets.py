"""Target profiles: how each target spells the concepts that rules ask for.

Rules decide *where* a change goes and *which concept* it needs ("the device", "the seed call");
a target's profile, one TOML file, decides the spelling: a code template and the import lines it
needs, the capabilities its device has, and what ``accrewrite verify`` needs of it. A concept
missing from a profile means the target lacks it. Profiles are checked against the catalogue of
concepts (``accrewrite.concepts``) when they load, and their spellings of the concepts that only
a rule defines (a fused kernel's, ``Rule.defines``) once the rules load.

The bundled profiles are ``rules/targets/<name>.toml``. An installed package adds a target
through the ``accrewrite.targets`` entry-point group: the entry point's name is the target's,
its value a package that holds ``<name>.toml``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import os
import re
import string
import sys
from dataclasses import dataclass, field
from importlib import resources

from accrewrite.concepts import CATALOGUE, Definition, Kind
from accrewrite.plugins import entry_points

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
class Verification:
    """What ``accrewrite verify`` needs of a target: the profile's ``[verify]`` table."""

    # The type of the device a side trains on, as torch names it ("xla").
    device: str = ""
    # Random numbers for the device are drawn by the CPU generator and moved there, so that
    # dropout and noise draw what the original's CPU run draws.
    host_random: bool = False
    # ``module:Class``: a device loader built as torch_xla's ParallelLoader, which reads ahead of
    # the loop on a thread; held to the loop's pace where the loader it wraps has no workers, so
    # that what loading draws from the global generator falls between the loop's draws as in the
    # original. Empty: the target's loader loads where the original's does.
    paced_loader: str = ""
    # ``module:Class`` each: a framework's accelerator class that looks for the target's hardware
    # itself (Lightning's XLAAccelerator counts the host's TPU chips) and whose ``is_available``
    # and ``auto_device_count`` verify answers with the one device a side runs on, where that
    # hardware is absent (the CPU under PJRT_DEVICE=CPU).
    device_finders: tuple[str, ...] = ()
    # Set in each side's processes where the user has not set them.
    environment: dict[str, str] = field(default_factory=dict)
    # A module whose ``metric_data(name)`` gives (count, ...) as torch_xla's metrics do, and the
    # metrics that count the graphs a side compiled and executed and its transfers to the host;
    # empty: not counted.
    metrics: str = ""
    compile_metric: str = ""
    execution_metric: str = ""
    transfer_metric: str = ""
    # ``module:function`` that waits until the graphs launched so far have run, where the target
    # counts an execution when it runs (on a thread of its own), not when it is launched.
    wait: str = ""
    # Set in each side's processes to have the target write, for every compilation, the Python
    # frames that triggered it (torch_xla's debug analysis); ``analysis_file`` names the variable
    # that says where, which the probe sets to a file of its own.
    analysis: dict[str, str] = field(default_factory=dict)
    analysis_file: str = ""
    # ``module:function`` each: a lazy graph's hash and its text as HLO, for the tensors given;
    # where a step's graph is new, the lines that made the operations the previous step's lacks.
    graph_hash: str = ""
    graph_text: str = ""


@dataclass(frozen=True)
class Unchecked:
    """A profile's spelling of a concept the catalogue lacks, as the profile wrote it: a rule
    may define the concept (``Rule.defines``), which the rules' registry checks it against."""

    name: str
    spec: dict
    origin: str


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    # Name of the switch function that --guard writes (TorchAcc's migration guide: enable_torchacc_compiler).
    guard_function: str = "enable_accelerator"
    imports: dict[str, str] = field(default_factory=dict)
    concepts: dict[str, Concept] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    # The package of the target's own modules (``torch_xla``): a file importing from it is
    # written for this target. Empty for a target spelled with torch alone.
    package: str = ""
    verify: Verification = field(default_factory=Verification)
    # The spellings of concepts that only a rule defines, checked once the rules load.
    unchecked: tuple[Unchecked, ...] = ()

    def has(self, *concepts: str) -> bool:
        """Whether the target spells each concept or holds each capability."""
        return all(name in self.concepts or name in self.capabilities for name in concepts)

    def concept(self, name: str) -> Concept:
        try:
            return self.concepts[name]
        except KeyError:
            raise ConceptMissing(self.name, name) from None

    def import_line(self, key: str) -> str:
        return self.imports[key]

    def clear_of(self, bound: dict[str, str], assigned: frozenset[str] = frozenset()) -> "Target":
        """This profile with its import aliases renamed where the file binds the same name to
        something else: imports another module as it (a module of the project's own called
        ``xm``), or, among ``assigned``, binds it in a function (``autocast = ...``, which the
        target's ``from accrewrite.runtime.amp import autocast`` must not stand for there).
        ``xm`` becomes ``xm_runtime``. A file importing another target's modules never gets here (the engine
        refuses it)."""
        renames = {}
        for line in self.imports.values():
            for local, qualified in import_bindings(line):
                # A name imported by name from elsewhere is one the migration replaces (``from
                # torch.cuda.amp import autocast``); a module alias is another module's.
                taken = bound[local] != qualified and not line.startswith("from ") if local in bound \
                    else local in assigned and local != qualified
                if taken:
                    renames[local] = f"{local}_{self.name}"
        if not renames:
            return self
        used = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, renames)) + r")\b")
        by_name = re.compile(r"^(from \S+ import )(" + "|".join(map(re.escape, renames)) + r")$")

        def rename(text: str) -> str:
            return used.sub(lambda m: renames[m.group(1)], text)

        def rename_import(line: str) -> str:
            aliased = by_name.sub(lambda m: f"{m.group(1)}{m.group(2)} as {renames[m.group(2)]}", line)
            if aliased != line:
                return aliased
            return re.sub(r"(?<= as )(\w+)$", lambda m: renames.get(m.group(1), m.group(1)), line)

        concepts = {
            name: dataclasses.replace(
                concept,
                expr=rename(concept.expr) if concept.expr is not None else None,
                stmts=tuple(rename(stmt) for stmt in concept.stmts),
            )
            for name, concept in self.concepts.items()
        }
        imports = {key: rename_import(line) for key, line in self.imports.items()}
        return dataclasses.replace(self, imports=imports, concepts=concepts)


class ProfileError(ValueError):
    """A target profile that cannot be used; the message names its file and what to change."""


ENTRY_POINT_GROUP = "accrewrite.targets"
_PROFILE_KEYS = ("name", "summary", "guard_function", "imports", "concepts", "capabilities", "verify")
_SPELLING_KEYS = ("expr", "stmts", "imports", "keep", "rebind")
_VERIFY_KEYS = ("device", "host_random", "paced_loader", "device_finders", "environment", "executions")
_EXECUTION_KEYS = ("metrics", "compiles", "executions")  # and, optional:
_EXECUTION_EXTRAS = ("transfers", "wait", "analysis", "analysis_file", "graph_hash", "graph_text")


def _closest(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _unknown_keys(table: dict, known: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in known:
            raise ProfileError(f"{where}: unknown key {key!r}{_closest(key, known)} (known: {', '.join(known)})")


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: {key} is a table ([{key}] or {key} = {{ ... }}), not {value!r}")
    return value


def _parse(data: dict, origin: str) -> Target:
    _unknown_keys(data, _PROFILE_KEYS, origin)
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ProfileError(f"{origin}: no name = \"...\": the target's name, as --target takes it")
    if not str(data.get("guard_function", "_")).isidentifier():
        raise ProfileError(f"{origin}: guard_function = {data['guard_function']!r} is not a Python name")
    specs = _table(data, "concepts", origin)
    imports = {**_imports(_table(data, "imports", origin), origin), **_written_in_concepts(specs)}
    concepts = {name: _concept(name, spec, imports, origin, CATALOGUE.get(name)) for name, spec in specs.items()}
    capabilities = _capabilities(_table(data, "capabilities", origin), origin)
    _check_complete({*concepts, *capabilities}, origin)
    return Target(
        name=data["name"],
        summary=data.get("summary", ""),
        guard_function=data.get("guard_function", Target.guard_function),
        imports=imports,
        concepts=concepts,
        capabilities=capabilities,
        package=_package(imports.values(), origin),
        verify=_verification(_table(data, "verify", origin), origin),
        unchecked=tuple(Unchecked(name, spec, origin) for name, spec in specs.items() if name not in CATALOGUE),
    )


def _imports(table: dict, origin: str) -> dict[str, str]:
    """``[imports]``: each line one import statement (``import a.b as c``, ``from a import b``)."""
    for key, line in table.items():
        if not _is_one_import(line):
            raise ProfileError(f"{origin}: [imports] {key} = {line!r} is not one import statement")
    return dict(table)


def _is_one_import(line) -> bool:
    try:
        statement = ast.parse(line).body if isinstance(line, str) else None
    except SyntaxError:
        return False
    return bool(statement) and len(statement) == 1 and isinstance(statement[0], (ast.Import, ast.ImportFrom))


def _written_in_concepts(specs: dict) -> dict[str, str]:
    """The import statements that concepts name in place of an ``[imports]`` key, each its own
    key: a spelling on one line, ``name = { expr = "...", imports = ["from a import b"] }``."""
    return {line: line for spec in specs.values() if isinstance(spec, dict)
            for line in spec.get("imports", ()) if _is_one_import(line)}


def _concept(name: str, spec, imports: dict[str, str], origin: str, definition: Definition | None) -> Concept:
    """One ``[concepts.NAME]`` table, checked against its definition. Without one (a concept the
    catalogue lacks, which a rule may define) it is read as a spelling only: ``check_defined``
    checks it against the rules' definitions once they load."""
    where = f"{origin}: [concepts.{name}]"
    if definition is not None and definition.kind is Kind.CAPABILITY:
        raise ProfileError(f"{where}: {name!r} is a capability, which has no spelling: list it under "
                           f"[capabilities] as {name} = true")
    if not isinstance(spec, dict):
        raise ProfileError(f"{where}: a table of {', '.join(_SPELLING_KEYS)}, not {spec!r}")
    _unknown_keys(spec, _SPELLING_KEYS, where)
    forms = [key for key in ("expr", "stmts") if key in spec]
    allowed = definition.forms if definition is not None else ("expr", "stmts")
    if len(forms) != 1 or forms[0] not in allowed:
        kind = f"{name!r} is {_article(definition.kind.value)}, spelled" if definition is not None else "spelled"
        raise ProfileError(f"{where}: {kind} with {' or '.join(allowed)} (one of them)")
    for flag in ("keep", "rebind"):
        if flag in spec and definition is not None and flag not in definition.flags:
            raise ProfileError(f"{where}: {flag!r} means nothing for {name!r}")
    for key in spec.get("imports", ()):
        if key not in imports:
            raise ProfileError(f"{where}: imports {key!r}, not in [imports]{_closest(key, imports)}")
    texts = [spec["expr"]] if "expr" in spec else spec["stmts"]
    if isinstance(texts, str) or not texts or not all(isinstance(text, str) for text in texts):
        raise ProfileError(f"{where}: {forms[0]} is {'a string' if forms[0] == 'expr' else 'a list of strings'}")
    for text in texts if definition is not None else ():
        _check_template(text, definition, "eval" if forms[0] == "expr" else "exec", where)
    return Concept(
        name=name,
        expr=spec.get("expr"),
        stmts=tuple(spec.get("stmts", ())),
        imports=tuple(spec.get("imports", ())),
        keep=bool(spec.get("keep", False)),
        rebind=bool(spec.get("rebind", True)),
    )


def _article(word: str) -> str:
    return word if word.endswith("s") else f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _check_template(text: str, definition: Definition, mode: str, where: str) -> None:
    """The placeholders are the rule's, and the text is Python once they are filled."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(text) if field is not None]
    except ValueError as exc:
        raise ProfileError(f"{where}: {text!r}: {exc} (a literal brace is written twice)") from None
    for field_name in fields:
        if field_name not in definition.placeholders:
            filled = ", ".join(f"{{{p}}}" for p in definition.placeholders) or "none"
            raise ProfileError(f"{where}: {text!r} uses {{{field_name}}}, which the rules do not fill "
                               f"(they fill: {filled})")
    try:
        compile(text.format(**{p: "_" for p in definition.placeholders}), where, mode)
    except SyntaxError as exc:
        raise ProfileError(f"{where}: {text!r} is not a Python {'expression' if mode == 'eval' else 'statement'} "
                           f"({exc.msg})") from None


def _capabilities(table, origin: str) -> frozenset[str]:
    where = f"{origin}: [capabilities]"
    held = set()
    for name, value in table.items():
        definition = CATALOGUE.get(name)
        if definition is None or definition.kind is not Kind.CAPABILITY:
            capabilities = [n for n, d in CATALOGUE.items() if d.kind is Kind.CAPABILITY]
            hint = (f": {name!r} has a spelling, in a [concepts.{name}] table" if definition is not None
                    else _closest(name, capabilities))
            raise ProfileError(f"{where}: {name!r} is no capability{hint} (capabilities: {', '.join(capabilities)})")
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: {name} = true or false, not {value!r}")
        if value:
            held.add(name)
    return frozenset(held)


def _check_complete(held: set[str], origin: str, definitions: dict[str, Definition] = CATALOGUE) -> None:
    """Every target has the required concepts, and each concept comes with what the rules that
    use it read unasked."""
    meanings = {**CATALOGUE, **definitions}
    for name, definition in definitions.items():
        if definition.required and name not in held:
            raise ProfileError(f"{origin}: no [concepts.{name}] ({definition.meaning}): every target spells it")
        if name not in held:
            continue
        for needed in definition.needs:
            if needed not in held:
                raise ProfileError(f"{origin}: {name!r} needs {needed!r} too ({meanings[needed].meaning}): "
                                   f"the rules that use {name!r} write it; add it")
        if definition.needs_one_of and not held & set(definition.needs_one_of):
            raise ProfileError(f"{origin}: {name!r} needs one of {', '.join(map(repr, definition.needs_one_of))} "
                               f"too: the rules that use {name!r} write it; add one")


def _verification(table, origin: str) -> Verification:
    where = f"{origin}: [verify]"
    _unknown_keys(table, _VERIFY_KEYS, where)
    environment = table.get("environment", {})
    if not isinstance(environment, dict) or not all(isinstance(v, str) for v in environment.values()):
        raise ProfileError(f"{where}: environment is a table of strings (NAME = \"value\")")
    executions = _table(table, "executions", where)
    _unknown_keys(executions, _EXECUTION_KEYS + _EXECUTION_EXTRAS, f"{where} executions")
    if executions and not set(_EXECUTION_KEYS) <= set(executions):
        raise ProfileError(f"{where}: executions names {', '.join(_EXECUTION_KEYS)}, all three")
    analysis = executions.get("analysis", {})
    if not isinstance(analysis, dict) or not all(isinstance(v, str) for v in analysis.values()):
        raise ProfileError(f"{where}: executions' analysis is a table of strings (NAME = \"value\")")
    for key in ("wait", "graph_hash", "graph_text"):
        function = executions.get(key, "")
        if function and not _is_class_path(function):
            raise ProfileError(f"{where}: executions' {key} names a function as module:function, not {function!r}")
    if bool(executions.get("graph_hash")) != bool(executions.get("graph_text")):
        raise ProfileError(f"{where}: executions names graph_hash and graph_text, both or neither")
    device = table.get("device", "")
    if (executions or table.get("host_random")) and not device:
        raise ProfileError(f"{where}: host_random and executions are about the device: name it (device = \"...\")")
    paced_loader = table.get("paced_loader", "")
    if "paced_loader" in table and not _is_class_path(paced_loader):
        raise ProfileError(f"{where}: paced_loader names a class as module:Class, not {paced_loader!r}")
    finders = table.get("device_finders", [])
    if not isinstance(finders, list) or not all(isinstance(f, str) and _is_class_path(f) for f in finders):
        raise ProfileError(f"{where}: device_finders is a list of classes as module:Class, not {finders!r}")
    return Verification(
        device=device,
        host_random=bool(table.get("host_random", False)),
        paced_loader=paced_loader,
        device_finders=tuple(finders),
        environment=dict(environment),
        metrics=executions.get("metrics", ""),
        compile_metric=executions.get("compiles", ""),
        execution_metric=executions.get("executions", ""),
        transfer_metric=executions.get("transfers", ""),
        wait=executions.get("wait", ""),
        analysis=dict(analysis),
        analysis_file=executions.get("analysis_file", ""),
        graph_hash=executions.get("graph_hash", ""),
        graph_text=executions.get("graph_text", ""),
    )


def _is_class_path(text) -> bool:
    """``package.module:Class``: dotted identifiers, a colon, an identifier."""
    module, colon, name = text.partition(":") if isinstance(text, str) else ("", "", "")
    return bool(colon) and name.isidentifier() and all(part.isidentifier() for part in module.split("."))


def _package(lines, origin: str) -> str:
    """The package that a profile's import lines have in common, leaving out the modules a plain
    PyTorch script imports already (the standard library's, torch's); none for a target spelled
    with those alone."""
    own = [
        module.split(".") for module in (line.split()[1] for line in lines)
        if module.split(".")[0] not in sys.stdlib_module_names and module.split(".")[0] != "torch"
    ]
    common = os.path.commonprefix(own)  # element by element: dotted names' parts
    if own and not common:
        raise ProfileError(f"{origin}: the target's own imports have no package in common")
    return ".".join(common)


def _load(profile, origin: str) -> Target:
    try:
        data = tomllib.loads(profile.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"{origin}: {exc}") from None
    return _parse(data, origin)


def _installed_profiles():
    """(target name, profile file, origin) for each ``accrewrite.targets`` entry point: it names a
    package that holds ``<entry point's name>.toml``."""
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        where = f"{ENTRY_POINT_GROUP} entry point {entry_point.name!r} = {entry_point.value!r}"
        try:
            profile = resources.files(entry_point.load()).joinpath(f"{entry_point.name}.toml")
        except (ImportError, TypeError) as exc:
            raise ProfileError(f"{where}: cannot load its package ({exc})") from None
        if not profile.is_file():
            raise ProfileError(f"{where}: no {entry_point.name}.toml in that package")
        yield entry_point.name, profile, f"{profile} ({where})"


@functools.cache
def all_targets() -> dict[str, Target]:
    """Every target by name: the bundled profiles, then those that installed packages add."""
    folder = resources.files("accrewrite.rules").joinpath("targets")
    sources = [(None, entry, entry.name) for entry in sorted(folder.iterdir(), key=lambda e: e.name)
               if entry.name.endswith(".toml")]
    targets: dict[str, Target] = {}
    origins: dict[str, str] = {}
    for claimed, profile, origin in [*sources, *_installed_profiles()]:
        target = _load(profile, origin)
        if claimed is not None and target.name != claimed:
            raise ProfileError(f"{origin}: the profile is named {target.name!r}, its entry point {claimed!r}: "
                               "give both one name")
        if target.name in targets:
            raise ProfileError(f"{origin} and {origins[target.name]} both define target {target.name!r}")
        targets[target.name], origins[target.name] = target, origin
    return targets


def check_defined(definitions: dict[str, Definition]) -> None:
    """Checks each profile's spellings of concepts that the catalogue lacks against the rules'
    own definitions (``definitions``, by name), as those of the catalogue's are checked when a
    profile loads: a name no rule defines is an error, and so is a spelling of the wrong kind."""
    for target in all_targets().values():
        for spelled in target.unchecked:
            definition = definitions.get(spelled.name)
            if definition is None:
                known = {**CATALOGUE, **definitions}
                raise ProfileError(f"{spelled.origin}: [concepts.{spelled.name}]: {spelled.name!r} is no concept a "
                                   f"rule asks for{_closest(spelled.name, known)} (the catalogue is "
                                   "accrewrite/concepts.py, or a rule's `defines`)")
            _concept(spelled.name, spelled.spec, target.imports, spelled.origin, definition)
            _check_complete({*target.concepts, *target.capabilities}, spelled.origin, {spelled.name: definition})


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


@functools.cache
def import_bindings(line: str) -> tuple[tuple[str, str], ...]:
    """(local name, qualified name) of each name that the import line ``line`` binds, as the
    analysis records a file's imports: ``import a.b`` binds ``a``, ``import a.b as x`` binds
    ``x`` to ``a.b``, ``from m import n as k`` binds ``k`` to ``m.n``. Read with ``ast``: the
    profiles load without libcst (``accrewrite --version`` imports no parser)."""
    (node,) = ast.parse(line).body
    if isinstance(node, ast.Import):
        return tuple((a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2 for a in node.names)
    module = "." * node.level + (f"{node.module}." if node.module else "")
    return tuple((a.asname or a.name, f"{module}{a.name}") for a in node.names if a.name != "*")


@functools.cache
def modules_imported_as_named() -> frozenset[str]:
    """The modules that a target's import line binds under their own name (``import torch``)."""
    return frozenset(local for target in all_targets().values() for line in target.imports.values()
                     for local, qualified in import_bindings(line) if local == qualified)


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
            bound.update(import_bindings(target.imports[key]))
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
