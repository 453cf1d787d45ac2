"""The package's layers only import downwards: the shared base (``accrewrite.base``) imports none
of the others; the kernels import the base; the runtime imports the base and the kernels' public
names; the engine (the rest of ``accrewrite``, and the rules) never imports the runtime or the
kernels, so that the codemod installs and runs without torch.

The import graph is built from the source (ast), with every import statement wherever it is (in a
function too) and relative imports resolved.
"""

import ast
import collections
import pathlib

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
# the source folders and the packages they install as (setup.py's mapping)
ROOTS = {
    "accrewrite": "accrewrite",
    "rules": "accrewrite.rules",
    "runtime": "accrewrite.runtime",
    "kernels": "accrewrite.kernels",
}
LAYERS = ("base", "kernels", "runtime", "engine")
# the layers each layer may import, besides itself
ALLOWED = {
    "base": set(),
    "kernels": {"base"},
    "runtime": {"base", "kernels"},
    "engine": {"base"},
}


def layer(module: str) -> str | None:
    """The layer of an accrewrite module; None for any other package."""
    parts = module.split(".")
    if parts[0] != "accrewrite":
        return None
    if parts[1:2] and parts[1] in ("base", "kernels", "runtime"):
        return parts[1]
    return "engine"


def modules() -> dict[str, pathlib.Path]:
    """Every module of the package, by its installed name."""
    found = {}
    for folder, package in ROOTS.items():
        for path in (REPOSITORY / folder).rglob("*.py"):
            parts = path.relative_to(REPOSITORY / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports(module: str, path: pathlib.Path) -> list[tuple[int, str]]:
    """The modules (and ``module.name`` for each name imported from one) that ``path`` imports,
    with their lines, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def private(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


def violations(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Each import that goes against the layers' direction, as ``importer:line -> imported``."""
    found = []
    for importer, targets in graph.items():
        source = layer(importer)
        for line, target in targets:
            destination = layer(target)
            if destination is None or destination == source:
                continue
            wrong = destination not in ALLOWED[source]
            # another layer's private module or name is no API, however low the layer
            wrong = wrong or private(target.removeprefix(f"accrewrite.{destination}"))
            if wrong:
                found.append(f"{importer}:{line} -> {target}")
    return found


def test_the_layers_import_only_downwards():
    graph = {module: imports(module, path) for module, path in modules().items()}
    assert {layer(module) for module in graph} == set(LAYERS)
    assert violations(graph) == []


@pytest.mark.parametrize("importer, target, wrong", [
    ("accrewrite.cli", "accrewrite.runtime.parallel.kinds", True),
    ("accrewrite.rules.acc020_fused_layer_norm", "accrewrite.kernels.layer_norm", True),
    ("accrewrite.kernels.dispatch", "accrewrite.runtime.accelerator", True),
    ("accrewrite.runtime.nn", "accrewrite.lazy", True),
    ("accrewrite.runtime.compiler.core.registry", "accrewrite.kernels.layer_norm._launch", True),
    ("accrewrite.base.lazy", "accrewrite.runtime", True),
    ("accrewrite.runtime.compiler.core.registry", "accrewrite.kernels.layer_norm", False),
    ("accrewrite.kernels.adam", "accrewrite.base.torch_compat", False),
    ("accrewrite.cli", "accrewrite.base.parallel_kinds", False),
    ("accrewrite.runtime.xla_model", "accrewrite.runtime._collectives", False),
])
def test_an_import_against_the_layers_is_found(importer, target, wrong):
    assert bool(violations({importer: [(1, target)]})) is wrong


def test_relative_and_function_level_imports_are_resolved(tmp_path):
    path = tmp_path / "module.py"
    path.write_text("from .. import accelerator\n\ndef f():\n    from .nn import _impl\n")
    assert imports("accrewrite.runtime.compiler.backend", path) == [
        (1, "accrewrite.runtime"), (1, "accrewrite.runtime.accelerator"),
        (4, "accrewrite.runtime.compiler.nn"), (4, "accrewrite.runtime.compiler.nn._impl"),
    ]


def test_no_module_name_is_used_by_more_than_two_modules():
    """A file name says what a module holds: at most two modules share one (the kernel and its
    nn module, say), so that a name found in a traceback or a search is not a guess."""
    counts = collections.Counter(path.name for path in modules().values())
    assert [name for name, count in counts.items() if count > 2 and name != "__init__.py"] == []
