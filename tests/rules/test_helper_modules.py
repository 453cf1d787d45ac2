"""A project laid out as MAE, DeiT and DETR are: distributed setup and the loss scaler that steps
the optimizer live in a helper module, the epoch in another, the entry point in a third.
Migrating the directory migrates them consistently: DistributedDataParallel goes from the entry
point and the reduction goes into the helper's scaler, so the migrated project, run on two
processes, trains exactly as the original."""

import pytest

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

MISC = '''\
import os

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu) if torch.cuda.is_available() else None
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


class NativeScaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        self._scaler.unscale_(optimizer)
        if clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()
'''

ENGINE = '''\
import torch


def train_one_epoch(model, data_loader, optimizer, device, loss_scaler):
    for samples, targets in data_loader:
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(samples), targets)
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        optimizer.zero_grad()
'''

MAIN = '''\
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import util.misc as misc
from engine import train_one_epoch
from util.misc import NativeScaler

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
args = parser.parse_args()
misc.init_distributed_mode(args)
device = torch.device(args.device)
torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(args.rank)  # every rank starts from its own weights: DDP broadcasts rank 0's
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu] if args.device == "cuda" else None)
optimizer = torch.optim.SGD(model.module.parameters(), lr=0.1)
train_one_epoch(model, loader, optimizer, device, NativeScaler())
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "__init__.py").write_text("")
    (tmp_path / "util" / "misc.py").write_text(MISC)
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "main.py").write_text(MAIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_the_reduction_goes_where_the_helper_steps(target):
    misc = migrate_source(MISC.encode(), "util/misc.py", Options(target=target)).output.decode()
    engine = migrate_source(ENGINE.encode(), "engine.py", Options(target=target)).output.decode()
    entry = migrate_source(MAIN.encode(), "main.py", Options(target=target)).output.decode()
    assert "DistributedDataParallel(" not in entry
    before = misc.index("self._scaler.unscale_(optimizer)")
    reduction = "xm._fetch_gradients(optimizer)" if target == "torchacc" else "xm.reduce_gradients(optimizer)"
    assert -1 < misc.index(reduction) < before  # reduced before the scaler reads the gradients
    assert "MpDeviceLoader(" in engine + entry and "optimizer_step" not in engine  # no second reduction


@pytest.mark.launches_ranks
def test_the_migrated_project_trains_as_the_original_on_two_processes(project, capsys):
    assert main(["verify", "main.py", "--nproc", "2", "--steps", "4", "--", "--device", "cpu"]) == 0, capsys.readouterr()
    assert "match: 4 steps" in capsys.readouterr().out


@pytest.mark.launches_ranks
def test_without_the_helper_migrated_ddp_is_kept_and_the_ranks_train_alike(project, capsys):
    # The helper that steps is marked to be skipped: it would not reduce, so DDP stays in main.py
    # (where it went, every rank trained on its own gradients and the replicas drifted apart).
    (project / "util" / "misc.py").write_text("# accrewrite: skip-file\n" + MISC)
    assert main(["verify", "main.py", "--nproc", "2", "--steps", "4", "--", "--device", "cpu"]) == 0, capsys.readouterr()
    assert "match: 4 steps" in capsys.readouterr().out
