"""The examples' ``torchacc`` forms run end to end on accrewrite.runtime: TorchAcc 1.x's module
names answered by ``accrewrite.runtime.torchacc_names`` (where TorchAcc is not installed), each
launched by ``accrun -m accrewrite.runtime.torchacc_names train.py``, trains like the original
script (same losses within RUNTIME_TOL)."""

import pytest
from test_run_examples import (
    DISTRIBUTED,
    EXAMPLES,
    EXAMPLES_RUN,
    NAMES,
    RUNTIME_TOL,
    _accrun,
    _env,
    assert_close,
    reference,
    run_script,
)

TORCHACC_NAMES = ("-m", "accrewrite.runtime.torchacc_names")


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("torchacc_forms"))


@pytest.mark.launches_ranks
@pytest.mark.slow  # torchrun + the runtime's process group
@pytest.mark.parametrize("name", NAMES)
def test_torchacc_form_on_the_runtime_matches(name, tmp_root, tmp_path):
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / "torchacc.py"
    losses = run_script(script, [*_accrun(1), *TORCHACC_NAMES], example.launch_args, tmp_path, _env())
    assert_close(losses, reference(name, 1, tmp_root), RUNTIME_TOL, f"{name} torchacc form, accrun 1 process")


@pytest.mark.launches_ranks
@pytest.mark.slow  # two ranks on the 'xla' backend, gloo underneath
def test_torchacc_form_on_two_processes_matches_ddp(tmp_root, tmp_path):
    name = "torchrun_ddp"
    assert name in DISTRIBUTED
    example = EXAMPLES_RUN[name]
    script = EXAMPLES / name / "migrated" / "torchacc.py"
    losses = run_script(script, [*_accrun(2), *TORCHACC_NAMES], example.launch_args, tmp_path, _env())
    assert_close(losses, reference(name, 2, tmp_root), RUNTIME_TOL, f"{name} torchacc form, accrun 2 processes")

