"""The golden fixtures that are whole scripts run, migrated, to their end: the runtime form on this
CPU and the torch_xla form under torch_xla on PJRT's CPU device, where a tensor left on the host
beside one on the device fails (``Expected XLA tensor``), as a name the migration left unbound
does on every target. Each prints ``loss ...`` lines; they must match the original's (or, where
the original needs CUDA, the runtime form's), and the torch_xla form must have run on the device,
unless the migration left the file as it is (then nothing runs there).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
# Fixture -> whether the original runs on a CPU (those that place by CUDA ordinal do not).
RUNNABLE = {
    "tutorial_module_level": True,
    "batch_dtype": True,
    "gan_created_tensors": True,
    "gan_onehot_labels": True,
    "gan_label_shuffle": True,
    # a DCGAN loop whose discriminator scores are read on the host only to be printed
    "gan_logged_reads": True,
    "no_device": True,
    "device_option_cpu": True,
    "device_param_rank": False,
    "late_device": True,
    "cuda_tensor_types": True,
    # conditional and Wasserstein GANs made of legacy CUDA tensor types, sampled at the end
    "gan_legacy_types": True,
    # a device variable bound on some paths only: in one arm of an if, in a try body, below a loop
    "branch_device": True,
    "try_device": True,
    "loop_device": True,
    # device selection of research scripts: a CUDA device context, a negated CUDA check, a device
    # chosen by the GPU count, the current CUDA device named as the device, and a checkpoint's
    # storages restored on CUDA by a map_location function
    "cuda_device_context": True,
    "negated_cuda_check": True,
    "device_from_count": True,
    "current_device": False,
    "storage_map_location": False,
    # a trainer that moves the model it is handed, whose optimizer was built before the move
    "trainer_given_model": True,
    # an autocast of the script's own, named as the target's import of it
    "local_autocast": True,
    # modules moved after their optimizer was built, a forward pass's output holding the weights
    "optimizer_before_move": True,
    # the pix2pix family's init_net: an assertion of CUDA, a move to the first of --gpu_ids
    "init_net_gpu_ids": False,
    # a --device option whose "auto" the script resolves itself, compared while still a string
    "device_auto_option": True,
    # scripts that train on the host, left as they are: one seeds CUDA's generators, one updates
    # tensors it built by hand
    "host_cuda_seed": True,
    "host_hand_built": True,
    # a first model trained on the host on purpose, a second placed on the device
    "host_first_model": True,
    # a language model's corpus moved to the device once and sliced at the step's offset
    "word_lm_corpus": True,
    # a network traced before training on the device it was moved to, the traced module saved
    "trace_tools": True,
    # running sums of the loss logged every few steps: a sum read by a format, a meter's update
    "running_sums": True,
}
TOLERANCE = 1e-4
_LOSS = re.compile(r"^loss ([-\d. e+]+)$", re.MULTILINE)
# Runs a script as `python script.py` would, then prints how many graphs torch_xla executed.
_XLA_WRAPPER = (
    "import runpy, sys; path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__'); "
    "import torch_xla.debug.metrics as m; data = m.metric_data('ExecuteTime'); "
    "print('xla executions', data[0] if data else 0)"
)


def _run(command: list[str], cwd: Path, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environment.update(env, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command[-1]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _losses(output: str) -> list[float]:
    found = [float(value) for line in _LOSS.findall(output) for value in line.split()]
    assert found, f"no loss lines in:\n{output[-2000:]}"
    return found


def _migrated(name: str, target: str, directory: Path) -> tuple[Path, bool]:
    """The migrated script's path, and whether the migration changed it."""
    source = (FIXTURES / f"{name}.in.py").read_bytes()
    result = migrate_source(source, f"{name}.py", Options(target=target))
    assert result.error is None, result.error
    path = directory / f"{name}_{target}.py"
    path.write_bytes(result.output)
    return path, result.changed


def _reference(name: str, tmp_path: Path) -> list[float]:
    if RUNNABLE[name]:
        return _losses(_run([sys.executable, str(FIXTURES / f"{name}.in.py")], tmp_path))
    return _losses(_run([sys.executable, str(_migrated(name, "runtime", tmp_path)[0])], tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_runtime_form_runs_to_its_end(name, tmp_path):
    losses = _losses(_run([sys.executable, str(_migrated(name, "runtime", tmp_path)[0])], tmp_path))
    assert losses == pytest.approx(_reference(name, tmp_path), rel=TOLERANCE)


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_torch_xla_form_runs_to_its_end_on_the_device(name, tmp_path, xla_python):
    path, changed = _migrated(name, "torch_xla", tmp_path)
    output = _run([xla_python, "-c", _XLA_WRAPPER, str(path)], tmp_path, PJRT_DEVICE="CPU")
    assert _losses(output) == pytest.approx(_reference(name, tmp_path), rel=TOLERANCE)
    executions = int(re.search(r"^xla executions (\d+)$", output, re.MULTILINE).group(1))
    assert (executions > 0) if changed else (executions == 0)
