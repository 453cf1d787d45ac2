"""Lazy attributes for packages whose members pull heavy imports (torch, triton).

``accrewrite`` itself must import without torch (the codemod installs without it), and a script
that only needs ``xla_model`` should not pay for the kernels or the compiler.
"""

import ast
import importlib
import pathlib
import re
from types import MappingProxyType

# a module's ``__all__``, as its source spells it: a list of string literals
_ALL = re.compile(r"^__all__ = (\[[^\]]*\])", re.MULTILINE)


def lazy_attributes(package: str, attributes: dict[str, str]):
    """Return ``package``'s ``__all__`` and its module-level ``__getattr__``.

    ``attributes`` maps a public name to ``"submodule"`` (the name is that submodule) or
    ``"submodule:attr"`` (the name is an attribute of it).
    """
    attributes = MappingProxyType(dict(attributes))

    def __getattr__(name):
        try:
            spec = attributes[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module_name, _, attr = spec.partition(":")
        module = importlib.import_module(f"{package}.{module_name}")
        return getattr(module, attr) if attr else module

    return list(attributes), __getattr__


def submodule_attributes(folders) -> dict[str, str]:
    """``lazy_attributes``' map for a package that exports every public name of its modules:
    each name in a module's ``__all__`` (read from its source, so nothing is imported) is that
    module's. ``folders``: the package's ``__path__``."""
    attributes = {}
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("[!_]*.py")):
            found = _ALL.search(path.read_text())
            for name in ast.literal_eval(found.group(1)) if found else ():
                attributes[name] = f"{path.stem}:{name}"
    return attributes
