"""TorchAcc 1.x's module names, answered by accrewrite.runtime.

The ``torchacc`` target writes TorchAcc 1.x's imports, as TorchAcc's migration guide spells
them. Each has a counterpart in the runtime (``MODULES``; docs/torchacc_names.md is the table):
``torchacc.torch_xla.*`` are torch_xla's modules, which the runtime mirrors (see
docs/torch_xla_conformance.md), and ``torchacc.runtime.*`` and ``torchacc.auto_checkpoint`` are
the runtime's own fused modules, hooks, IO and memory helpers under the same names.

So a script migrated to the ``torchacc`` target runs where TorchAcc is not installed::

    python -m accrewrite.runtime.torchacc_names train.py --epochs 1
    accrun --nproc_per_node 2 -m accrewrite.runtime.torchacc_names train.py

For that process an import hook answers the ``torchacc`` names with the runtime's modules. In a
process of your own, ``with torchacc_names(): ...`` installs the hook and takes it out again
(with the ``torchacc`` modules it imported); nothing is installed by importing this module.
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import pathlib
import runpy
import sys
import types
from types import MappingProxyType

RUNTIME = "accrewrite.runtime"
# TorchAcc 1.x module -> the runtime's. Below ``torchacc.runtime`` a name keeps its tail.
MODULES = MappingProxyType({
    "torchacc.torch_xla.core.xla_model": f"{RUNTIME}.xla_model",
    "torchacc.torch_xla.distributed.parallel_loader": f"{RUNTIME}.parallel_loader",
    "torchacc.torch_xla.distributed.xla_backend": f"{RUNTIME}.distributed.xla_backend",
    "torchacc.torch_xla.amp": f"{RUNTIME}.amp",
    "torchacc.torch_xla.amp.syncfree": f"{RUNTIME}.amp.syncfree",
    "torchacc.torch_xla.runtime": f"{RUNTIME}.xla_runtime",
    "torchacc.runtime": RUNTIME,
})
# Packages that only hold the modules above; ``torchacc`` itself also forwards the runtime's
# top-level names (``torchacc.auto_checkpoint``).
PACKAGES = frozenset({"torchacc", "torchacc.torch_xla", "torchacc.torch_xla.core", "torchacc.torch_xla.distributed"})


def counterpart(name):
    """The runtime module that answers TorchAcc's module ``name``; None for a package above
    them; KeyError where the runtime has none."""
    if name in PACKAGES:
        return None
    if name in MODULES:
        return MODULES[name]
    if name.startswith("torchacc.runtime."):
        return RUNTIME + name[len("torchacc.runtime"):]
    raise KeyError(name)


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchacc`` modules and loads each as its runtime counterpart (the same module
    object under a second name, as ``sys.modules`` allows)."""

    def __init__(self):
        self._specs = {}  # the counterpart's own __spec__, put back after the import machinery set it

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "torchacc":
            return None
        try:
            counterpart(name)
        except KeyError:
            return None  # "No module named ...", as for any module that does not exist
        return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)

    def create_module(self, spec):
        target = counterpart(spec.name)
        if target is None:
            module = types.ModuleType(spec.name)
            if spec.name == "torchacc":
                module.__getattr__ = lambda attribute: getattr(importlib.import_module(RUNTIME), attribute)
            return module
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"No module named {spec.name!r}: accrewrite.runtime has no {target!r}", name=spec.name
            ) from error
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        own = self._specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own


def install():
    """Answer the ``torchacc`` names from now on in this process; returns the hook."""
    hook = _Hook()
    sys.meta_path.insert(0, hook)
    return hook


def uninstall(hook):
    """Take ``hook`` out, and the ``torchacc`` names it answered out of ``sys.modules``."""
    sys.meta_path.remove(hook)
    for name in [n for n in sys.modules if n.split(".")[0] == "torchacc"]:
        del sys.modules[name]


@contextlib.contextmanager
def torchacc_names():
    hook = install()
    try:
        yield
    finally:
        uninstall(hook)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print("usage: python -m accrewrite.runtime.torchacc_names SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, str(pathlib.Path(script).resolve().parent))
    install()
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
