"""Rule registration and selection."""

import sys
import types

import libcst as cst
import pytest

from accrewrite import registry
from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Example, Rule


class NoBenchmark(Rule):
    """A third-party rule: ``torch.backends.cudnn.benchmark = True`` is dropped."""

    code = "XYZ001"
    name = "no-cudnn-benchmark"
    summary = "drop cudnn.benchmark"
    examples = (Example(before="import torch\ntorch.backends.cudnn.benchmark = True\n", after="import torch\n"),)
    triggers = frozenset({"benchmark"})

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if "cudnn.benchmark" in self.ctx.code(original_node):
            self.ctx.fix(original_node, "dropped")
            return cst.RemoveFromParent()
        return updated_node


class FakeEntryPoint:
    def __init__(self, value):
        self.value = value

    def load(self):
        return self.value


@pytest.fixture
def plugin(monkeypatch):
    module = types.ModuleType("acc_plugin_pack")
    module.NoBenchmark = NoBenchmark
    NoBenchmark.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(registry, "entry_points", lambda group: [FakeEntryPoint(module)] if group == registry.ENTRY_POINT_GROUP else [])
    registry.all_rules.cache_clear()
    yield
    registry.all_rules.cache_clear()


def test_third_party_rule_packs_load_through_entry_points(plugin):
    assert registry.all_rules()["XYZ001"] is NoBenchmark
    assert registry.find_rule("no-cudnn-benchmark") is NoBenchmark
    result = migrate_source(NoBenchmark.examples[0].before.encode(), options=Options(select=("XYZ001",)))
    assert result.output.decode() == NoBenchmark.examples[0].after


def test_selection_by_code_prefix_name_and_all():
    codes = lambda selection: {rule.code for rule in selection.rules}
    assert codes(registry.select(["ACC00"], None, False)) >= {"ACC001", "ACC002"}
    assert codes(registry.select(["device-placement"], None, False)) == {"ACC002"}
    assert "ACC001" not in codes(registry.select(["ALL"], ["ACC001"], False))
    with pytest.raises(registry.SelectionError, match="ACC999"):
        registry.select(["ACC999"], None, False)


def test_unsafe_fixes_are_withheld_unless_allowed_or_selected_exactly(monkeypatch):
    class Unsafe(Rule):
        code, name, summary, safe = "ACC998", "unsafe-demo", "demo", False

    monkeypatch.setattr(registry, "all_rules", lambda: {"ACC998": Unsafe})
    assert registry.select(None, None, False).withheld == {Unsafe}
    assert registry.select(None, None, True).withheld == set()
    assert registry.select(["ACC998"], None, False).withheld == set()
    assert registry.select(["ACC99"], None, False).withheld == {Unsafe}
