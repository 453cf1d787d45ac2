"""ACC029 beyond its example: where a corpus sliced every step cannot stay on the host, the file
is left as it is and ACC103 names the slice; where it can, every slice of it is moved."""

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"

HEADER = """\
import torch

device = torch.device("cuda")
"""
LOOP = """
for i in range(0, data.size(0) - 1, bptt):
    model(window(data, i)).sum().backward()
    optimizer.step()
"""
WINDOW = """
def window(source, i):
    return source[i:i + bptt]
"""


def migrated(body: str, target: str = "torch_xla"):
    source = HEADER + textwrap.dedent(body)
    result = migrate_source(source.encode(), "lm.py", Options(target=target, select=("ACC029", "ACC103")))
    assert result.error is None
    return source, result


@pytest.mark.parametrize("body", [
    # fed to the model whole
    "data = tokens.to(device)\nwarmup = model(data)\n" + WINDOW + LOOP,
    # a helper also given a tensor that is no corpus, whose slice would be moved too
    "data = tokens.to(device)\n" + WINDOW + LOOP + "print(window(tokens, 0))\n",
    # written in place
    "data = tokens.to(device)\ndata[0] = 1\n" + WINDOW + LOOP,
    # bound twice
    "data = tokens.to(device)\nif flip:\n    data = tokens.flip(0).to(device)\n" + WINDOW + LOOP,
    # a helper that makes the corpus, also called for a tensor that is no corpus's binding
    "def batchify(x):\n    return x.view(4, -1).t().contiguous().to(device)\n\ndata = batchify(tokens)\n"
    "print(batchify(tokens).sum())\n" + WINDOW + LOOP,
    # a batch written in place, which wrote the corpus too
    "data = tokens.to(device)\n" + WINDOW
    + LOOP.replace("    model(", "    batch = window(data, i)\n    batch[batch == 0] = 1\n    model("),
    "data = torch.tensor(ids).to(device)\n\nfor i in range(0, len(data), bptt):\n"
    "    x = data[i:i + bptt]\n    x.clamp_(max=9)\n    model(x).sum().backward()\n    optimizer.step()\n",
    # moved to a device that a function names as its own
    "data = tokens.to(device)\n\ndef window(source, i, device='cpu'):\n    return source[i:i + bptt]\n" + LOOP,
])
def test_a_corpus_needed_on_the_device_stays_there_and_its_slice_is_reported(body):
    source, result = migrated(body)
    assert result.output.decode() == source
    assert [d.code for d in result.diagnostics] == ["ACC103"]
    assert "slices at an offset that changes every step" in result.diagnostics[0].message


def test_every_slice_of_the_corpus_is_moved_and_a_moved_one_once():
    _, result = migrated("""
        data = tokens.to(device)
        first = data[0]
        for i in range(0, len(data) - 1, bptt):
            model(data[i:i + bptt], data[i + 1:i + 1 + bptt].to(device)).sum().backward()
            optimizer.step()
        print(data.shape, data.size(0))
    """)
    output = result.output.decode()
    assert "data = tokens\n" in output and "first = data[0].to(device)" in output
    assert "model(data[i:i + bptt].to(device), data[i + 1:i + 1 + bptt].to(device))" in output
    assert not result.diagnostics


def test_a_noqa_on_one_slice_keeps_the_whole_corpus_on_the_device():
    body = "data = tokens.to(device)\n" + WINDOW.replace("bptt]", "bptt]  # noqa: ACC029") + LOOP
    source, result = migrated(body)
    assert result.output.decode() == source and not result.fixes
    assert [d.code for d in result.diagnostics] == ["ACC103"]


def test_a_target_that_runs_eagerly_keeps_the_corpus_on_the_device():
    source, result = migrated("data = tokens.to(device)\n" + WINDOW + LOOP, target="runtime")
    assert "data = tokens.to(device)" in result.output.decode()
    assert not result.fixes


# Runs a script as `python script.py` would, then prints how many graphs torch_xla compiled.
_COUNTING = (
    "import runpy, sys; path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__'); "
    "import torch_xla.debug.metrics as m; data = m.metric_data('CompileTime'); "
    "print('xla compilations', data[0] if data else 0)"
)


@pytest.mark.xla
def test_the_corpus_on_the_host_compiles_the_same_graphs_every_step(xla_python, tmp_path):
    source = (FIXTURES / "word_lm_corpus.in.py").read_bytes()
    compilations = {}
    for ignore in ((), ("ACC029",)):
        path = tmp_path / f"lm{len(ignore)}.py"
        path.write_bytes(migrate_source(source, "lm.py", Options(target="torch_xla", ignore=ignore)).output)
        done = subprocess.run([xla_python, "-c", _COUNTING, str(path)], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        steps = done.stdout.count("loss ")
        compilations[ignore] = int(re.search(r"^xla compilations (\d+)$", done.stdout, re.MULTILINE).group(1))
    # A training step and an evaluation step, each full and last short; sliced on the device,
    # every offset is a graph of its own.
    assert compilations[()] <= 4 < steps // 2 < compilations[("ACC029",)]


def test_a_corpus_moved_with_cuda_has_its_slices_moved_to_the_target_s_device():
    source = "import torch\n\ndata = torch.tensor(ids).view(4, -1).t().contiguous().cuda()\n" + WINDOW + LOOP
    result = migrate_source(source.encode(), "lm.py", Options(target="torch_xla", select=("ACC002", "ACC029", "ACC103")))
    output = result.output.decode()
    assert "data = torch.tensor(ids).view(4, -1).t().contiguous()\n" in output
    assert "return source[i:i + bptt].to(torch_xla.device())" in output
    assert not result.diagnostics
