"""A file written for one target (migrated to it, plainly or guarded, or written for it by hand)
is refused by a migration to another: never a file half in one target and half in the other.
The same target again changes nothing."""

import itertools

import pytest

from accrewrite import targets
from accrewrite.engine import Options, migrate_source
from accrewrite.targets import all_targets

TARGETS = list(all_targets())
SCRIPT = b'''import torch

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.AdamW(model.parameters(), fused=True)
scaler = torch.cuda.amp.GradScaler()
loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
for x in loader:
    with torch.cuda.amp.autocast():
        loss = model(x.cuda()).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
torch.cuda.synchronize()
'''
GUARDS = [None, "ACCEL_ON"]


def migrated(target: str, guard: str | None) -> bytes:
    result = migrate_source(SCRIPT, "train.py", Options(target=target, guard=guard))
    assert result.error is None and result.changed
    return result.output


@pytest.mark.parametrize("guard", GUARDS, ids=["plain", "guarded"])
@pytest.mark.parametrize("first, second", list(itertools.permutations(TARGETS, 2)))
def test_a_file_migrated_to_one_target_is_refused_by_another(first, second, guard):
    source = migrated(first, guard)
    result = migrate_source(source, "train.py", Options(target=second, guard=guard))
    assert result.error is not None and not result.changed and result.output == source
    reason = result.error.reason
    assert reason.startswith(f"the file is written for target {first!r}, not {second!r} (line {result.error.line}: `")
    assert f"migrate the original script with --target {second}, or keep --target {first}" in reason
    # The line named is an import of the first target's package.
    shown = source.decode().splitlines()[result.error.line - 1]
    assert all_targets()[first].package in shown and "import" in shown


@pytest.mark.parametrize("guard", GUARDS, ids=["plain", "guarded"])
@pytest.mark.parametrize("target", TARGETS)
def test_the_same_target_again_changes_nothing(target, guard):
    source = migrated(target, guard)
    again = migrate_source(source, "train.py", Options(target=target, guard=guard))
    assert again.error is None and again.output == source and again.fixes == []


TORCH_XLA_BY_HAND = b'''import torch

try:
    import torch_xla.core.xla_model as xm
    has_xla = True
except ImportError:
    has_xla = False

device = xm.xla_device() if has_xla else torch.device("cuda")
model = torch.nn.Linear(4, 2).to(device)
'''


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "torch_xla"])
def test_a_script_written_for_torch_xla_by_hand_is_refused_by_the_other_targets(target):
    result = migrate_source(TORCH_XLA_BY_HAND, "xla.py", Options(target=target))
    assert result.error is not None and result.error.line == 4 and result.output == TORCH_XLA_BY_HAND
    assert result.error.reason.startswith(
        f"the file is written for target 'torch_xla', not {target!r} (line 4: `import torch_xla.core.xla_model as xm`)")


def test_a_module_of_the_files_own_called_xm_is_no_target():
    source = b"import torch\nfrom lab import xm\nmodel = torch.nn.Linear(4, 2).cuda()\nxm.log(model)\n"
    for target in TARGETS:
        result = migrate_source(source, "own.py", Options(target=target))
        assert result.error is None and result.changed
        assert b"from lab import xm\n" in result.output and b"xm.log(model)" in result.output


def test_the_cli_exits_2_and_migrates_the_other_files(tmp_path, cli):
    retargeted, plain = tmp_path / "runtime_train.py", tmp_path / "train.py"
    retargeted.write_bytes(migrated("runtime", None))
    plain.write_bytes(SCRIPT)
    code, out, _ = cli("migrate", retargeted, plain, "--in-place", "--target", "torch_xla")
    assert code == 2
    assert f"{retargeted}:2:1: error: the file is written for target 'runtime', not 'torch_xla'" in " ".join(out.split())
    assert retargeted.read_bytes() == migrated("runtime", None)
    assert plain.read_bytes() == migrated("torch_xla", None)


def test_a_targets_package_comes_from_its_profiles_imports():
    """What the imports share beyond the standard library and torch, which a plain script imports
    already; a profile whose own imports share nothing says so, and one spelled with torch alone
    has no package."""
    assert {name: target.package for name, target in all_targets().items()} == {
        "runtime": "accrewrite.runtime", "torch_xla": "torch_xla", "torchacc": "torchacc"}
    profile = {"name": "split", "imports": {"a": "import os", "b": "import torch", "c": "import vendor_a.xm",
                                            "d": "from vendor_b import pl"},
               "concepts": {"device": {"expr": "torch.device('xpu')", "imports": ["b"]}}}
    with pytest.raises(ValueError, match="split.toml: the target's own imports have no package in common"):
        targets._parse(profile, "split.toml")
    profile["imports"]["d"] = "from vendor_a.amp import autocast"
    assert targets._parse(profile, "split.toml").package == "vendor_a"
    profile["imports"] = {"b": "import torch"}
    assert targets._parse(profile, "split.toml").package == ""
