"""Lazy attributes for packages whose members pull heavy imports (torch, triton).

``accrewrite`` itself must import without torch (the codemod installs without it), and a script
that only needs ``xla_model`` should not pay for the kernels or the compiler.
"""

import importlib
from types import MappingProxyType


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
