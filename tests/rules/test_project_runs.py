"""Projects migrated as `accrewrite migrate FOLDER` migrates them, then run: on the runtime target
on two gloo ranks (torchrun for the original, accrun for the migration), every rank writing its
final parameters. Where DistributedDataParallel is removed the target's all-reduce must take its
place: the ranks end with equal parameters, the migration's losses and parameters those of the
original. Where DDP stays, it runs on the target as it did (the runtime's gloo, torch_xla's `xla`
backend on PJRT's CPU device). And a Hogwild project that torch_xla leaves as it is runs there
as published."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mae_project import ENGINE, MAIN, MISC

from accrewrite.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
# VICReg's distributed.py, as far as the script uses it: the process group from torchrun's variables.
VICREG_DISTRIBUTED = '''import os

import torch


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(args.gpu)
    torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.distributed.barrier()
'''
PROJECTS = {
    "vicreg": {"main_vicreg.py": (FIXTURES / "vicreg_lars.in.py").read_text(), "distributed.py": VICREG_DISTRIBUTED},
    "lars_no_scaler": {"train.py": (FIXTURES / "lars_no_scaler.in.py").read_text()},
    "mae_helper": {"main.py": MAIN, "engine.py": ENGINE, "util/__init__.py": "", "util/misc.py": MISC},
    "ddp_kept": {"train.py": (FIXTURES / "ddp_kept.in.py").read_text()},
}
ENTRY = {"vicreg": "main_vicreg.py", "lars_no_scaler": "train.py", "mae_helper": "main.py", "ddp_kept": "train.py"}
_LOSS = re.compile(r"^loss (-?\d+\.\d+)$", re.MULTILINE)
TOLERANCE = 1e-4


def _write(files: dict[str, str], folder: Path) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def _migrated(name: str, tmp_path: Path, target: str = "runtime") -> tuple[Path, Path]:
    original = _write(PROJECTS[name], tmp_path / "original")
    migrated = tmp_path / target
    assert main(["migrate", str(original), "--target", target, "--output-dir", str(migrated)]) == 0
    return original, migrated


def _run(command: list[str], cwd: Path, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(OMP_NUM_THREADS="1", **env)
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _two_ranks(launcher: list[str], folder: Path, script: str) -> tuple[list[float], list[torch.Tensor]]:
    """Rank 0's losses and each rank's final parameters."""
    output = _run([*launcher, "--standalone", "--nproc_per_node", "2", script, "--device", "cpu"], folder)
    return [float(loss) for loss in _LOSS.findall(output)], [torch.load(folder / f"params_{r}.pt") for r in (0, 1)]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ACCRUN = [sys.executable, "-m", "accrewrite.launcher"]


@pytest.mark.launches_ranks
@pytest.mark.parametrize("name", ["vicreg", "lars_no_scaler", "mae_helper", "ddp_kept"])
def test_the_migrated_project_trains_as_the_original_its_ranks_alike(name, tmp_path):
    original, migrated = _migrated(name, tmp_path)
    entry = (migrated / ENTRY[name]).read_text()
    everything = "".join(path.read_text() for path in migrated.rglob("*.py"))
    reduced = "xm.reduce_gradients(" in everything or "xm.optimizer_step(" in everything
    kept = "DistributedDataParallel(" in entry
    assert kept == (name == "ddp_kept") and reduced != kept  # DDP, or the target's all-reduce in its place
    losses, (first, second) = _two_ranks(TORCHRUN, original, ENTRY[name])
    migrated_losses, (migrated_first, migrated_second) = _two_ranks(ACCRUN, migrated, ENTRY[name])
    assert torch.equal(first, second) and torch.equal(migrated_first, migrated_second)  # the replicas agree
    assert losses and migrated_losses == pytest.approx(losses, rel=TOLERANCE)
    assert torch.allclose(migrated_first, first, rtol=TOLERANCE, atol=1e-6)


@pytest.mark.xla
@pytest.mark.launches_ranks
def test_ddp_kept_runs_on_torch_xla_with_the_xla_backend(tmp_path, xla_python):
    _, migrated = _migrated("ddp_kept", tmp_path, "torch_xla")
    script = (migrated / "train.py").read_text()
    assert "nn.parallel.DistributedDataParallel(generator)" in script and "backend='xla'" in script
    torchrun = [xla_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    output = _run([*torchrun, "train.py", "--device", "cuda"], migrated, PJRT_DEVICE="CPU")
    losses = [float(loss) for loss in _LOSS.findall(output)]
    assert len(losses) == 6 and losses[-1] < losses[0], output


@pytest.mark.xla
def test_a_hogwild_project_left_as_it_is_runs_on_torch_xla_as_published(tmp_path, xla_python):
    shutil.copytree(FIXTURES / "hogwild_project", tmp_path / "original")
    migrated = tmp_path / "torch_xla"
    assert main(["migrate", str(tmp_path / "original"), "--target", "torch_xla", "--output-dir", str(migrated)]) == 0
    assert all((migrated / name).read_bytes() == (tmp_path / "original" / name).read_bytes()
               for name in ("main.py", "train.py"))
    output = _run([xla_python, "main.py", "--steps", "5"], migrated, PJRT_DEVICE="CPU")
    assert sorted(re.findall(r"rank (\d): trained 5 steps", output)) == ["0", "1"] and "test loss" in output


@pytest.mark.xla
def test_a_trainer_whose_evaluator_is_left_as_it_is_runs_on_torch_xla_as_published(tmp_path, xla_python):
    """ACC027 leaves evaluate.py as it is on torch_xla, so train.py, which hands it the model, is
    left too: the project runs there as on this CPU, where train.py migrated alone would feed
    the evaluator's host tensors to a model on the device."""
    original = tmp_path / "original"
    shutil.copytree(FIXTURES / "evaluator_project", original)
    migrated = tmp_path / "torch_xla"
    assert main(["migrate", str(original), "--target", "torch_xla", "--output-dir", str(migrated)]) == 0
    assert all((migrated / name).read_bytes() == (original / name).read_bytes() for name in ("train.py", "evaluate.py"))
    output = _run([xla_python, "train.py"], migrated, PJRT_DEVICE="CPU")
    assert output == _run([sys.executable, "train.py"], original) and "epoch 1 accuracy" in output


@pytest.mark.slow
def test_a_trainer_and_its_evaluator_migrated_to_the_runtime_train_as_the_original(tmp_path):
    original = tmp_path / "original"
    shutil.copytree(FIXTURES / "evaluator_project", original)
    migrated = tmp_path / "runtime"
    assert main(["migrate", str(original), "--target", "runtime", "--output-dir", str(migrated)]) == 0
    assert (migrated / "train.py").read_bytes() != (original / "train.py").read_bytes()
    expected, output = _run([sys.executable, "train.py"], original), _run([sys.executable, "train.py"], migrated)
    assert [float(loss) for loss in _LOSS.findall(output)] == pytest.approx(
        [float(loss) for loss in _LOSS.findall(expected)], rel=TOLERANCE)
    assert re.findall(r"^epoch .*$", output, re.MULTILINE) == re.findall(r"^epoch .*$", expected, re.MULTILINE)
