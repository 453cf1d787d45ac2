"""--guard VAR: TorchAcc's migration guide's dual-path form."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

SCRIPT = textwrap.dedent(
    '''
    import sys
    import torch

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(2).to("cuda" if torch.cuda.is_available() else "cpu")
    loaded = sorted(name for name in sys.modules if name.startswith(("torchacc", "accrewrite")))
    print(device, x.sum().item(), loaded)
    '''
).lstrip()


def guarded(source: str, target="runtime") -> str:
    result = migrate_source(source.encode(), "train.py", Options(target=target, guard="ACC_ON"))
    assert result.error is None
    return result.output.decode()


def test_guarded_form_keeps_the_original_in_else_branches():
    output = guarded("import torch\n\ntorch.manual_seed(0)\nmodel = model.cuda()\ntorch.cuda.set_device(0)\n", "torchacc")
    assert output == textwrap.dedent(
        '''\
        import torch
        import os


        def enable_torchacc_compiler():
            return os.getenv('ACC_ON') is not None

        if enable_torchacc_compiler():
            import torchacc.torch_xla.core.xla_model as xm


        if enable_torchacc_compiler():
            xm.set_rng_state(0)
            model = model.to(xm.xla_device())
        else:
            torch.manual_seed(0)
            model = model.cuda()
            torch.cuda.set_device(0)
        '''
    )
    compile(output, "guarded.py", "exec")


def test_every_fixture_takes_the_guarded_form_the_net_accepts():
    """The guard keeps each original statement beside its migrated form, a statement moved (an
    optimizer built after the model's move) included: the net must see every name bound."""
    fixtures = sorted((Path(__file__).parents[1] / "rules" / "fixtures").glob("*.in.py"))
    failed = {}
    for path in fixtures:
        result = migrate_source(path.read_bytes(), str(path), Options(target="torchacc", guard="ACC_ON"))
        if result.error is not None:
            failed[path.name] = result.error.reason
    assert fixtures and not failed


def test_hooks_before_the_imports_get_the_switch_at_the_top():
    output = guarded("import torch\nimport torch.nn as nn\nnorm = nn.LayerNorm(8)\n", "torchacc")
    assert output.startswith(
        "import os\n\n\ndef enable_torchacc_compiler():\n    return os.getenv('ACC_ON') is not None\n"
        "if enable_torchacc_compiler():\n    from torchacc.runtime import hooks\n    hooks.enable_fused_layer_norm()\n"
        "import torch\n"
    )


def test_removal_alone_becomes_if_not_enabled():
    output = guarded("import torch\nx = 1\ntorch.cuda.set_device(0)\ny = 2\n")
    assert "x = 1\nif not enable_accrewrite_runtime():\n    torch.cuda.set_device(0)\ny = 2\n" in output


def test_second_guarded_run_changes_nothing():
    once = guarded(SCRIPT, "torchacc")
    assert guarded(once, "torchacc") == once


def run(code: str, tmp_path, env_value):
    path = tmp_path / "train.py"
    path.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "ACC_ON"}
    if env_value is not None:
        env["ACC_ON"] = env_value
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_unset_runs_the_original_path_and_imports_no_target(tmp_path):
    code = guarded(SCRIPT)
    assert run(code, tmp_path, None) == run(SCRIPT, tmp_path, None)
    assert run(code, tmp_path, None).rstrip().endswith("[]")


def test_set_runs_the_target_path(tmp_path):
    output = run(guarded(SCRIPT), tmp_path, "1")
    assert "accrewrite.runtime.xla_model" in output
