"""N training steps on 2 gloo ranks under ``accrun`` equal N steps of one process
on the concatenated batch, to 1e-5.

The training script below is written the way a script migrated to ``--target runtime`` reads
(xm / pl / amp calls, the migration guide's order for AMP: all-reduce before the scaler's step). It runs
once as a plain single process and once under ``accrun --nproc_per_node 2``; each rank reads
every other sample (``DistributedSampler`` without shuffling), so rank batches concatenated
are the single process's batches.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = '''
import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import accrewrite.runtime.parallel_loader as pl
import accrewrite.runtime.xla_model as xm
from accrewrite.runtime.amp import GradScaler, syncfree

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--global-batch-size", type=int, default=8)  # split among the processes
parser.add_argument("--amp", action="store_true")
parser.add_argument("--out", required=True)
args = parser.parse_args()

xm.set_rng_state(0)
device = xm.xla_device()
xm.set_replication(device, [device])
if xm.world_size() > 1:
    dist.init_process_group(backend=xm.dist_backend())

generator = torch.Generator().manual_seed(1)
samples = args.steps * args.global_batch_size
dataset = TensorDataset(torch.randn(samples, 8, generator=generator), torch.randn(samples, 3, generator=generator))
sampler = DistributedSampler(dataset, num_replicas=xm.world_size(), rank=xm.get_ordinal(), shuffle=False)
train_loader = pl.MpDeviceLoader(DataLoader(dataset, batch_size=args.global_batch_size // xm.world_size(), sampler=sampler), device)

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).to(device)
if args.amp:
    optimizer = syncfree.AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler(init_scale=2.0**8)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
losses = []

for step, (x, y) in enumerate(train_loader):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if args.amp:
        scaler.scale(loss).backward()
        gradients = xm._fetch_gradients(optimizer)
        xm.all_reduce("sum", gradients, scale=1.0 / xm.xrt_world_size())
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        xm.optimizer_step(optimizer)
    xm.add_step_closure(lambda step, loss: losses.append((step, loss.item())), args=(step, loss.detach()), run_async=True)

xm.mark_step(wait=True)
assert [s for s, _ in losses] == list(range(args.steps)), losses
xm.save({"model": model.state_dict(), "steps": len(losses)}, args.out)
'''


def _train(tmp_path, name, launcher_args, amp):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / f"{name}.pt"
    flags = ["--out", str(out)] + (["--amp"] if amp else [])
    result = subprocess.run(
        [sys.executable, *launcher_args, str(script), *flags],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return torch.load(out)


@pytest.mark.launches_ranks
@pytest.mark.slow  # a single process, then accrun with two
@pytest.mark.parametrize("amp", [False, True], ids=["sgd-optimizer_step", "amp-syncfree-adamw"])
def test_two_ranks_equal_one_process_on_the_concatenated_batch(tmp_path, amp):
    single = _train(tmp_path, "single", [], amp)
    distributed = _train(tmp_path, "two", ["-m", "accrewrite.launcher", "--nproc_per_node", "2"], amp)
    assert single["steps"] == distributed["steps"] == 5
    for name, value in single["model"].items():
        torch.testing.assert_close(distributed["model"][name], value, rtol=0, atol=1e-5)
    torch.manual_seed(0)  # the script's xm.set_rng_state(0): its initial weights
    initial = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    moved = (single["model"]["0.weight"] - initial.state_dict()["0.weight"]).abs().max()
    assert moved > 1e-3, "the script did not train"
