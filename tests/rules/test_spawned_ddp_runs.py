"""PyTorch's DDP tutorial shape (``mp.spawn`` workers that create their own process group and
size themselves by ``torch.cuda.device_count()``, tests/rules/fixtures/spawn_ddp.in.py), the
imagenet/MoCo worker whose only device variable is bound where it resumes from a checkpoint
(resume_branch_device.in.py), a torchrun script that refuses to start on too few GPUs
(device_count_guard.in.py), one that takes its device and backend from ``torch.accelerator``
(accelerator_ddp.in.py) and workers that split the batch by a world size the launching process
worked out from its GPU count (spawn_world_size.in.py, VICReg's and MoCo v3's shape) run where
they are migrated: the runtime target on this CPU with two gloo processes, the torch_xla target
on PJRT's CPU device (one device: one process)."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
SPAWN = (FIXTURES / "spawn_ddp.in.py").read_bytes()
GUARD = (FIXTURES / "device_count_guard.in.py").read_bytes()
ACCELERATOR = (FIXTURES / "accelerator_ddp.in.py").read_bytes()
RESUME = (FIXTURES / "resume_branch_device.in.py").read_bytes()
WORLD = (FIXTURES / "spawn_world_size.in.py").read_bytes()
# The ranks share one pipe, and a line's text and its newline may reach it apart, so a line can
# run on into the next rank's: the numbers are matched by their format.
_SPAWNED = re.compile(r"rank (\d) of (\d): loss -?\d+\.\d{4} params (-?\d+\.\d{6})")
_TRAINED = re.compile(r"rank (\d): loss -?\d+\.\d{4} params (-?\d+\.\d{6})")
_STEP = re.compile(r"rank (\d): loss (\d+\.\d{6})")
_SPLIT = re.compile(r"rank (\d) of (\d): batch (\d+) loss -?\d+\.\d{4} params (-?\d+\.\d{6})")
_REFUSED = "Unable to locate sufficient 2 gpus"


def _migrated(source, target, **options):
    result = migrate_source(source, "train.py", Options(target=target, **options))
    assert result.error is None and result.changed
    return result


def _run(launcher, script: bytes, tmp_path, *args, **env) -> str:
    """``launcher train.py args`` in ``tmp_path``; its standard output."""
    (tmp_path / "train.py").write_bytes(script)
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(OMP_NUM_THREADS="1", **env)
    done = subprocess.run([*launcher, "train.py", *args], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _free_port() -> str:
    with socket.socket() as sock:  # a fixed port may be taken on a shared machine
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _trains_and_resumes(launcher, script: bytes, directory, **env) -> list[dict[str, list[float]]]:
    """Each rank's losses over a run of two epochs, which saves a checkpoint, and over a run that
    resumes from it for a third (the branch that binds the worker's only device variable)."""
    directory.mkdir(exist_ok=True)
    runs = [(), ("--epochs", "3", "--resume", "checkpoint.pth.tar")]
    found = []
    for args in runs:
        output = _run(launcher, script, directory, *args, "--dist-url", f"tcp://127.0.0.1:{_free_port()}", **env)
        losses: dict[str, list[float]] = {}
        for rank, loss in _STEP.findall(output):
            losses.setdefault(rank, []).append(float(loss))
        found.append(losses)
    return found


def test_torch_xla_launches_the_workers_which_count_their_devices():
    result = _migrated(SPAWN, "torch_xla")
    text = result.output.decode()
    assert "torch_xla.launch(demo_fn, args=(world_size,))" in text and "mp.spawn(" not in text
    assert "def demo_basic(rank, world_size):\n    world_size = xr.global_runtime_device_count()\n" in text
    assert "n = xr.global_runtime_device_count() // world_size" in text
    assert "ToyModel().to(torch_xla.device())" in text
    # The launching process may not ask torch_xla anything: its count stays, and only sizes the launch.
    assert '    world_size = torch.cuda.device_count()\n    run_demo(' in text
    assert [d.code for d in result.diagnostics] == ["ACC004"]


def test_a_check_of_the_count_before_the_launch_is_reported():
    checked = SPAWN.replace(b"    run_demo(demo_basic, world_size)",
                            b"    assert world_size >= 2, 'needs 2 GPUs'\n    run_demo(demo_basic, world_size)")
    result = _migrated(checked, "torch_xla")
    [count] = [d for d in result.diagnostics if d.code == "ACC010"]
    assert count.line == 62 and "before torch_xla.launch" in count.message
    assert "move it into the launched function" in count.help


def test_a_spawn_the_launcher_cannot_take_is_left_and_reported():
    source = SPAWN.replace(b"nprocs=world_size, join=True)", b"nprocs=world_size, join=False).join()")
    result = _migrated(source, "torch_xla")
    assert b"mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=False)" in result.output
    assert b"global_runtime_device_count()\n    print(" not in result.output  # nothing recounted
    assert any(d.code == "ACC004" and "cannot become torch_xla.launch" in d.message for d in result.diagnostics)


def test_a_launched_function_of_another_file_is_said_to_get_the_launching_count():
    source = b"import torch\nimport torch.multiprocessing as mp\nfrom worker import train\n\n" \
             b"world_size = torch.cuda.device_count()\nmp.spawn(train, args=(world_size,), nprocs=world_size)\n"
    result = _migrated(source, "torch_xla")
    assert b"torch_xla.launch(train, args=(world_size,))" in result.output
    assert [(d.code, d.line) for d in result.diagnostics] == [("ACC004", 6)]


def test_torchacc_keeps_the_spawn_and_the_scripts_rendezvous():
    text = _migrated(SPAWN, "torchacc").output.decode()
    assert "mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)" in text
    assert 'init_process_group("xla", init_method="env://", rank=rank, world_size=world_size)' in text


@pytest.mark.slow
def test_runtime_form_trains_on_two_gloo_processes(tmp_path):
    text = _migrated(SPAWN, "runtime").output.decode()
    assert "xmp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)" in text
    output = _run([sys.executable], text.encode(), tmp_path, CPU_NUM_DEVICES="2", MASTER_PORT=_free_port())
    found = sorted(_SPAWNED.findall(output))
    assert [(rank, world) for rank, world, _ in found] == [("0", "2"), ("1", "2")], output
    assert found[0][2] == found[1][2]  # the gradients were averaged: the replicas agree


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_runs_to_its_end_on_one_device(tmp_path, xla_python):
    output = _run([xla_python], _migrated(SPAWN, "torch_xla").output, tmp_path, PJRT_DEVICE="CPU")
    assert [(rank, world) for rank, world, _ in _SPAWNED.findall(output)] == [("0", "1")], output


def test_the_guard_counts_the_targets_devices():
    for target in ("runtime", "torch_xla"):
        assert b"if xr.global_runtime_device_count() < args.min_gpus:" in _migrated(GUARD, target).output


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_runtime_guard_passes_under_accrun_with_two_processes(tmp_path):
    script = _migrated(GUARD, "runtime").output
    accrun = [sys.executable, "-m", "accrewrite.launcher", "--standalone", "--nproc_per_node", "2"]
    output = _run(accrun, script, tmp_path)
    found = sorted(_TRAINED.findall(output))
    assert [rank for rank, _ in found] == ["0", "1"] and found[0][1] == found[1][1], output
    assert _REFUSED in _run([sys.executable], script, tmp_path)  # one process: one CPU device


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_guard_reads_the_one_pjrt_cpu_device(tmp_path, xla_python):
    script = _migrated(GUARD, "torch_xla").output
    torchrun = [xla_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    assert _REFUSED in _run(torchrun, script, tmp_path, PJRT_DEVICE="CPU")
    trained = _run(torchrun, script, tmp_path, "--min-gpus", "1", PJRT_DEVICE="CPU")
    assert [rank for rank, _ in _TRAINED.findall(trained)] == ["0"]


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_runtime_form_of_the_accelerator_script_trains_on_two_processes(tmp_path):
    accrun = [sys.executable, "-m", "accrewrite.launcher", "--standalone", "--nproc_per_node", "2"]
    output = _run(accrun, _migrated(ACCELERATOR, "runtime").output, tmp_path)
    found = sorted(_TRAINED.findall(output))
    assert [rank for rank, _ in found] == ["0", "1"] and found[0][1] == found[1][1], output


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_of_the_accelerator_script_runs_under_torchrun(tmp_path, xla_python):
    torchrun = [xla_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    output = _run(torchrun, _migrated(ACCELERATOR, "torch_xla").output, tmp_path, PJRT_DEVICE="CPU")
    assert [rank for rank, _ in _TRAINED.findall(output)] == ["0"], output


@pytest.mark.slow
def test_runtime_form_of_the_resuming_worker_trains_and_resumes_on_two_gloo_processes(tmp_path):
    """Without --resume the worker binds no ``loc``: what the migration writes for its
    ``.cuda(args.gpu)`` moves and its loader names the target's device itself."""
    first, resumed = _trains_and_resumes([sys.executable], _migrated(RESUME, "runtime").output, tmp_path,
                                         CPU_NUM_DEVICES="2")
    assert sorted(first) == ["0", "1"] and first["0"] == first["1"] and len(first["0"]) == 6, first
    assert sorted(resumed) == ["0", "1"] and resumed["0"] == resumed["1"] and len(resumed["0"]) == 3, resumed


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_of_the_resuming_worker_trains_and_resumes_as_the_runtime_form_does(tmp_path, xla_python):
    """Every rank reads the same batches: one process's losses are each rank's."""
    ran = _trains_and_resumes([xla_python], _migrated(RESUME, "torch_xla").output, tmp_path / "xla",
                              PJRT_DEVICE="CPU")
    reference = _trains_and_resumes([sys.executable], _migrated(RESUME, "runtime").output, tmp_path / "runtime",
                                    CPU_NUM_DEVICES="1")
    for losses, expected in zip(ran, reference):
        assert list(losses) == ["0"] and losses["0"] == pytest.approx(expected["0"], rel=1e-4)


def test_torch_xla_workers_read_the_world_size_where_the_devices_are():
    """The launching process keeps CUDA's count (it may not ask torch_xla before the launch), so
    the world size it works out of the count is read again in each worker."""
    text = _migrated(WORLD, "torch_xla").output.decode()
    assert "    args.ngpus_per_node = torch.cuda.device_count()\n    args.world_size = args.ngpus_per_node * args.nodes\n" \
        in text
    assert ("def main_worker(gpu, args):\n    args.ngpus_per_node = xr.global_runtime_device_count()\n"
            "    args.world_size = xr.global_runtime_device_count()\n    args.rank = gpu\n") in text


def test_a_world_size_the_worker_works_out_itself_is_left():
    source = WORLD.replace(b"    args.rank = gpu\n", b"    args.rank = gpu\n    world_size = args.nodes\n").replace(
        b"world_size=args.world_size, rank", b"world_size=world_size, rank")
    assert b"    world_size = xr." not in _migrated(source, "torch_xla").output


def _split_runs(launcher, script: bytes, directory, **env) -> list[tuple[str, str, str, str]]:
    directory.mkdir()
    url = f"tcp://127.0.0.1:{_free_port()}"
    return sorted(_SPLIT.findall(_run(launcher, script, directory, "--dist-url", url, **env)))


@pytest.mark.slow
def test_runtime_form_splits_the_batch_over_two_gloo_processes(tmp_path):
    found = _split_runs([sys.executable], _migrated(WORLD, "runtime").output, tmp_path / "run", CPU_NUM_DEVICES="2")
    assert [(rank, world, batch) for rank, world, batch, _ in found] == [("0", "2", "16"), ("1", "2", "16")], found
    assert found[0][3] == found[1][3]  # the gradients were averaged: the replicas agree


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_trains_on_one_device_as_the_runtime_form_on_one_process(tmp_path, xla_python):
    found = _split_runs([xla_python], _migrated(WORLD, "torch_xla").output, tmp_path / "xla", PJRT_DEVICE="CPU")
    reference = _split_runs([sys.executable], _migrated(WORLD, "runtime").output, tmp_path / "runtime",
                            CPU_NUM_DEVICES="1")
    assert [(rank, world, batch) for rank, world, batch, _ in found] == [("0", "1", "32")], found
    assert float(found[0][3]) == pytest.approx(float(reference[0][3]), rel=1e-4)
