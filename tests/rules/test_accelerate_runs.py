"""An Accelerate script, migrated by its Accelerator's configuration (ACC019), trains on torch_xla
through Accelerate itself: its fp16 becomes bf16, which the XLA device runs."""

import os
import re
import subprocess
import textwrap

import pytest

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

pytest.importorskip("accelerate")

# A small loop as Accelerate's nlp_example writes one, on a synthetic dataset.
TINY = textwrap.dedent("""\
    import torch
    from accelerate import Accelerator
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        accelerator = Accelerator(mixed_precision="fp16")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            accelerator.print(f"loss {loss.item():.6f}")


    if __name__ == "__main__":
        main()
    """)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "project"


def test_the_accelerator_takes_the_precision_the_xla_device_runs():
    result = migrate_source(TINY.encode(), "train.py", Options(target="torch_xla"))
    assert 'Accelerator(mixed_precision="bf16")' in result.output.decode()
    assert [f.code for f in result.fixes] == ["ACC019"]


@pytest.mark.slow
@pytest.mark.xla
def test_the_fp16_script_trains_on_the_xla_device_once_migrated(tmp_path, xla_python):
    # On a TPU Accelerate refuses fp16, and on an XLA GPU it asks for a GradScaler torch_xla 2.9 lacks. Off TPUs
    # its local rank is LOCAL_RANK's (ACC019's note says so): without it accelerator.print prints nothing.
    (tmp_path / "train.py").write_bytes(migrate_source(TINY.encode(), "train.py", Options(target="torch_xla")).output)
    wrapper = ("import runpy; runpy.run_path('train.py', run_name='__main__'); import torch_xla.debug.metrics as m; "
               "print('xla executions', (m.metric_data('ExecuteTime') or [0])[0])")
    done = subprocess.run([xla_python, "-c", wrapper], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1", "LOCAL_RANK": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"^loss \d", done.stdout, re.MULTILINE)) == 8
    assert int(re.search(r"^xla executions (\d+)$", done.stdout, re.MULTILINE).group(1)) > 0


@pytest.mark.slow
@pytest.mark.xla
def test_an_accelerate_script_matches_its_original_on_xla_under_verify(project, capsys, xla_python):
    # In float32: bfloat16 rounds each step's products apart beyond verify's tolerance. Accelerate
    # itself puts the model and the batches on the XLA device, and verify records its steps.
    (project / "train.py").write_text(TINY.replace('mixed_precision="fp16"', 'mixed_precision="no"'))
    code = main(["verify", "train.py", "--compare", "original,torch_xla", "--python", f"torch_xla={xla_python}"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 8 steps" in out and "graph executions on the xla device" in out
