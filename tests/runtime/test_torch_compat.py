"""accrewrite/base/torch_compat.py: every torch private name the runtime and the kernels use resolves
on this torch, the supported range is stated and checked, and no other module of theirs reaches
into torch's private modules."""

import ast
import pathlib

import pytest

torch = pytest.importorskip("torch")

import accrewrite.kernels
import accrewrite.runtime
from accrewrite.base import torch_compat as compat

BASE = pathlib.Path(compat.__file__).parent
RUNTIME = pathlib.Path(accrewrite.runtime.__file__).parent
KERNELS = pathlib.Path(accrewrite.kernels.__file__).parent


@pytest.mark.parametrize("name", sorted(compat._NAMES))
def test_each_name_resolves_on_this_torch(name):
    assert getattr(compat, name) is not None


def test_the_ring_attention_engine_resolves_and_sets_its_load_balancing_for_its_calls_only():
    ring = compat.ring_attention()
    assert callable(ring.forward) and callable(ring.backward)
    before = ring._options.enable_load_balance
    with ring.load_balanced(not before):
        assert ring._options.enable_load_balance is not before
    assert ring._options.enable_load_balance is before


def test_this_torch_is_in_the_supported_range():
    assert compat.check_version() is None


@pytest.mark.parametrize(
    "version, supported",
    [("2.13.0", True), ("2.13.1+cu128", True), ("2.12.1", False), ("2.14.0.dev20260101", False),
     ("3.0.0", False)],
)
def test_the_range_is_checked(version, supported):
    why = compat.check_version(version)
    assert (why is None) == supported
    if why:
        assert version in why and ">= 2.13, < 2.14" in why


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        compat.nothing  # noqa: B018


def _private_uses(path: pathlib.Path) -> list[str]:
    """The torch private modules and attributes that ``path`` names in code (not in docstrings):
    a dotted name from ``torch`` with a part that starts with one underscore. Operators
    (``torch.ops.<namespace>.<op>``) are not Python APIs and do not count."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [
                alias.name for alias in node.names
            ]
        elif isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.insert(0, inner.attr)
                inner = inner.value
            names = [".".join([inner.id, *parts])] if isinstance(inner, ast.Name) else []
        else:
            continue
        for name in names:
            parts = (name or "").split(".")
            private = any(p.startswith("_") and not p.startswith("__") for p in parts)
            if parts[0] == "torch" and private and parts[1:2] != ["ops"]:
                found.append(f"{path.parent.name}/{path.name}:{node.lineno}: {name}")
    return found


def test_no_other_module_of_the_runtime_or_the_kernels_uses_torch_privates():
    paths = [p for p in BASE.rglob("*.py") if p.name != "torch_compat.py"]
    paths += [*RUNTIME.rglob("*.py"), *KERNELS.rglob("*.py")]
    assert len(paths) > 50
    assert [use for path in sorted(paths) for use in _private_uses(path)] == []


def test_trace_forward_keeps_the_leaves_asked_for_fixes_defaults_and_restores_the_fast_path():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    graph = compat.trace_forward(layer, lambda module, default: isinstance(module, torch.nn.MultiheadAttention)
                                 or (default and not isinstance(module, torch.nn.TransformerEncoderLayer)))
    calls = [node.target for node in graph.nodes if node.op == "call_module"]
    assert calls == ["self_attn", "dropout1", "norm1", "linear1", "dropout", "linear2", "dropout2", "norm2"]
    assert torch.backends.mha.get_fastpath_enabled()
