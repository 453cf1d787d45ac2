"""The rules' walk rebuilds only what changed: it gives what libcst's own visit gives, a file the
rules leave alone is not printed again, and a rule that visits punctuation (which the walk does
not enter) still gets every visit."""

from pathlib import Path

import libcst as cst
import pytest

from accrewrite import engine
from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Rule
from accrewrite.transform import BatchedTransformer

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("tests/rules/fixtures/*.in.py")) + sorted(ROOT.glob("examples/*/train.py"))
OPTIONS = [Options(target="runtime"), Options(target="torch_xla"), Options(target="torchacc", guard="ACC_ON"),
           Options(target="runtime", parallel="fsdp,tp")]


def _outcome(result):
    findings = [(f.code, f.line, f.message) for f in result.fixes + result.diagnostics + result.withheld]
    return result.output, findings, result.error


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"{o.target}-{o.guard}-{o.parallel}")
def test_the_walk_gives_what_libcsts_visit_gives(options, monkeypatch):
    sources = [path.read_bytes() for path in SOURCES]
    walked = [_outcome(migrate_source(source, "train.py", options)) for source in sources]
    monkeypatch.setattr(BatchedTransformer, "rewrite", lambda self, module: module.visit(self))
    visited = [_outcome(migrate_source(source, "train.py", options)) for source in sources]
    assert sum(output != source for (output, _, _), source in zip(walked, sources)) > len(sources) // 2
    for path, mine, libcsts in zip(SOURCES, walked, visited):
        assert mine == libcsts, path.name


def test_a_file_the_rules_leave_alone_is_not_printed_again(monkeypatch):
    source = (b"import torch\n\nmodel = Net().cuda()\nrunning = 0.0\nfor x, y in train_loader:\n"
              b"    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()\n    running += loss.item()\n")
    monkeypatch.setattr(engine, "code_reusing", lambda module, printed: pytest.fail("printed again"))
    result = migrate_source(source, "train.py", Options(select=("ACC101",)))
    assert result.error is None and result.output == source
    assert [finding.code for finding in result.diagnostics] == ["ACC101"]


class TightCommas(Rule):
    """A third-party rule that visits punctuation: ``f(a, b)`` becomes ``f(a,b)``."""

    code = "XYZ950"
    name = "tight-commas"
    summary = "no space after a comma"

    def leave_Comma(self, original_node, updated_node):
        if updated_node.whitespace_after.value != " ":
            return updated_node
        self.ctx.fix(original_node, "tightened")
        return updated_node.with_changes(whitespace_after=cst.SimpleWhitespace(""))


def test_a_rule_visiting_punctuation_gets_every_comma(rule_pack):
    rule_pack("acc_comma_pack", TightCommas)
    source = b"import torch\n\nx = torch.zeros(2, 3)\ndef f(a, b):\n    return [a, b]\n"
    result = migrate_source(source, "train.py", Options(select=("XYZ950",)))
    assert result.error is None
    assert result.output == b"import torch\n\nx = torch.zeros(2,3)\ndef f(a,b):\n    return [a,b]\n"
    assert len(result.fixes) == 3
