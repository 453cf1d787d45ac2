"""Scripts that a framework trains, migrated by their configuration, train on torch_xla as their
originals train on the CPU: a Lightning Trainer's (ACC018), whose optimizer steps verify records
through Lightning's closure, and an Accelerator's (ACC019), whose fp16 becomes bf16."""

import os
import re
import subprocess
import textwrap

import pytest

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "project"


def needs(module: str, xla_python: str | None = None) -> None:
    """Skips where this interpreter, or ``xla_python``, cannot import ``module``."""
    pytest.importorskip(module)
    if xla_python is not None and subprocess.run([xla_python, "-c", f"import {module}"], capture_output=True).returncode:
        pytest.skip(f"{xla_python} has no {module}")


# A small LightningModule on a synthetic dataset, as Lightning's examples write one; "auto" trains
# on the CPU here, and the migration names the target's accelerator.
LIGHTNING = textwrap.dedent("""\
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    def main():
        L.seed_everything(0)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        trainer = L.Trainer(accelerator="auto", devices=1, strategy="ddp", precision="16-mixed", max_steps=4,
                            enable_progress_bar=False, logger=False, enable_checkpointing=False)
        trainer.fit(Regressor(), DataLoader(data, batch_size=8))


    if __name__ == "__main__":
        main()
    """)


def test_the_trainer_is_migrated_to_the_xla_accelerator():
    result = migrate_source(LIGHTNING.encode(), "train.py", Options(target="torch_xla"))
    assert 'L.Trainer(accelerator="tpu", devices=1, precision="32-true", max_steps=4,' in result.output.decode()
    assert [f.code for f in result.fixes] == ["ACC018"]


@pytest.mark.slow
def test_verify_records_the_steps_lightning_runs_and_stops_it_after_those_asked_for(project, capsys):
    needs("lightning")
    # The probe's hooks see the backward and the optimizer step Lightning calls through its closure; the
    # runtime target leaves the Trainer as it is (ACC018 says so), so the two sides run one script.
    (project / "train.py").write_text(LIGHTNING.replace('strategy="ddp", precision="16-mixed", ', ""))
    code = main(["verify", "train.py", "--steps", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 2 steps" in out and "stopped after 2 steps as asked" in out


@pytest.mark.slow
@pytest.mark.xla
def test_a_migrated_lightning_script_trains_on_xla_as_the_original_on_the_cpu(project, capsys, xla_python):
    needs("lightning", xla_python)
    # On the CPU, the original's 16-mixed would train in float16 where the migration trains in float32, and its
    # DDP on one device would shuffle the loader (Lightning's DistributedSampler) where one XLA device does not.
    (project / "train.py").write_text(LIGHTNING.replace('strategy="ddp", precision="16-mixed", ', ""))
    code = main(["verify", "train.py", "--compare", "original,torch_xla", "--python", f"torch_xla={xla_python}"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 4 steps" in out and "graph executions on the xla device" in out


# A small loop as Accelerate's nlp_example writes one, on a synthetic dataset.
ACCELERATE = textwrap.dedent("""\
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


def test_the_accelerator_takes_the_precision_the_xla_device_runs():
    result = migrate_source(ACCELERATE.encode(), "train.py", Options(target="torch_xla"))
    assert 'Accelerator(mixed_precision="bf16")' in result.output.decode()
    assert [f.code for f in result.fixes] == ["ACC019"]


@pytest.mark.slow
@pytest.mark.xla
def test_the_fp16_script_trains_on_the_xla_device_once_migrated(tmp_path, xla_python):
    needs("accelerate", xla_python)
    # On a TPU Accelerate refuses fp16, and on an XLA GPU it asks for a GradScaler torch_xla 2.9 lacks. Off TPUs
    # its local rank is LOCAL_RANK's (ACC019's note says so): without it accelerator.print prints nothing.
    (tmp_path / "train.py").write_bytes(migrate_source(ACCELERATE.encode(), "train.py", Options(target="torch_xla")).output)
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
    needs("accelerate", xla_python)
    # In float32: bfloat16 rounds each step's products apart beyond verify's tolerance. Accelerate
    # itself puts the model and the batches on the XLA device, and verify records its steps.
    (project / "train.py").write_text(ACCELERATE.replace('mixed_precision="fp16"', 'mixed_precision="no"'))
    code = main(["verify", "train.py", "--compare", "original,torch_xla", "--python", f"torch_xla={xla_python}"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 8 steps" in out and "graph executions on the xla device" in out
