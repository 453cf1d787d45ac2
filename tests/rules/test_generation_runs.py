"""A language model sampled from a one-token prompt (tests/rules/fixtures/generate_short_prompt.in.py)
runs where it is migrated: the runtime form on this CPU, the torch_xla form under torch_xla on
PJRT's CPU device, where slicing the last block_size tokens of a shorter sequence raises unless
ACC014 clamps the bound. Both train exactly like the original and sample the whole length; on
the lazy targets ACC028 pads the context of the generation loop to power-of-two lengths, so that
its tokens do not compile a graph each."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

SOURCE = (Path(__file__).parent / "fixtures" / "generate_short_prompt.in.py").read_bytes()
_RESULT = re.compile(r"loss (\S+)\nsample (\d+) ")
_LOOP_LINE = 46  # for _ in range(max_new_tokens): in generate


def _run(python, script: bytes, tmp_path, **env):
    path = tmp_path / "train.py"
    path.write_bytes(script)
    environment = {**os.environ, **env}
    done = subprocess.run([python, str(path)], cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = _RESULT.search(done.stdout)
    assert found, done.stdout
    return float(found.group(1)), int(found.group(2))


def _migrated(target):
    result = migrate_source(SOURCE, "train.py", Options(target=target))
    assert result.error is None and result.changed
    return result


@pytest.mark.parametrize("target", ["torch_xla", "torchacc"])
def test_lazy_targets_clamp_the_slice_and_pad_the_generation_loop(target):
    result = _migrated(target)
    assert b"idx[:, -min(block_size, idx.size(1)):]" in result.output
    assert b"self(torch.nn.functional.pad(idx_cond, " in result.output
    [padded] = [f for f in result.fixes if f.code == "ACC028"]
    assert padded.line == _LOOP_LINE and "`idx` grows on the host" in padded.message
    assert not [d for d in result.diagnostics if d.code == "ACC103"]


@pytest.mark.slow
def test_runtime_keeps_the_slice_and_says_nothing_of_generation(tmp_path):
    result = _migrated("runtime")
    assert b"idx[:, -block_size:]" in result.output
    assert not [d for d in result.diagnostics if d.code in ("ACC014", "ACC103")]
    original = _run(sys.executable, SOURCE, tmp_path)
    assert original[1] == 13  # the prompt and 12 new tokens
    assert _run(sys.executable, result.output, tmp_path) == original


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_samples_from_a_short_prompt(tmp_path, xla_python):
    original = _run(sys.executable, SOURCE, tmp_path)
    loss, length = _run(xla_python, _migrated("torch_xla").output, tmp_path, PJRT_DEVICE="CPU")
    assert length == original[1] and loss == pytest.approx(original[0], abs=2e-3)
