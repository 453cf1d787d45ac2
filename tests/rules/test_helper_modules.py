"""A project laid out as MAE, DeiT and DETR are: distributed setup and the loss scaler that steps
the optimizer live in a helper module, the epoch in another, the entry point in a third.
Migrating the directory migrates them consistently: DistributedDataParallel goes from the entry
point and the reduction goes into the helper's scaler, so the migrated project, run on two
processes, trains exactly as the original. Where the helper does not reduce (skipped, or not
migrated with the entry point), DDP stays in the entry point, and says why."""

import pytest

from mae_project import ENGINE, MAIN, MISC

from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source


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


def _migrate(*args) -> None:
    assert main(["migrate", *map(str, args)]) == 0


def test_migrating_the_project_drops_ddp_where_the_helper_reduces(project, capsys):
    _migrate(project)
    out = capsys.readouterr().out
    assert "-model = torch.nn.parallel.DistributedDataParallel(" in out
    assert "+        xm.reduce_gradients(optimizer)" in out
    assert "ACC005" not in out


@pytest.mark.parametrize("helper", ["skipped", "not migrated with it"])
def test_where_the_helper_that_steps_does_not_reduce_ddp_is_kept_and_said_so(project, capsys, helper):
    if helper == "skipped":
        (project / "util" / "misc.py").write_text("# accrewrite: skip-file\n" + MISC)
        _migrate(project, "--jobs", "2")  # migrated again keeping DDP in a worker, as the first time
    else:
        _migrate(project / "main.py")
    out = " ".join(capsys.readouterr().out.split())
    assert "+model = torch.nn.parallel.DistributedDataParallel(model)" in out  # only CUDA's device_ids= go
    kept = "ACC005 DistributedDataParallel kept: util/misc.py steps the optimizer without an all-reduce"
    assert f"main.py:21:9: {kept}" in out


def test_migrated_alone_after_the_helper_was_main_drops_ddp(project, capsys):
    _migrate(project / "util" / "misc.py", "--in-place")
    _migrate(project / "main.py", "--in-place")
    assert "DistributedDataParallel(" not in (project / "main.py").read_text()
    assert "xm.reduce_gradients(optimizer)" in (project / "util" / "misc.py").read_text()


@pytest.mark.launches_ranks
def test_the_migrated_project_trains_as_the_original_on_two_processes(project, capsys):
    code = main(["verify", "main.py", "--nproc", "2", "--steps", "4", "--", "--device", "cpu"])
    assert code == 0, capsys.readouterr()
    assert "match: 4 steps" in capsys.readouterr().out


@pytest.mark.launches_ranks
def test_without_the_helper_migrated_ddp_is_kept_and_the_ranks_train_alike(project, capsys):
    # The helper that steps is marked to be skipped: it would not reduce, so DDP stays in main.py
    # (where it went, every rank trained on its own gradients and the replicas drifted apart).
    (project / "util" / "misc.py").write_text("# accrewrite: skip-file\n" + MISC)
    code = main(["verify", "main.py", "--nproc", "2", "--steps", "4", "--", "--device", "cpu"])
    assert code == 0, capsys.readouterr()
    assert "match: 4 steps" in capsys.readouterr().out
