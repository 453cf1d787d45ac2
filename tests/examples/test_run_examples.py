"""The examples run, and their migrated forms train exactly like them.

* Every plain ``examples/<name>/train.py`` runs on the CPU (a subprocess, ``--steps`` small) and
  prints one finite loss per step.
* The guarded form's promise (TorchAcc's migration guide): every guarded form (``migrated/guarded_torchacc.py``) run with
  ``TORCHACC_COMPILER_OPT`` unset follows the original path, so it prints the same losses as the
  plain script, digit for digit (and it runs where TorchAcc is not installed).
* End to end: every ``migrated/runtime.py``, and every ``migrated/torchacc.py`` with TorchAcc's
  names answered by the runtime, runs under ``accrun --nproc_per_node 1`` and its first 20 losses
  match the plain script's (same seed, one process); a distributed example also runs under
  ``accrun --nproc_per_node 2`` and rank 0's losses match the original script launched by torchrun
  on 2 processes (DDP on gloo). Tolerance: RUNTIME_TOL.
* ``migrated/torch_xla.py`` runs under torch_xla on the CPU (``PJRT_DEVICE=CPU``,
  one device) and its losses match the plain script's within XLA_TOL. Marked ``xla``: runs where
  torch_xla is importable by this interpreter or by the one named in ``ACCREWRITE_XLA_PYTHON``
  (e.g. a scratch venv with torch 2.9.0 + torch_xla 2.9.0), and is skipped otherwise.

Each script is copied to a temporary directory as ``train.py`` and run there: a file named
``torch_xla.py`` or ``torchacc.py`` would otherwise shadow the package it imports, and whatever
a script writes stays out of the tree. nanoGPT ties its head to its embedding and hf_no_trainer
builds its optimizer before the model moves: on torch_xla both train right only because the
migration keeps the Parameter objects through the move (ACC002).
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 20
# |migrated - original| <= RUNTIME_TOL * max(1, |original|) per step; losses are printed with
# 4 decimals, and the runtime's bucketed all-reduce differs from DDP's only in rounding.
RUNTIME_TOL = 2e-3
# torch_xla on the CPU: mnist matches exactly and mingpt to 1e-4 over 20 steps; what drifts more
# than this has changed semantics.
XLA_TOL = 2e-3
LOSS = re.compile(r"\bstep (\d+) loss (-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)")
TIMEOUT = 600
XLA_TIMEOUT = 300


@dataclass(frozen=True)
class Example:
    name: str
    distributed: bool = False  # trains on several processes when launched so
    torchrun_only: bool = False  # reads LOCAL_RANK/RANK from torchrun's environment
    launch_args: tuple[str, ...] = ()  # extra arguments when launched by torchrun/accrun


EXAMPLES_RUN = {
    example.name: example
    for example in (
        Example("mnist"),
        Example("hf_no_trainer"),
        Example("mingpt"),
        Example("nanogpt", distributed=True),
        Example("imagenet", distributed=True, launch_args=("--dist-url", "env://")),
        Example("torchrun_ddp", distributed=True, torchrun_only=True),
        Example("ddp_gpt", distributed=True),
    )
}

def _env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TORCHACC", "PJRT", "XLA"))}
    env.pop("ACCREWRITE_ALLREDUCE_DTYPE", None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _torchrun(python: str, nproc: int) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]


def _accrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "accrewrite.launcher", "--standalone", "--nproc_per_node", str(nproc)]


def run_script(
    script: Path, launcher: list[str], args: tuple[str, ...], tmp: Path, env: dict, timeout: int = TIMEOUT
) -> list[float]:
    """Copy ``script`` to ``tmp/train.py``, run it, and return the loss of each step in order."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(script, tmp / "train.py")
    command = [*launcher, "train.py", "--steps", str(STEPS), *args]
    try:
        result = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{' '.join(command)} did not finish in {timeout} s: {expired.stdout!r}") from None
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} failed ({result.returncode}):\n{output[-6000:]}"
    steps = [(int(step), float(loss)) for step, loss in LOSS.findall(result.stdout)]
    assert [step for step, _ in steps] == list(range(STEPS)), f"expected steps 0..{STEPS - 1}:\n{output[-6000:]}"
    losses = [loss for _, loss in steps]
    assert all(math.isfinite(loss) for loss in losses), losses
    return losses


def plain_launcher(example: Example, python: str = sys.executable) -> list[str]:
    return _torchrun(python, 1) if example.torchrun_only else [python]


def plain_args(example: Example) -> tuple[str, ...]:
    return example.launch_args if example.torchrun_only else ()


@functools.lru_cache(maxsize=None)
def reference(name: str, nproc: int, tmp_root: str) -> tuple[float, ...]:
    """The original script's losses: one process, or torchrun with ``nproc`` processes."""
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "train.py"
    tmp = Path(tmp_root) / f"{name}-original-{nproc}"
    if nproc == 1:
        losses = run_script(script, plain_launcher(example), plain_args(example), tmp, _env())
    else:
        losses = run_script(script, _torchrun(sys.executable, nproc), example.launch_args, tmp, _env())
    return tuple(losses)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("examples"))


