"""accrun: torchrun plus the runtime's settings, run for real on 2 processes."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import pytest

from accrewrite import launcher

SCRIPT = """
import os, sys
import torch
import accrewrite.runtime.xla_model as xm

total = xm.all_reduce(xm.REDUCE_SUM, torch.tensor([float(xm.get_ordinal() + 1)]))
print(f"rank={xm.get_ordinal()} world={xm.world_size()} local={xm.get_local_ordinal()} "
      f"sum={total.item()} dtype={os.environ.get('ACCREWRITE_ALLREDUCE_DTYPE')} "
      f"omp={os.environ['OMP_NUM_THREADS']} args={sys.argv[1:]}", flush=True)
"""


def _accrun(args, tmp_path, **kwargs):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = [sys.executable, "-m", "accrewrite.launcher", *args[:-1], str(script), *args[-1]]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, **kwargs)


def test_console_script_is_declared():
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("accrun") == "accrewrite.launcher:main"


def test_importing_the_launcher_does_not_import_torch():
    code = "import sys, accrewrite.launcher; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_own_options_lead_and_become_environment():
    environment, rest = launcher.split_own_options(
        ["--allreduce-dtype", "bf16", "--bucket-mb=4", "--nproc_per_node", "2", "train.py", "--bucket-mb", "9"]
    )
    assert environment == {"ACCREWRITE_ALLREDUCE_DTYPE": "bf16", "ACCREWRITE_BUCKET_MB": "4.0"}
    assert rest == ["--nproc_per_node", "2", "train.py", "--bucket-mb", "9"]  # the script's own
    assert launcher.split_own_options(["train.py"]) == ({}, ["train.py"])


@pytest.mark.parametrize(
    "argv, message",
    [(["--allreduce-dtype", "int8", "x.py"], "invalid choice"), (["--bucket-mb", "0", "x.py"], "above 0"),
     (["--bucket-mb", "nan", "x.py"], "finite"), (["--bucket-mb=inf", "x.py"], "finite"),
     (["--bucket-mb", "many", "x.py"], "not a number")],
)
def test_bad_options_exit_with_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        launcher.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.launches_ranks
@pytest.mark.slow  # starts torchrun and two processes
def test_two_processes_under_accrun(tmp_path):
    result = _accrun(["--allreduce-dtype", "fp16", "--nproc_per_node", "2", ["--lr", "0.1"]], tmp_path)
    assert result.returncode == 0, result.stderr
    # The two ranks share stdout: a line of one may land inside a line of the other.
    lines = sorted(re.findall(r"rank=\d+ .*?args=\[[^\]]*\]", result.stdout))
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank={rank} world=2 local={rank} sum=3.0 dtype=fp16 ")
        assert "args=['--lr', '0.1']" in line
        assert int(line.split("omp=")[1].split()[0]) >= 1


def test_a_failing_script_fails_the_launch(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit(3)\n")
    result = subprocess.run(
        [sys.executable, "-m", "accrewrite.launcher", "--nproc_per_node", "1", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0


@pytest.mark.parametrize("restarts, expected", [("0", None), ("1", "1")])
def test_elastic_restarts_get_their_own_rendezvous_store(restarts, expected, monkeypatch):
    from torch.distributed import run as torchrun

    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "set before")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")  # restored at teardown
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # main sets it
    monkeypatch.setattr(torchrun, "main", lambda argv: None)
    launcher.main(["--max-restarts", restarts, "--standalone", "--nproc_per_node", "1", "train.py"])
    assert os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == expected
