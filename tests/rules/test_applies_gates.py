"""The diagnostic rules' ``applies`` gates only spare work: where one says no (no training loop or
step function, nothing moved to a device, no padding), the rule run anyway reports nothing. Every
fixture, example script and rule example, and a few shapes at the gates' edges, migrate the same
with the gates as written and with them open. (Other rules' gates decide what the rule does:
ACC005 unwraps DDP only where the file wraps a model, say.)"""

from pathlib import Path

import libcst as cst
import pytest

from accrewrite.analysis import analyze
from accrewrite.engine import Options, migrate_source
from accrewrite.registry import all_rules
from accrewrite.rule import RuleContext
from accrewrite.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSTIC = ("ACC101", "ACC102", "ACC103")
EDGES = [
    # Padding found outside any loop, in a file that moves a model to the GPU.
    b"import torch\nfrom transformers import DataCollatorForSeq2Seq as Collate\n\nmodel = Net().cuda()\n"
    b"collate = Collate(tokenizer)\npadded = torch.nn.utils.rnn.pad_sequence(batch)\n",
    # A host read in a step function of a file that moves nothing to a device, then in one that does.
    b"import torch\n\ndef step(batch):\n    loss = model(batch).sum()\n    loss.backward()\n    return loss.item()\n",
    b"import torch\n\nmodel = Net().cuda()\n\ndef step(batch):\n    loss = model(batch).sum()\n    loss.backward()\n"
    b"    if torch.isnan(loss):\n        return None\n    return loss.item()\n",
    # A generated sequence grown in a loop outside training.
    b"import torch\n\nmodel = Net().cuda()\nidx = torch.zeros(1, 1, dtype=torch.long).cuda()\nfor _ in range(10):\n"
    b"    logits = model(idx)\n    idx = torch.cat([idx, logits.argmax(-1)[:, -1:]], dim=1)\n",
]


def _sources() -> list[tuple[bytes, str]]:
    files = sorted(ROOT.glob("tests/rules/fixtures/*.in.py")) + sorted(ROOT.glob("examples/*/train.py"))
    found = [(path.read_bytes(), target) for path in files for target in ("runtime", "torch_xla", "torchacc")]
    found += [(example.before.encode(), example.target) for rule in all_rules().values() for example in rule.examples]
    return found + [(source, target) for source in EDGES for target in ("runtime", "torch_xla")]


def _outcomes(sources):
    outcomes = []
    for source, target in sources:
        result = migrate_source(source, "train.py", Options(target=target))
        findings = [(f.code, f.line, f.message) for f in result.fixes + result.diagnostics + result.withheld]
        outcomes.append((result.output, findings, result.error))
    return outcomes


def test_the_diagnostic_gates_open_change_no_outcome(monkeypatch):
    sources = _sources()
    gated = _outcomes(sources)
    for rule in (all_rules()[code] for code in DIAGNOSTIC):
        monkeypatch.setattr(rule, "applies", lambda self: True)
    for (source, target), as_written, open_ in zip(sources, gated, _outcomes(sources)):
        assert as_written == open_, (target, source[:300])
    assert sum(bool(findings) for _, findings, _ in gated) > len(sources) // 2


@pytest.mark.parametrize("code", DIAGNOSTIC)
def test_a_diagnostic_rule_stays_out_of_a_file_where_it_can_report_nothing(code):
    """No training loop, no step function, nothing moved to a device: nothing to report."""
    module = cst.parse_module("import torch\n\nx = torch.ones(3)\nprint(x.item())\n")
    ctx = RuleContext(module=module, facts=analyze(module), target=get_target("runtime"), source_text=module.code)
    assert not all_rules()[code](ctx).applies()
