"""A finding carries the code of the rule that gave it, a fix it could not apply included, so
--select, --ignore and noqa act on the code the report shows."""

import json

import pytest

from accrewrite.cli import main

AMP = b"""import torch

scaler = torch.cuda.amp.GradScaler()
for x in loader:
    with torch.cuda.amp.autocast(*amp_args):
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""

SYNCFREE = b"""import torch

optimizer = torch.optim.AdamW(*params)
scaler = torch.cuda.amp.GradScaler()
for x in loader:
    scaler.scale(model(x)).backward()
    scaler.step(optimizer)
    scaler.update()
"""


@pytest.fixture
def findings(tmp_path, capsys):
    def run(source, *options):
        path = tmp_path / "train.py"
        path.write_bytes(source)
        assert main(["migrate", str(path), "--format", "json", *options]) == 0
        (file,) = json.loads(capsys.readouterr().out)["files"]
        return [(d["code"], d["line"], d["message"]) for d in file["diagnostics"]]

    return run


def test_a_fix_left_undone_is_its_rules_finding(findings):
    left = ("ACC007", 5, "autocast(*args/**kwargs) left as it is")
    assert left in findings(AMP)
    assert findings(AMP, "--select", "ACC007") == [left]
    assert left not in findings(AMP, "--ignore", "ACC007")
    assert findings(AMP, "--select", "ACC105") == []


def test_ignoring_acc105_keeps_other_rules_reports_and_selecting_it_drops_them(findings):
    reported = [code for code, _, _ in findings(SYNCFREE, "--target", "torch_xla", "--ignore", "ACC105")]
    assert reported.count("ACC008") == 1 and "ACC105" not in reported
    assert findings(SYNCFREE, "--target", "torch_xla", "--select", "ACC105") == []
    (only,) = findings(SYNCFREE, "--target", "torch_xla", "--select", "ACC008")
    assert only[:2] == ("ACC008", 3) and "left as it is" in only[2]


def test_noqa_names_the_rule_that_left_the_fix(findings):
    quiet = AMP.replace(b"autocast(*amp_args):", b"autocast(*amp_args):  # noqa: ACC007")
    assert not [f for f in findings(quiet) if f[1] == 5]
    kept = AMP.replace(b"autocast(*amp_args):", b"autocast(*amp_args):  # noqa: ACC105")
    assert ("ACC007", 5, "autocast(*args/**kwargs) left as it is") in findings(kept)
