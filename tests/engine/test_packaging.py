"""The distribution: a wheel installs in a fresh virtual environment without torch, and the
pre-commit hooks work from this repository."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
UNMIGRATED = "import torch\n\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(2, 2).cuda()\n"


def run(*args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path / "dist", ROOT)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("accrewrite-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ("accrewrite/cli.py", "accrewrite/rules/acc001_rng_seed.py",
                     "accrewrite/rules/targets/torch_xla.toml", "accrewrite/runtime/__init__.py",
                     "accrewrite/kernels/__init__.py", "accrewrite/verify/probe.py",
                     "accrewrite/verify/hooks/sitecustomize.py"):
        assert expected in names

    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    installed = run(bin_dir / "python", "-m", "pip", "install", "--quiet", wheel)
    assert installed.returncode == 0, installed.stderr
    helped = run(bin_dir / "accrewrite", "--help")
    assert helped.returncode == 0 and "migrate" in helped.stdout
    imported = run(bin_dir / "python", "-c",
                   "import accrewrite.rules, accrewrite.runtime, accrewrite.kernels\n"
                   "from accrewrite.registry import all_rules\n"
                   "print(sorted(all_rules()))", cwd=tmp_path)
    assert imported.returncode == 0 and "ACC001" in imported.stdout, imported.stderr
    listed = run(bin_dir / "python", "-m", "pip", "list", "--format=freeze").stdout.lower()
    assert "libcst==" in listed and "rich==" in listed and "pyflakes==" in listed
    assert "torch" not in listed and "triton" not in listed


@pytest.mark.slow
def test_pre_commit_hooks_migrate_then_pass(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_CONFIG_GLOBAL": os.devnull}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    assert run(*git, "init", "-q", cwd=project).returncode == 0
    script = project / "train.py"
    script.write_text(UNMIGRATED)
    notebook = project / "lesson.ipynb"
    notebook.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(UNMIGRATED)])))
    course = notebook.read_text()
    (project / "tests").mkdir()
    unit_test = project / "tests" / "test_train.py"
    unit_test.write_text(UNMIGRATED)  # a unit test seeds and steps too: not a training script
    run(*git, "add", "train.py", "lesson.ipynb", "tests/test_train.py", cwd=project)

    def try_hook(hook):
        return run("pre-commit", "try-repo", ROOT, hook, "--all-files", cwd=project, env=env)

    checked = try_hook("accrewrite-check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert script.read_text() == UNMIGRATED and notebook.read_text() == course  # the check hook writes nothing

    first = try_hook("accrewrite")
    assert first.returncode == 1, first.stdout + first.stderr  # it changed a file: the commit stops
    assert "xm.set_rng_state(0)" in script.read_text()
    assert "xm.set_rng_state(0)" in notebook.read_text()
    run(*git, "add", "train.py", "lesson.ipynb", cwd=project)
    second = try_hook("accrewrite")
    assert second.returncode == 0, second.stdout + second.stderr
    assert try_hook("accrewrite-check").returncode == 0
    assert unit_test.read_text() == UNMIGRATED  # the hooks leave tests out
