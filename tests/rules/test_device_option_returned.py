"""An open_clip-shaped project (tests/rules/fixtures/device_option_returned.in.py and the modules
below): the options module returns the parsed options, `--device` defaulting to cuda; the entry
point hands them to a helper of another module, which makes the device of them and falls back to
the CPU where the device named is not there. Migrated together, the option defaults to the
target's device, so the torch_xla form trains on PJRT's CPU device, not on the host, with the
losses of the runtime form and of the original on this CPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

PARAMS = (Path(__file__).parent / "fixtures" / "device_option_returned.in.py").read_text()
DISTRIBUTED = '''\
import warnings

import torch


def is_device_available(device):
    device_type = torch.device(device).type
    if device_type == "cuda":
        return torch.cuda.is_available(), True
    if device_type == "cpu":
        return True, True
    return False, False


def init_distributed_device(args):
    device_type, *device_idx = args.device.split(":", maxsplit=1)
    is_avail, is_known = is_device_available(device_type)
    if not is_known:
        warnings.warn(f"Device {args.device} was not known and checked for availability, trying anyways.")
    elif not is_avail:
        warnings.warn(f"Device {args.device} was not available, falling back to CPU.")
        args.device = "cpu"
    return torch.device(args.device)
'''
ENTRY = '''\
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from distributed import init_distributed_device
from params import parse_args


def main(argv):
    args = parse_args(argv)
    device = init_distributed_device(args)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=16)
    print(f"device {device.type}")
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1:])
'''
_DEVICE = re.compile(r"^device (\w+)$", re.MULTILINE)
_LOSS = re.compile(r"^loss (\d+\.\d+)$", re.MULTILINE)


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "original"
    folder.mkdir()
    for name, text in (("train.py", ENTRY), ("params.py", PARAMS), ("distributed.py", DISTRIBUTED)):
        (folder / name).write_text(text)
    return folder


def _migrated(project: Path, target: str) -> Path:
    out = project.parent / target
    assert main(["migrate", str(project), "--target", target, "--output-dir", str(out)]) == 0
    return out


def _trained(python: str, folder: Path, **env: str) -> tuple[str, list[float]]:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(env, OMP_NUM_THREADS="1")
    done = subprocess.run([python, "train.py"], cwd=folder, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _DEVICE.search(done.stdout).group(1), [float(loss) for loss in _LOSS.findall(done.stdout)]


def test_the_returned_options_default_to_the_targets_device():
    result = migrate_source(PARAMS.encode(), "params.py", Options(target="torch_xla"))
    assert '"--device", default="xla", type=str' in result.output.decode()
    [fix] = [f for f in result.fixes if f.code == "ACC002"]
    assert fix.message == "the option defaults to the target's device: the parsed options are returned"


@pytest.mark.slow
def test_runtime_form_trains_as_the_original(project):
    device, losses = _trained(sys.executable, _migrated(project, "runtime"))
    original_device, original = _trained(sys.executable, project)
    assert device == original_device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len(losses) == 8 and losses == pytest.approx(original, rel=1e-4)


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_trains_on_the_device(project, xla_python):
    device, losses = _trained(xla_python, _migrated(project, "torch_xla"), PJRT_DEVICE="CPU")
    _, reference = _trained(sys.executable, _migrated(project, "runtime"))
    assert device == "xla" and losses == pytest.approx(reference, rel=1e-4)
