"""``accrewrite verify``: the original and the migrated script run side by side on the CPU, and the
verdict is the exit code (0 match, 1 diverge, 2 a side cannot run)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accrewrite import probe
from accrewrite.cli import main
from accrewrite.verify import Side, compare

TRAIN = """\
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), {activation}, nn.Linear(16, 1)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
data = torch.utils.data.TensorDataset(torch.randn(64, 8) * 2, torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {{step}} loss {{loss.item():.4f}}")
    if step + 1 == args.steps:
        break
torch.save(model.state_dict(), "model.pt")
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def write(project, name, text):
    path = project / name
    path.write_text(text)
    return path


def test_a_faithful_migration_matches_and_the_users_files_stay_as_they_were(project, capsys):
    script = write(project, "train.py", TRAIN.format(activation="nn.ReLU()"))
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    assert main(["verify", "train.py", "--steps", "4", "--", "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "match: 4 steps within 2%" in out
    assert out.count("│") > 4 * 4  # the table: one row a step
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before  # model.pt went to the workspace
    assert script.read_text() == TRAIN.format(activation="nn.ReLU()")


def test_a_fix_that_changes_numerics_is_caught(project, capsys):
    write(project, "train.py", TRAIN.format(activation="nn.GELU()"))
    assert main(["verify", "train.py", "--steps", "3"]) == 0
    capsys.readouterr()
    assert main(["verify", "train.py", "--steps", "3", "--unsafe-fixes"]) == 1
    out = capsys.readouterr().out
    assert "diverge: the " in out  # the loss, or the parameters it trains
    assert "3 reruns nudged by 1e-06 drift at most" in out and "nudged drift" in out  # far beyond them


def test_nudged_reruns_move_parameters_by_one_part_in_a_million_each_its_own_way(project):
    write(project, "train.py", TRAIN.format(activation="nn.ReLU()"))
    runs = {}
    for nudge in ("0", "1", "2"):
        subprocess.run([sys.executable, str(Path(probe.__file__)), f"records{nudge}", "4", "train.py"],
                       env={**os.environ, probe.NUDGE: nudge}, check=True, capture_output=True)
        runs[nudge] = [json.loads(line) for line in (project / f"records{nudge}" / "rank0.jsonl").read_text().splitlines()]
    plain = runs["0"]
    assert plain[0]["loss"] != runs["1"][0]["loss"]  # the nudge comes before the first forward
    assert runs["1"] != runs["2"]  # each seed nudges its own way
    for nudged in (runs["1"], runs["2"]):
        for a, b in zip(plain, nudged):
            assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"])
            assert abs(a["checksum"] - b["checksum"]) <= 1e-4 * a["change"]


def test_a_step_within_what_a_nudge_does_matches_and_one_beyond_every_nudge_diverges():
    ours = side("original", [(1.0, 0.5), (0.9, 0.6), (0.8, 0.7)])
    theirs = side("torch_xla", [(1.0, 0.5), (0.9, 0.6), (0.7, 0.7)])  # 12.5% at step 3
    calm = side("original-nudged-1", [(1.0, 0.5), (0.9, 0.6), (0.799, 0.7)])  # this nudge alone: 0.13%
    chaotic = side("original-nudged-2", [(1.0, 0.5), (0.9, 0.6), (0.785, 0.7)])  # this one: 1.9%
    verdict = compare(ours, theirs, rtol=0.02, floors=(calm, chaotic))
    assert verdict.code == 0 and "2 reruns nudged by 1e-06 (step 3: 12.50%, nudged 1.88%)" in verdict.message
    assert verdict.rows[2][5] == pytest.approx(0.01875)
    verdict = compare(ours, theirs, rtol=0.02, floors=(calm,))
    assert verdict.code == 1 and "at step 3" in verdict.message
    assert "a rerun nudged by 1e-06 drift at most 0.13% there" in verdict.message


@pytest.mark.xla
def test_dropout_on_the_xla_device_draws_what_the_cpu_draws(project, capsys, xla_python, monkeypatch):
    monkeypatch.setenv("ACCREWRITE_XLA_PYTHON", xla_python)
    write(project, "train.py", TRAIN.format(activation="nn.Dropout(0.3), nn.ReLU()"))
    assert main(["verify", "train.py", "--steps", "4", "--compare", "original,torch_xla", "--", "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "match: 4 steps within 2% (largest deviation" in out and "XLA graph executions" in out


HOST_RANDOM_CHECK = """\
import contextlib, sys
import torch, torch_xla
sys.path.insert(0, sys.argv[1])
import probe

F = torch.nn.functional


def draws(device, host_random):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5).to(device)
    layer = torch.nn.Linear(5, 3).to(device)
    with probe.host_random(torch) if host_random else contextlib.nullcontext():
        torch.nn.init.normal_(layer.weight, 0.0, 0.02)
        torch.nn.init.kaiming_uniform_(tensor=layer.bias.unsqueeze(0), a=1)
        out = [F.dropout(x, 0.3, training=True), F.dropout2d(x, 0.5), torch.nn.Dropout(0.2)(x),
               torch.randn(2, 3, device=device), torch.randn_like(x), torch.empty(7, device=device).normal_(),
               torch.randint(0, 9, (5,), device=device), torch.multinomial(torch.tensor([0.2, 0.8], device=device), 4, True),
               layer.weight, layer.bias, x * 2]
        return [t.detach().cpu() for t in out]


cpu, xla = draws("cpu", False), draws(torch_xla.device(), True)
print([torch.equal(a, b) for a, b in zip(cpu, xla)])
"""


@pytest.mark.xla
def test_the_xla_device_draws_what_the_cpu_draws_under_host_random(tmp_path, xla_python):
    (tmp_path / "check.py").write_text(HOST_RANDOM_CHECK)
    done = subprocess.run([xla_python, "check.py", str(Path(probe.__file__).parent)], cwd=tmp_path,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == str([True] * 11)


def test_data_one_and_two_folders_above_the_working_directory_is_found(tmp_path, monkeypatch, capsys):
    # Tutorials read ../../data (one data folder for the whole repository) or ../data.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scale.txt").write_text("0.5\n")
    (tmp_path / "tutorials" / "basics").mkdir(parents=True)
    (tmp_path / "tutorials" / "offset.txt").write_text("0.25\n")
    monkeypatch.chdir(tmp_path / "tutorials" / "basics")
    monkeypatch.setenv("COLUMNS", "200")
    reads = 'scale = float(open("../../data/scale.txt").read()) + float(open("../offset.txt").read())\n'
    seeded = "torch.manual_seed(0)\n"
    write(Path.cwd(), "train.py", TRAIN.format(activation="nn.ReLU()").replace(seeded, reads + seeded))
    assert main(["verify", "train.py", "--steps", "3"]) == 0, capsys.readouterr().err


def test_a_side_that_cannot_run_says_why(project, capsys):
    write(project, "train.py", "import torch\nraise SystemExit('needs a dataset at /data/imagenet')\n")
    assert main(["verify", "train.py", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "original cannot run" in err and "needs a dataset at /data/imagenet" in err


@pytest.mark.launches_ranks
def test_two_processes_compare_rank_by_rank(project, capsys):
    write(project, "ddp.py", textwrap.dedent("""\
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            torch.manual_seed(100 * rank + step)
            x = torch.randn(8, 4)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        dist.destroy_process_group()
        """))
    assert main(["verify", "ddp.py", "--steps", "4", "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    assert "rank 0" in out and "match: 4 steps" in out


def side(name, steps):
    # Checksums of changes whose norm is the checksum itself: deviations relative to it.
    return Side(name, records=[[{"step": i + 1, "loss": loss, "checksum": total, "change": total}
                                for i, (loss, total) in enumerate(steps)]])


def test_the_first_step_beyond_the_tolerance_is_named():
    ours = side("original", [(1.0, 0.5), (0.9, 0.6), (0.8, 0.7)])
    theirs = side("runtime", [(1.0, 0.5), (0.905, 0.6), (0.7, 0.7)])
    verdict = compare(ours, theirs, rtol=0.02)
    assert verdict.code == 1 and "at step 3" in verdict.message
    assert compare(ours, theirs, rtol=0.2).code == 0
    checksums = side("runtime", [(1.0, 0.5), (0.9, 0.66), (0.8, 0.7)])
    assert "parameter checksum differs by 9.09% at step 2" in compare(ours, checksums, rtol=0.02).message


def test_records_are_json_lines_per_rank(tmp_path):
    from accrewrite.verify import _read_records

    record = {"step": 1, "loss": 2.0, "checksum": 0.1, "change": 0.3}
    (tmp_path / "rank0.jsonl").write_text(json.dumps(record) + "\n{\"step\": 2")
    assert _read_records(tmp_path, 1) == [[record]]  # a torn last line waits
