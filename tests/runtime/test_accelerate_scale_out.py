"""Scale-out on torchrun's engine: two ``accrun`` "nodes" meeting at a c10d rendezvous train
together under FSDP2, and an elastic restart (``--max-restarts 1``) after a rank is killed
resumes from the last checkpoint with the losses of an uninterrupted run."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import argparse, os, signal
    import torch
    import torch.distributed as dist
    from torch import nn
    import accrewrite.runtime as accrt

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=-1)  # rank 1 kills itself there, first attempt only
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(3)))
    config = accrt.Config()
    config.dist.fsdp.size = int(os.environ["WORLD_SIZE"])
    model = accrt.accelerate(model, config=config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = os.path.join(args.out, "ckpt")
    start = accrt.load_checkpoint(checkpoint, model, optimizer)["step"] + 1 if os.path.exists(checkpoint) else 0
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    for step in range(start, args.steps):
        if step == args.kill_at and rank == 1 and attempt == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        x = batch[rank::world]  # this rank's half of the step's global batch
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        if rank == 0:
            with open(os.path.join(args.out, "losses.txt"), "a") as log:
                log.write(f"{attempt} {step} {loss.item() / world!r}\\n")
        accrt.save_checkpoint(checkpoint, model, optimizer, step=step)
''')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accrun(options, out, *script_args):
    out.mkdir(exist_ok=True)
    script = out.parent / "train.py"
    if not script.exists():  # a launched process may be reading it
        script.write_text(SCRIPT)
    # accrun itself gives restarted workers their own rendezvous store (see accrewrite.launcher)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "accrewrite.launcher", *options, str(script), "--out", str(out), *script_args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process):
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-6000:]
    return output


def _losses(out):
    """``{step: (attempt, loss)}``, the last attempt's loss where a step ran twice."""
    losses = {}
    for line in (out / "losses.txt").read_text().splitlines():
        attempt, step, loss = line.split()
        losses[int(step)] = (int(attempt), float(loss))
    return losses


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_two_nodes_at_a_c10d_rendezvous_train_as_one_job_on_two_processes(tmp_path):
    port = _free_port()
    nodes = [  # one folder for both, as a shared filesystem holds a multi-node job's checkpoints
        _accrun(["--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "two-nodes"], tmp_path / "nodes")
        for rank in range(2)
    ]
    for node in nodes:
        _finish(node)
    single = _accrun(["--standalone", "--nproc_per_node", "2"], tmp_path / "single")
    _finish(single)
    assert _losses(tmp_path / "nodes") == _losses(tmp_path / "single")


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_a_killed_rank_restarts_and_resumes_from_the_last_checkpoint(tmp_path):
    options = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "1", "--monitor-interval", "0.2"]
    killed = _accrun(options, tmp_path / "killed", "--kill-at", "5")
    _finish(killed)
    uninterrupted = _accrun(options, tmp_path / "uninterrupted")
    _finish(uninterrupted)
    resumed, want = _losses(tmp_path / "killed"), _losses(tmp_path / "uninterrupted")
    assert {attempt for attempt, _ in resumed.values()} == {0, 1}  # the job did restart
    assert [attempt for step, (attempt, _) in sorted(resumed.items()) if step >= 5] == [1, 1, 1]
    assert {step: loss for step, (_, loss) in resumed.items()} == {step: loss for step, (_, loss) in want.items()}
