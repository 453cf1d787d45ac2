"""DataParallel scripts migrated and run: the runtime form on this CPU, the torch_xla form on
PJRT's CPU device.

tests/rules/fixtures/dataparallel_checkpoint.in.py saves the wrapper's state dict (keys under
``module.``, or ``features.module.`` where only the feature extractor is wrapped) and loads one
strictly or, fine-tuning, with ``strict=False``. ACC005 removes the wrapper, so the migrated script
must load the original's checkpoint with every weight as saved: with ``strict=False`` a key left
under ``module.`` would load nothing and train from scratch with no error.

tests/rules/fixtures/dataparallel_setattr.in.py stores the wrapper through ``setattr`` and reads
it back with ``getattr``, where ACC005 cannot rewrite ``.module``: it keeps the wrapper, and the
migrated script trains, saves and loads its networks to its end.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"


def _run(python: str, script: Path, cwd: Path, *args: str, **env: str) -> str:
    """The output of ``script`` run in ``cwd``, where it writes its checkpoints."""
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(env, OMP_NUM_THREADS="1")
    done = subprocess.run([python, str(script), *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script.name} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _losses(output: str) -> list[float]:
    found = [float(line.split()[1]) for line in output.splitlines() if line.startswith("loss ")]
    assert found, f"no loss lines in:\n{output[-2000:]}"
    return found


def _migrated(name: str, target: str, directory: Path) -> Path:
    result = migrate_source((FIXTURES / f"{name}.in.py").read_bytes(), f"{name}.py", Options(target=target))
    assert result.error is None and result.changed, result.error
    path = directory / f"{name}_{target}.py"
    path.write_bytes(result.output)
    return path


def _python(target: str, request) -> tuple[str, dict[str, str]]:
    if target == "torch_xla":
        return request.getfixturevalue("xla_python"), {"PJRT_DEVICE": "CPU"}
    return sys.executable, {}


TARGETS = [pytest.param("runtime", marks=pytest.mark.slow),
           pytest.param("torch_xla", marks=[pytest.mark.slow, pytest.mark.xla])]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", ["whole", "features"])
@pytest.mark.parametrize("fine_tune", [False, True], ids=["strict", "strict_false"])
def test_the_originals_checkpoint_loads_into_the_migrated_script(target, arch, fine_tune, tmp_path, request):
    python, env = _python(target, request)
    original = FIXTURES / "dataparallel_checkpoint.in.py"
    saved = tmp_path / "original.pt"
    _run(sys.executable, original, tmp_path, "--arch", arch, "--save", str(saved))
    wrapped = torch.load(saved)
    prefix = "module." if arch == "whole" else "features.module."
    assert any(key.startswith(prefix) for key in wrapped), list(wrapped)

    resume = ["--arch", arch, "--saved_model", str(saved), *(["--FT"] if fine_tune else [])]
    reference = _losses(_run(sys.executable, original, tmp_path, *resume))
    loaded = tmp_path / "loaded.pt"
    output = _run(python, _migrated("dataparallel_checkpoint", target, tmp_path), tmp_path, *resume,
                  "--loaded", str(loaded), **env)

    state = torch.load(loaded)
    expected = {key.replace("module.", "", 1): value for key, value in wrapped.items()}
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key
    assert _losses(output) == pytest.approx(reference, rel=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_the_wrapper_stored_through_setattr_is_kept_and_the_script_runs_to_its_end(target, tmp_path, request):
    """The original places its networks on ``cuda:<gpu_ids[0]>``, so on this CPU it runs with
    ``--gpu_ids -1`` (no wrapper); migrated, it keeps the GPU ids and their wrapper, which calls the
    network itself where there is no CUDA device, and saves and loads through ``.module`` as the
    original does on CUDA. The runtime form keeps ``torch.cuda.is_available()`` before that save,
    which on this CPU saves the wrapper's keys that ``load_networks`` cannot read, as the original
    would: it runs here with ``--gpu_ids -1`` too."""
    python, env = _python(target, request)
    original = FIXTURES / "dataparallel_setattr.in.py"
    reference = _losses(_run(sys.executable, original, tmp_path, "--gpu_ids", "-1"))
    args = ["--gpu_ids", "-1"] if target == "runtime" else []
    output = _run(python, _migrated("dataparallel_setattr", target, tmp_path), tmp_path, *args, **env)
    assert _losses(output) == pytest.approx(reference, rel=1e-4)
