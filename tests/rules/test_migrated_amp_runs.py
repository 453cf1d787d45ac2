"""A CUDA AMP + DDP training script, migrated by the default rules (ACC004 process group,
ACC005 DDP unwrap, ACC007 AMP, ACC008 syncfree, ACC010 synchronize, ...), must run where the
target runs: the runtime target on this CPU (one process, and two under torchrun with equal
results), the torch_xla target under torch_xla on PJRT's CPU device when it is importable."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from accrewrite.engine import Options, migrate_source

SCRIPT = textwrap.dedent(
    """
    import os

    import torch
    import torch.nn as nn
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.cuda.amp import autocast, GradScaler


    def main():
        ddp = int(os.environ.get("RANK", -1)) != -1
        if ddp:
            dist.init_process_group(backend="nccl", init_method="env://")
        torch.manual_seed(0)
        device = torch.device("cuda")
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
        if ddp:
            model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])])
        raw_model = model.module if ddp else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = GradScaler(enabled=True)
        x = torch.randn(64, 16)
        y = x.sum(1, keepdim=True)
        losses = []
        for step in range(30):
            xb, yb = x.to(device), y.to(device)
            with autocast():
                loss = nn.functional.mse_loss(model(xb).float(), yb)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            losses.append(loss.item())
        torch.cuda.synchronize()
        print(f"losses {losses[0]:.6f} {losses[-1]:.6f} params {sum(p.numel() for p in raw_model.parameters())}")
        if ddp:
            dist.destroy_process_group()


    if __name__ == "__main__":
        main()
    """
).lstrip()

_LOSSES = re.compile(r"losses (\S+) (\S+) params (\d+)")


def _migrated(tmp_path, target):
    result = migrate_source(SCRIPT.encode(), "train.py", Options(target=target))
    assert result.error is None and result.changed
    path = tmp_path / "train.py"
    path.write_bytes(result.output)
    return path, result


def _run(command, tmp_path, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(env)
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = [tuple(map(float, m.groups())) for m in _LOSSES.finditer(done.stdout)]
    assert found, done.stdout
    for first, last, params in found:
        assert last < first and params == 577
    return found


@pytest.mark.slow
def test_runtime_target_runs_on_cpu(tmp_path):
    path, result = _migrated(tmp_path, "runtime")
    codes = {fix.code for fix in result.fixes}
    assert {"ACC004", "ACC005", "ACC007", "ACC008", "ACC010"} <= codes
    _run([sys.executable, str(path)], tmp_path)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_runtime_target_two_processes_agree(tmp_path):
    path, _ = _migrated(tmp_path, "runtime")
    found = _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(path)],
        tmp_path,
        OMP_NUM_THREADS="1",
    )
    assert len(found) == 2 and found[0] == found[1]


@pytest.mark.xla
def test_torch_xla_target_runs_on_pjrt_cpu(tmp_path, xla_python):
    path, result = _migrated(tmp_path, "torch_xla")
    # No GradScaler and bf16-only autocast on this target: said so, and the script still runs.
    assert any(d.code == "ACC007" for d in result.diagnostics)
    _run([xla_python, str(path)], tmp_path, PJRT_DEVICE="CPU")
