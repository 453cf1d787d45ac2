"""A script that logs the GPU's name and memory through torch.cuda (tests/rules/fixtures/
cuda_memory.in.py: the current device's properties at the start, the peak reset each epoch, the
summary at the end), migrated to the runtime target, runs to its end on this CPU, where
torch.cuda's calls fail, and logs the machine's and this process's memory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accrewrite.engine import Options, migrate_source

FIXTURE = Path(__file__).parent / "fixtures" / "cuda_memory.in.py"


def _run(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path)], cwd=path.parent, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the calls are CUDA's own")
def test_runtime_form_runs_to_its_end_on_the_cpu(tmp_path):
    original = tmp_path / "original.py"
    original.write_bytes(FIXTURE.read_bytes())
    assert _run(original).returncode != 0  # torch.cuda's calls, without CUDA
    result = migrate_source(FIXTURE.read_bytes(), "train.py", Options(target="runtime"))
    migrated = tmp_path / "train.py"
    migrated.write_bytes(result.output)
    done = _run(migrated)
    assert done.returncode == 0, done.stderr[-3000:]
    memory = float(re.search(r"^training on .+ with ([\d.]+) GiB$", done.stdout, re.M).group(1))
    assert memory > 0  # the machine's
    epochs = re.findall(r"^epoch \d took [\d.]+ ms peak ([\d.]+) MiB reserved [\d.]+ MiB$", done.stdout, re.M)
    peaks = [float(peak) for peak in epochs]
    assert len(peaks) == 2 and all(peak > 10 for peak in peaks)  # a Python process with torch holds more
    allocated, peak = map(int, re.search(r"^allocated (\d+) peak (\d+)$", done.stdout, re.M).groups())
    assert 0 < allocated <= peak
    assert "this process's resident set" in done.stdout.splitlines()[-1]
