"""A Lightning script, migrated by its Trainer's configuration (ACC018), trains on torch_xla as
the original trains on the CPU: verify records Lightning's optimizer steps on both sides and
compares them step by step."""

import textwrap

import pytest

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

pytest.importorskip("lightning")

# A small LightningModule on a synthetic dataset, as Lightning's examples write one; "auto" trains
# on the CPU here, and the migration names the target's accelerator.
TINY = textwrap.dedent("""\
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


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "project"


def test_the_trainer_is_migrated_to_the_xla_accelerator():
    result = migrate_source(TINY.encode(), "train.py", Options(target="torch_xla"))
    assert 'L.Trainer(accelerator="tpu", devices=1, precision="32-true", max_steps=4,' in result.output.decode()
    assert [f.code for f in result.fixes] == ["ACC018"]


@pytest.mark.slow
def test_verify_records_the_steps_lightning_runs_and_stops_it_after_those_asked_for(project, capsys):
    # The probe's hooks see the backward and the optimizer step Lightning calls through its closure; the
    # runtime target leaves the Trainer as it is (ACC018 says so), so the two sides run one script.
    (project / "train.py").write_text(TINY.replace('strategy="ddp", precision="16-mixed", ', ""))
    code = main(["verify", "train.py", "--steps", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 2 steps" in out and "stopped after 2 steps as asked" in out


@pytest.mark.slow
@pytest.mark.xla
def test_a_migrated_lightning_script_trains_on_xla_as_the_original_on_the_cpu(project, capsys, xla_python):
    # On the CPU, the original's 16-mixed would train in float16 where the migration trains in float32, and its
    # DDP on one device would shuffle the loader (Lightning's DistributedSampler) where one XLA device does not.
    (project / "train.py").write_text(TINY.replace('strategy="ddp", precision="16-mixed", ', ""))
    code = main(["verify", "train.py", "--compare", "original,torch_xla", "--python", f"torch_xla={xla_python}"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "match: 4 steps" in out and "graph executions on the xla device" in out
