"""TorchAcc 1.x's module names answered by the runtime (``accrewrite.runtime.torchacc_names``):
every import the ``torchacc`` target writes resolves to its counterpart, and nothing stays
installed after the hook is taken out."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import accrewrite.runtime as accrt
import accrewrite.runtime.xla_model as runtime_xm
from accrewrite.runtime.torchacc_names import MODULES, counterpart, torchacc_names

ROOT = Path(__file__).resolve().parents[2]
TORCHACC_TARGET = ROOT / "rules" / "targets" / "torchacc.toml"
DOCS = ROOT / "docs" / "torchacc_names.md"


def test_the_torch_xla_modules_are_the_runtime_modules():
    with torchacc_names():
        import torchacc.torch_xla.core.xla_model as xm
        import torchacc.torch_xla.distributed.parallel_loader as pl
        from torchacc.torch_xla.amp import GradScaler, autocast, syncfree

        assert xm is runtime_xm
        assert pl is accrt.parallel_loader
        assert (GradScaler, autocast, syncfree.AdamW) == (accrt.amp.GradScaler, accrt.amp.autocast, accrt.amp.syncfree.AdamW)
        # the runtime module keeps its own spec (pickling, reloading and tracebacks use it)
        assert xm.__spec__.name == "accrewrite.runtime.xla_model"


def test_torchacc_runtime_names_and_auto_checkpoint():
    with torchacc_names():
        import torchacc
        from torchacc.runtime import hooks
        from torchacc.runtime.nn.quick_gelu import QuickGelu
        from torchacc.runtime.nn.window_process import WindowProcess
        from torchacc.runtime.nn.dcn_v2 import DCN, DCNv2

        assert torchacc.auto_checkpoint is accrt.auto_checkpoint
        assert hooks is accrt.hooks
        assert QuickGelu is accrt.nn.QuickGelu and WindowProcess is accrt.nn.WindowProcess
        assert (DCN, DCNv2) == (accrt.nn.DCN, accrt.nn.DCNv2)


def test_every_import_the_torchacc_target_writes_resolves():
    imports = tomllib.loads(TORCHACC_TARGET.read_text())["imports"]
    lines = [line for line in imports.values() if "torchacc" in line]
    assert len(lines) >= 10
    with torchacc_names():
        for line in lines:
            exec(line, {})  # noqa: S102 - the target's own import lines


def test_names_the_runtime_lacks_are_not_found():
    with torchacc_names():
        with pytest.raises(ModuleNotFoundError, match="accrewrite.runtime has no 'accrewrite.runtime.nn.rms_norm'"):
            import torchacc.runtime.nn.rms_norm  # noqa: F401
        with pytest.raises(ModuleNotFoundError, match="torchacc.torch_xla.distributed.fsdp"):
            import torchacc.torch_xla.distributed.fsdp  # noqa: F401
    with pytest.raises(KeyError):
        counterpart("torchacc.torch_xla.debug")


def test_nothing_stays_after_the_hook_is_taken_out():
    meta_path = list(sys.meta_path)
    with torchacc_names():
        import torchacc.torch_xla.core.xla_model  # noqa: F401
        import torchacc.runtime.hooks  # noqa: F401
    assert sys.meta_path == meta_path
    assert not [name for name in sys.modules if name.split(".")[0] == "torchacc"]
    with pytest.raises(ModuleNotFoundError):
        import torchacc  # noqa: F401
    assert not hasattr(accrt, "torch_xla")


def test_every_counterpart_exists_and_is_documented():
    table = DOCS.read_text()
    for torchacc_name, runtime_name in MODULES.items():
        assert counterpart(torchacc_name) == runtime_name
        __import__(runtime_name)
        assert f"| `{torchacc_name}` | `{runtime_name}` |" in table


def test_runs_a_script_as_python_would(tmp_path):
    script = tmp_path / "train.py"
    (tmp_path / "helper.py").write_text("VALUE = 3\n")
    script.write_text(
        "import sys\n"
        "import helper\n"
        "import torchacc.torch_xla.core.xla_model as xm\n"
        "print(__name__, sys.argv[1:], helper.VALUE, xm is sys.modules['accrewrite.runtime.xla_model'])\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "accrewrite.runtime.torchacc_names", str(script), "--steps", "2"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path.parent,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "__main__ ['--steps', '2'] 3 True\n"