def assert_close(got, expected, tolerance, what):
    assert len(got) == len(expected)
    worst = max(abs(g - e) / max(1.0, abs(e)) for g, e in zip(got, expected))
    assert worst <= tolerance, f"{what}: worst relative difference {worst:.2e} > {tolerance:.0e}\n" \
        f"got      {got}\nexpected {list(expected)}"


NAMES = sorted(EXAMPLES_RUN)
DISTRIBUTED = [name for name in NAMES if EXAMPLES_RUN[name].distributed]


def test_every_example_is_run_here():
    on_disk = sorted(path.parent.name for path in EXAMPLES.glob("*/train.py"))
    assert on_disk == NAMES


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_plain_example_runs_on_cpu(name, tmp_root):
    losses = reference(name, 1, tmp_root)
    assert len(losses) == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_guarded_form_unset_follows_the_original_path(name, tmp_root, tmp_path):
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / "guarded_torchacc.py"
    losses = run_script(script, plain_launcher(example), plain_args(example), tmp_path, _env())
    assert tuple(losses) == reference(name, 1, tmp_root)


# The forms that run on accrewrite.runtime, and how accrun starts them: the torchacc form through
# TorchAcc's module names answered by the runtime (accrewrite.runtime.torchacc_names).
RUNTIME_FORMS = {"runtime": (), "torchacc": ("-m", "accrewrite.runtime.torchacc_names")}


@pytest.mark.launches_ranks
@pytest.mark.slow  # torchrun + the runtime's process group
@pytest.mark.parametrize("form", RUNTIME_FORMS)
@pytest.mark.parametrize("name", NAMES)
def test_form_on_the_runtime_under_accrun_one_process_matches(name, form, tmp_root, tmp_path):
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / f"{form}.py"
    losses = run_script(script, [*_accrun(1), *RUNTIME_FORMS[form]], example.launch_args, tmp_path, _env())
    assert_close(losses, reference(name, 1, tmp_root), RUNTIME_TOL, f"{name} {form} form, accrun 1 process")


# The torchacc target follows TorchAcc's guide, one seed on every rank instead of DDP's broadcast
# of rank 0's weights, and reports a script whose seed depends on the rank (ACC005: "nothing
# broadcasts rank 0's weights"). nanoGPT's does, so its torchacc form trains apart on two
# processes until that seed is fixed by hand.
RANK_SEEDED = {"nanogpt"}
TWO_PROCESS_RUNS = [
    (name, form) for name in DISTRIBUTED for form in RUNTIME_FORMS if not (form == "torchacc" and name in RANK_SEEDED)
]


@pytest.mark.launches_ranks
@pytest.mark.slow  # two ranks of each, on gloo
@pytest.mark.parametrize("name, form", TWO_PROCESS_RUNS)
def test_form_on_the_runtime_under_accrun_two_processes_matches_ddp(name, form, tmp_root, tmp_path):
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / f"{form}.py"
    losses = run_script(script, [*_accrun(2), *RUNTIME_FORMS[form]], example.launch_args, tmp_path, _env())
    assert_close(losses, reference(name, 2, tmp_root), RUNTIME_TOL, f"{name} {form} form, accrun 2 processes")


# torch_xla ------------------------------------------------------------------------------------


# Single-process examples, for torch_xla's one CPU device. (imagenet keeps the model on the CPU
# where `torch.cuda.is_available()` is False, as ACC010 reports; torchrun_ddp needs torchrun.)
XLA_EXAMPLES = ["mnist", "hf_no_trainer", "mingpt", "nanogpt"]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", XLA_EXAMPLES)
def test_torch_xla_form_runs_on_the_xla_cpu_device(name, tmp_root, tmp_path, xla_python):
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / "torch_xla.py"
    env = _env(PJRT_DEVICE="CPU")
    losses = run_script(script, plain_launcher(example, xla_python), plain_args(example), tmp_path, env, XLA_TIMEOUT)
    print(f"{name} torch_xla losses: {losses}")
    assert_close(losses, reference(name, 1, tmp_root), XLA_TOL, f"{name} torch_xla on PJRT_DEVICE=CPU")


@pytest.mark.launches_ranks
@pytest.mark.slow  # mp.spawn workers with their own process group
def test_imagenet_mp_spawn_workers_runtime_form_matches(tmp_path):
    """imagenet's other launch: ``--multiprocessing-distributed`` starts the workers with mp.spawn
    (one per GPU; one on a CPU-only host), no torchrun environment. The runtime form must train
    like the original there too."""
    spawn = ("--multiprocessing-distributed",)
    original = run_script(EXAMPLES / "imagenet" / "train.py", [sys.executable], spawn, tmp_path / "original", _env())
    migrated = run_script(
        EXAMPLES / "imagenet" / "migrated" / "runtime.py", [sys.executable], spawn, tmp_path / "runtime", _env()
    )
    assert_close(migrated, original, RUNTIME_TOL, "imagenet runtime form under mp.spawn")
