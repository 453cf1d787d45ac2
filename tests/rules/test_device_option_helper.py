"""A timm-shaped project (tests/rules/fixtures/device_option_helper.in.py and the helper below):
`--device` defaults to cuda, and a helper of another module makes the device of the parsed
options, asserting that CUDA is there where the option names it. Migrated together, the entry
point's option defaults to the target's device, so the project trains on this CPU (runtime) and
on PJRT's CPU device (torch_xla), alike, where the original stops at the helper's assertion.
And an open_clip-shaped one, whose options module returns the options: its torch_xla form
trains on the device, not on the host its helper falls back to."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

ENTRY = (Path(__file__).parent / "fixtures" / "device_option_helper.in.py").read_text()
HELPER = '''\
import torch


def init_device(args):
    device = args.device
    if device.startswith("cuda"):
        assert torch.cuda.is_available(), f"CUDA is not available but {device} was specified."
    return torch.device(device)
'''
# open_clip's shape: its options module (tests/rules/fixtures/device_option_returned.in.py) returns
# the parsed options, `--device` defaulting to cuda; the entry point hands them to a helper of
# another module, which falls back to the CPU where the device named is not there.
OPEN_CLIP_PARAMS = (Path(__file__).parent / "fixtures" / "device_option_returned.in.py").read_text()
OPEN_CLIP_DISTRIBUTED = '''\
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
OPEN_CLIP_ENTRY = '''\
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
    print(f"Training with a single process on 1 device ({device.type}).")
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
_DEVICE = re.compile(r"^Training with a single process on 1 device \((\w+)\)\.$", re.MULTILINE)
_LOSS = re.compile(r"^loss (\d+\.\d+)$", re.MULTILINE)


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "original"
    folder.mkdir()
    (folder / "train.py").write_text(ENTRY)
    (folder / "utils.py").write_text(HELPER)
    return folder


@pytest.fixture
def open_clip_project(tmp_path):
    folder = tmp_path / "original"
    folder.mkdir()
    for name, text in (("train.py", OPEN_CLIP_ENTRY), ("params.py", OPEN_CLIP_PARAMS),
                       ("distributed.py", OPEN_CLIP_DISTRIBUTED)):
        (folder / name).write_text(text)
    return folder


def _migrated(project: Path, target: str) -> Path:
    out = project.parent / target
    assert main(["migrate", str(project), "--target", target, "--output-dir", str(out)]) == 0
    return out


def _run(python: str, folder: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(env, OMP_NUM_THREADS="1")
    return subprocess.run([python, "train.py"], cwd=folder, env=environment, capture_output=True, text=True,
                          timeout=300)


def _trained(done: subprocess.CompletedProcess) -> tuple[str, list[float]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return _DEVICE.search(done.stdout).group(1), [float(loss) for loss in _LOSS.findall(done.stdout)]


@pytest.mark.parametrize("target, default", [("runtime", "accrt.accelerator.device_type()"), ("torch_xla", '"xla"'),
                                             ("torchacc", '"xla"')])
def test_the_option_defaults_to_the_targets_device(target, default):
    result = migrate_source(ENTRY.encode(), "train.py", Options(target=target))
    assert f'parser.add_argument("--device", default={default}, type=str' in result.output.decode()
    [fix] = [f for f in result.fixes if f.line == 13]
    assert fix.code == "ACC002" and "init_device() reads the options" in fix.message


def test_options_this_file_makes_the_device_of_keep_their_default():
    """Read here, and given only to the standard library's functions (a log of them)."""
    source = ENTRY.replace("from utils import init_device\n", "import pprint\n").replace(
        "init_device(args)", "torch.device(args.device)\n    pprint.pprint(args)")
    text = migrate_source(source.encode(), "train.py", Options(target="torch_xla")).output.decode()
    assert 'default="cuda"' in text and "device = torch_xla.device()" in text


@pytest.mark.slow
def test_runtime_form_trains_on_the_cpu(project):
    if not torch.cuda.is_available():
        assert "CUDA is not available but cuda was specified" in _run(sys.executable, project).stderr
    device, losses = _trained(_run(sys.executable, _migrated(project, "runtime")))
    assert device == ("cuda" if torch.cuda.is_available() else "cpu") and len(losses) == 8


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_trains_on_the_device_as_the_runtime_form(project, xla_python):
    device, losses = _trained(_run(xla_python, _migrated(project, "torch_xla"), PJRT_DEVICE="CPU"))
    _, reference = _trained(_run(sys.executable, _migrated(project, "runtime")))
    assert device == "xla" and losses == pytest.approx(reference, rel=1e-4)


def test_returned_options_default_to_the_targets_device():
    result = migrate_source(OPEN_CLIP_PARAMS.encode(), "params.py", Options(target="torch_xla"))
    assert '"--device", default="xla", type=str' in result.output.decode()
    [fix] = [f for f in result.fixes if f.code == "ACC002"]
    assert fix.message == "the option defaults to the target's device: the parsed options are returned"


@pytest.mark.slow
def test_open_clips_runtime_form_trains_as_the_original(open_clip_project):
    device, losses = _trained(_run(sys.executable, _migrated(open_clip_project, "runtime")))
    original_device, original = _trained(_run(sys.executable, open_clip_project))
    assert device == original_device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len(losses) == 8 and losses == pytest.approx(original, rel=1e-4)


@pytest.mark.xla
@pytest.mark.slow
def test_open_clips_torch_xla_form_trains_on_the_device(open_clip_project, xla_python):
    """Where the option kept its cuda default, the helper would fall back to the host."""
    device, losses = _trained(_run(xla_python, _migrated(open_clip_project, "torch_xla"), PJRT_DEVICE="CPU"))
    _, reference = _trained(_run(sys.executable, _migrated(open_clip_project, "runtime")))
    assert device == "xla" and losses == pytest.approx(reference, rel=1e-4)
