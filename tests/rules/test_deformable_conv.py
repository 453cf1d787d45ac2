"""ACC026 deformable-conv beyond its documented examples: which imports are dcn_v2's, what each
target gets, comments kept, the guarded form, and the migrated detection fixture trained to the
same losses as the original (with dcn_v2's classes stood in for by the per-tap loop)."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "fixtures" / "deformable_conv.in.py"
LOOP_ORACLE = HERE.parent / "runtime"


def migrate(source: str, target: str = "runtime", **options):
    return migrate_source(textwrap.dedent(source).lstrip("\n").encode(), "model.py",
                          Options(target=target, select=("ACC026",), **options))


@pytest.mark.parametrize("module", ["dcn_v2", ".DCNv2.dcn_v2", "lib.DCNv2.dcn_v2", "..networks.DCNv2_latest.dcn_v2",
                                    "models.dcnv2.dcn_v2"])
def test_the_package_and_copies_of_its_folder_are_rewritten(module):
    result = migrate(f"import torch\nfrom {module} import DCN as DeformConv\n")
    assert result.output.decode() == "import torch\nfrom accrewrite.runtime.nn import DCN as DeformConv\n"
    assert [fix.code for fix in result.fixes] == ["ACC026"]


@pytest.mark.parametrize("module", ["src.models.dcn_v2", ".dcn_v2", "layers.dcn_v2", "dcn_v2_utils"])
def test_other_modules_called_dcn_v2_are_left_alone(module):
    # Recommender code has its own DCNv2 (Deep & Cross Network) in modules of that name.
    result = migrate(f"import torch\nfrom {module} import DCN, DCNv2\n")
    assert not result.changed and not result.fixes and not result.diagnostics


def test_each_target_gets_its_own_spelling_and_reports_what_it_lacks():
    source = "import torch\nfrom dcn_v2 import DCN, DCNv2, dcn_v2_conv, DCNv2Pooling\n"
    runtime = migrate(source)
    assert runtime.output.decode().splitlines()[1:] == [
        "from accrewrite.runtime.nn import DCN, DCNv2, dcn_v2_conv",
        "from dcn_v2 import DCNv2Pooling",
    ]
    assert [d.message for d in runtime.diagnostics] == ["DCNv2Pooling from dcn_v2 kept: no target has it"]

    torchacc = migrate(source, "torchacc")
    assert torchacc.output.decode().splitlines()[1:] == [
        "from torchacc.runtime.nn.dcn_v2 import DCN, DCNv2",
        "from dcn_v2 import dcn_v2_conv, DCNv2Pooling",
    ]
    assert [d.message for d in torchacc.diagnostics] == [
        "dcn_v2_conv from dcn_v2 kept: target 'torchacc' has no counterpart",
        "DCNv2Pooling from dcn_v2 kept: no target has it",
    ]

    torch_xla = migrate(source, "torch_xla")
    assert not torch_xla.changed
    first = torch_xla.diagnostics[0]
    assert first.message == "DCN, DCNv2, dcn_v2_conv from dcn_v2 kept: target 'torch_xla' has no counterpart"
    assert "accrewrite.runtime.nn's DCN, DCNv2" in first.help and "XLA compiles" in first.help


def test_whole_module_imports_and_mmcv_are_reported_not_rewritten():
    source = """
    import torch
    import dcn_v2
    from mmcv.ops import ModulatedDeformConv2dPack, DeformConv2dPack, nms
    from mmcv.ops.modulated_deform_conv import ModulatedDeformConv2d
    from mmdet.ops import DeformConvPack
    from mmcv.ops import RoIAlign
    """
    for target in ("runtime", "torchacc", "torch_xla"):
        result = migrate(source, target)
        assert not result.changed
        assert [(d.line, d.message) for d in result.diagnostics] == [
            (2, "`import dcn_v2` uses dcn_v2's compiled CUDA extension"),
            (3, "ModulatedDeformConv2dPack, DeformConv2dPack from mmcv.ops: a compiled op, left as it is"),
            (4, "ModulatedDeformConv2d from mmcv.ops.modulated_deform_conv: a compiled op, left as it is"),
            (5, "DeformConvPack from mmdet.ops: a compiled op, left as it is"),
        ], target
    assert "from torchacc.runtime.nn.dcn_v2 import DCN" in migrate(source, "torchacc").diagnostics[1].help


def test_comments_in_a_parenthesised_import_stay_with_their_names():
    result = migrate("""
    import torch
    from lib.DCNv2.dcn_v2 import (  # the compiled package
        DCN,  # learned offsets
        DCNPooling,
        DCNv2,  # offsets given
    )
    """)
    assert result.output.decode() == textwrap.dedent("""\
    import torch
    from accrewrite.runtime.nn import (  # the compiled package
        DCN,  # learned offsets
        DCNv2,  # offsets given
    )
    from lib.DCNv2.dcn_v2 import (  # the compiled package
        DCNPooling,
        )
    """)
    assert migrate_source(result.output, "model.py", Options(select=("ACC026",))).output == result.output


def test_guarded_form_keeps_the_original_import_for_runs_without_the_target():
    result = migrate("import torch\nfrom dcn_v2 import DCN\n", "torchacc", guard="USE_TORCHACC")
    text = result.output.decode()
    assert text.endswith(
        "if enable_torchacc_compiler():\n"
        "    from torchacc.runtime.nn.dcn_v2 import DCN\n"
        "else:\n"
        "    from dcn_v2 import DCN\n"
    ), text
    compile(text, "model.py", "exec")


# dcn_v2's classes as the package defines them (constructors, parameters drawn in the same order,
# the offsets and sigmoid mask of DCN), computed by the per-tap loop in place of its CUDA kernel.
FAKE_DCN_V2 = '''
import math
import torch
from _deform_loop import deform_conv_loop


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


class DCNv2(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation=1, deformable_groups=1):
        super().__init__()
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        self.bias = torch.nn.Parameter(torch.empty(out_channels))
        bound = 1.0 / math.sqrt(in_channels * self.kernel_size[0] * self.kernel_size[1])
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.zero_()

    def forward(self, input, offset, mask):
        return deform_conv_loop(input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)


class DCN(DCNv2):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation=1, deformable_groups=1):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, deformable_groups)
        channels = 3 * deformable_groups * self.kernel_size[0] * self.kernel_size[1]
        self.conv_offset_mask = torch.nn.Conv2d(in_channels, channels, self.kernel_size, self.stride, self.padding)
        with torch.no_grad():
            self.conv_offset_mask.weight.zero_()
            self.conv_offset_mask.bias.zero_()

    def forward(self, input):
        first, second, mask = torch.chunk(self.conv_offset_mask(input), 3, dim=1)
        offset = torch.cat((first, second), dim=1)
        return deform_conv_loop(input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                torch.sigmoid(mask))
'''


def _losses(command, cwd, pythonpath=""):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=pythonpath)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = [float(v) for v in re.findall(r"^loss (\S+)$", done.stdout, re.MULTILINE)]
    assert len(found) == 3, done.stdout
    return found


@pytest.mark.slow
def test_migrated_fixture_trains_as_the_original(tmp_path):
    package = tmp_path / "original"
    package.mkdir()
    (package / "dcn_v2.py").write_text(FAKE_DCN_V2)
    original = _losses([sys.executable, str(FIXTURE)], tmp_path, f"{package}{os.pathsep}{LOOP_ORACLE}")
    for target, launcher in (("runtime", []), ("torchacc", ["-m", "accrewrite.runtime.torchacc_names"])):
        result = migrate_source(FIXTURE.read_bytes(), "train.py", Options(target=target))
        script = tmp_path / f"train_{target}.py"
        script.write_bytes(result.output)
        migrated = _losses([sys.executable, *launcher, str(script)], tmp_path)  # no dcn_v2 on the path
        assert migrated == pytest.approx(original, rel=1e-5), target
    assert original[-1] < original[0]
