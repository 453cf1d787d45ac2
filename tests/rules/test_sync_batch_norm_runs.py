"""A data-parallel script with synchronized batch norm (tests/rules/fixtures/sync_batch_norm.in.py:
the BatchNorm layers converted before DDP wraps the model) runs where it is migrated: the runtime
target on this CPU with two gloo processes, which must train as one process given both ranks'
batches together, and the torch_xla target on PJRT's CPU device (one device: the conversion is
removed there, and one replica's statistics are the whole batch's)."""

import re
import sys
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

from test_spawned_ddp_runs import _run

SOURCE = (Path(__file__).parent / "fixtures" / "sync_batch_norm.in.py").read_bytes()
# The ranks share one pipe, and a line's text and its newline may reach it apart: the numbers
# are matched by their format.
_TRAINED = re.compile(r"rank (\d): loss (-?\d+\.\d{4}) state (-?\d+\.\d{6})")


def _migrated(target: str) -> bytes:
    result = migrate_source(SOURCE, "train.py", Options(target=target))
    assert result.error is None and result.changed
    return result.output


def _trained(launcher: list[str], script: bytes, tmp_path: Path, *args: str, **env: str) -> list[tuple[str, str, str]]:
    """The ``rank R: loss L state S`` lines of ``launcher train.py args``, by rank."""
    return sorted(_TRAINED.findall(_run(launcher, script, tmp_path, *args, **env)))


def _accrun(processes: int) -> list[str]:
    return [sys.executable, "-m", "accrewrite.launcher", "--standalone", "--nproc_per_node", str(processes)]


def test_the_runtime_form_converts_to_the_runtimes_sync_batch_norm():
    assert b"model = accrt.nn.SyncBatchNorm.convert_sync_batchnorm(model)" in _migrated("runtime")


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_runtime_form_on_two_gloo_processes_trains_as_one_process_with_the_whole_batch(tmp_path):
    script = _migrated("runtime")
    (single,) = _trained(_accrun(1), script, tmp_path)
    ranks = _trained(_accrun(2), script, tmp_path)
    assert [rank for rank, _, _ in ranks] == ["0", "1"]
    for _, _, state in ranks:  # parameters and running statistics
        assert float(state) == pytest.approx(float(single[2]), rel=1e-6)
    # each rank's own statistics (no conversion) train another model
    unsynchronized = _trained(_accrun(2), script, tmp_path, "--no-sync-bn")
    assert float(unsynchronized[0][2]) != pytest.approx(float(single[2]), rel=1e-3)


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_form_runs_to_its_end_on_one_device(tmp_path, xla_python):
    torchrun = [xla_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    (xla,) = _trained(torchrun, _migrated("torch_xla"), tmp_path, PJRT_DEVICE="CPU")
    (runtime,) = _trained(_accrun(1), _migrated("runtime"), tmp_path)
    # torch_xla's BatchNorm keeps another running variance than PyTorch's: the loss is compared
    assert (xla[0], xla[1]) == (runtime[0], runtime[1])
