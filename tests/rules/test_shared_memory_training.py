"""Hogwild training (a model in shared memory, stepped by several processes) migrates where the
device can share memory, and is left exactly as it is, with one diagnostic, where it cannot."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

SCRIPT = (Path(__file__).parent / "fixtures" / "hogwild.in.py").read_bytes()


@pytest.mark.parametrize("target", ["torch_xla", "torchacc"])
def test_left_as_it_is_with_one_diagnostic_where_the_device_cannot_share(target):
    result = migrate_source(SCRIPT, "hogwild.py", Options(target=target))
    assert result.error is None and not result.changed
    assert not result.fixes and not result.withheld
    [refusal] = result.diagnostics
    assert (refusal.code, refusal.line) == ("ACC108", 48)
    assert "file left as it is" in refusal.message and "DistributedDataParallel" in refusal.help


def test_a_noqa_lets_the_migration_go_ahead():
    source = SCRIPT.replace(b"model.share_memory()  #", b"model.share_memory()  # noqa: ACC108 -")
    result = migrate_source(source, "hogwild.py", Options(target="torch_xla"))
    assert result.changed and result.fixes
    assert all(d.code != "ACC108" for d in result.diagnostics)


def test_memory_that_stays_on_the_host_may_be_shared():
    source = (b"import torch\n\ncounter = torch.zeros(1)\ncounter.share_memory_()\n"
              b"weights = torch.zeros(4).cuda()\nweights.share_memory_()\n")
    result = migrate_source(source, "counter.py", Options(target="torch_xla"))
    assert [d.line for d in result.diagnostics] == [6]


@pytest.mark.slow
def test_the_runtime_form_trains_the_shared_model(tmp_path):
    result = migrate_source(SCRIPT, "hogwild.py", Options(target="runtime"))
    assert result.changed
    script = tmp_path / "hogwild.py"
    script.write_bytes(result.output)
    done = subprocess.run([sys.executable, str(script), "--steps", "5"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) trained 5 steps", done.stdout)) == ["0", "1"]
    before, after = map(float, re.search(r"shared model loss (\S+) -> (\S+)", done.stdout).groups())
    assert after < before
