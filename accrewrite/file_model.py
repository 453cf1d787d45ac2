"""What a file declares, as the analysis walk reads it once: its imports and the qualified names
they give, its functions and classes, the names each body binds, what it assigns and calls, the
names that hold its models and loaders.

The walk (``accrewrite.analysis``) builds a ``FileFacts`` when it has seen the whole file; the
value analysis (``accrewrite.values``) and every rule read it. It is immutable: nothing reads a
half-built one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import libcst as cst

from accrewrite.nodes import dotted
from accrewrite.targets import modules_imported_as_named


@dataclass(frozen=True, eq=False)
class DefinedFunction:
    """A function of the file: its class (for methods), the function it is in, its parameters."""

    owner: cst.ClassDef | None
    parent: cst.FunctionDef | None
    params: tuple[str, ...]


@dataclass(frozen=True)
class Definitions:
    """The file's functions and classes, noted as the analysis walk meets them (``note``), read
    through ``frozen()`` once it has ended."""

    functions: Mapping[cst.FunctionDef, DefinedFunction] = field(default_factory=dict)
    # Module-level classes by name; module-level functions and classes by name.
    classes: Mapping[str, cst.ClassDef] = field(default_factory=dict)
    defined: Mapping[str, cst.CSTNode] = field(default_factory=dict)
    methods: Mapping[cst.ClassDef, Mapping[str, cst.FunctionDef]] = field(default_factory=dict)
    # Functions defined inside functions, by (enclosing function, name).
    nested: Mapping[tuple[cst.FunctionDef, str], cst.FunctionDef] = field(default_factory=dict)

    def note(self, node: cst.FunctionDef | cst.ClassDef, container: cst.FunctionDef | cst.ClassDef | None) -> None:
        """``node``, defined directly in ``container`` (its body, or a block of it), or at module
        level (None)."""
        owner = container if type(container) is cst.ClassDef else None
        parent = container if type(container) is cst.FunctionDef else None
        name = node.name.value
        if type(node) is cst.FunctionDef:
            params = tuple(p.name.value for p in (*node.params.posonly_params, *node.params.params))
            self.functions[node] = DefinedFunction(owner, parent, params)
            if owner is not None:
                self.methods.setdefault(owner, {})[name] = node
            elif parent is None:
                self.defined.setdefault(name, node)
            else:
                self.nested.setdefault((parent, name), node)
        else:
            if container is None:
                self.defined.setdefault(name, node)
                self.classes[name] = node
            self.methods.setdefault(node, {})

    def frozen(self) -> "Definitions":
        return Definitions(
            MappingProxyType(self.functions), MappingProxyType(self.classes), MappingProxyType(self.defined),
            MappingProxyType({owner: MappingProxyType(named) for owner, named in self.methods.items()}),
            MappingProxyType(self.nested),
        )


def qualname(imports: Mapping[str, str], node: cst.CSTNode) -> str | None:
    """The fully qualified name ``node`` refers to, through ``imports`` (local name -> qualified
    name); None when its root is not an imported name. A module that the file reads without
    importing it (``torch`` brought by ``from modeling.deeplab import *``) is the module of that
    name where a target's import line binds it so (``import torch``): once the migration adds that
    line, a second run reads the name through it, and must read it as the first did."""
    name = dotted(node)
    if name is None:
        return None
    root, _, rest = name.partition(".")
    base = imports.get(root)
    if base is None:
        if root not in modules_imported_as_named():
            return None
        base = root
    return f"{base}.{rest}" if rest else base


@dataclass(frozen=True, eq=False)
class FileFacts:
    """One file's declarations (see the module's docstring)."""

    module: cst.Module
    # The file's text, where the engine gives it: a word it lacks is named nowhere in the file.
    text: str | None
    # Local name -> fully qualified name, from the file's imports.
    imports: Mapping[str, str]
    # Modules imported without an alias (``import a.b.c``), in full.
    imported_modules: frozenset[str]
    definitions: Definitions
    # The names each function's body (and the module) binds, which are local to it throughout.
    local_names: Mapping[cst.CSTNode, frozenset[str]]
    # The class each method is defined in.
    method_class: Mapping[cst.FunctionDef, cst.ClassDef]
    # Names that hold a model (an ``nn.Module``) or a DataLoader.
    models: frozenset[str]
    loaders: frozenset[str]
    # Every plain ``name = value`` of the file (anywhere): name -> the values, in order.
    assignments: Mapping[str, tuple[cst.BaseExpression, ...]]
    # Every ``name = call(...)`` of the file: target -> the callee's qualified name.
    assigned_calls: Mapping[str, str]
    # Qualified names of everything the file calls.
    called: frozenset[str]
    # Every call of the file in source order, with the function it is in (None outside any).
    calls: tuple[tuple[cst.Call, cst.FunctionDef | None], ...]
    # The assignments of parsed command-line options (``args = parser.parse_args()``).
    option_parses: tuple[cst.Assign, ...]
    # Module-level functions that return a parameter's value read on the host (apex's
    # ``def to_python_float(t): return t.float().item()``): name -> those parameters.
    returned_reads: Mapping[str, frozenset[str]]

    def qualname(self, node: cst.CSTNode) -> str | None:
        """``node``'s fully qualified name through the file's imports (see ``qualname``)."""
        return qualname(self.imports, node)
