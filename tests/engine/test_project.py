"""A project is one decision (``accrewrite.project``): a module that a script left as it is
imports and drives is left as it is too, and so is a script that imports and drives a module left
as it is, whichever way the run is asked for (a folder, one file alone; --diff, --check,
--in-place, --output-dir; every output format; verify's workspace), and nothing is written before
the decision. Where no file is refused or drops DDP on its own, none is made."""

import filecmp
import json
import shutil
from pathlib import Path

import pytest

from accrewrite import project
from accrewrite.engine import Options, migrate_source
from accrewrite.verify.workspace import _migrated

FIXTURES = Path(__file__).resolve().parents[1] / "rules" / "fixtures"
# pytorch/examples' mnist_hogwild in small: main.py trains in shared memory (ACC108 leaves it as
# it is on torch_xla), train.py holds the loop its processes run.
HOGWILD = FIXTURES / "hogwild_project"
LEFT = "ACC108 left as it is: main.py, which imports it, is left as it is (ACC108)"
# PyTorch-YOLOv3's shape: train.py hands its model to evaluate.py, which casts each batch to a
# legacy CUDA tensor type (ACC002 leaves it as it is on torch_xla and torchacc).
EVALUATOR = FIXTURES / "evaluator_project"
LEFT_IMPORTER = "ACC027 left as it is: it imports evaluate.py, which is left as it is (ACC027)"
# Each project: its folder, and the diagnostic of train.py, which the decision leaves as it is.
PROJECTS = {"hogwild": (HOGWILD, LEFT), "evaluator": (EVALUATOR, LEFT_IMPORTER)}


@pytest.fixture
def hogwild(tmp_path):
    folder = tmp_path / "hogwild"
    shutil.copytree(HOGWILD, folder)
    return folder


@pytest.fixture(params=sorted(PROJECTS))
def decided(request, tmp_path):
    """A project copied, with the diagnostic of its train.py, left as it is on torch_xla."""
    source, left = PROJECTS[request.param]
    folder = tmp_path / request.param
    shutil.copytree(source, folder)
    return folder, left


def test_train_py_alone_would_migrate_so_leaving_it_is_the_projects_doing(hogwild):
    result = migrate_source((hogwild / "train.py").read_bytes(), "train.py", Options(target="torch_xla"))
    assert result.changed and b"xla" in result.output
    assert migrate_source((hogwild / "main.py").read_bytes(), "main.py", Options(target="torch_xla")).refused


def test_the_module_a_refused_script_imports_is_left_with_a_diagnostic(hogwild, cli):
    code, out, _ = cli("migrate", hogwild, "--target", "torch_xla")
    text = " ".join(out.split())
    assert code == 0 and "+++" not in out
    assert f"{hogwild / 'train.py'}:1:1: {LEFT}" in text
    assert f"{hogwild / 'main.py'}:37:5: ACC108 `model` is trained in shared memory" in text


@pytest.mark.parametrize("target", ["torch_xla", "torchacc"])
def test_the_script_that_imports_a_refused_module_is_left_with_a_diagnostic(tmp_path, cli, target):
    folder = tmp_path / "evaluator"
    shutil.copytree(EVALUATOR, folder)
    assert migrate_source((folder / "train.py").read_bytes(), "train.py", Options(target=target)).changed
    code, out, _ = cli("migrate", folder, "--target", target)
    text = " ".join(out.split())
    assert code == 0 and "+++" not in out
    assert f"{folder / 'train.py'}:1:1: {LEFT_IMPORTER}" in text
    assert f"{folder / 'evaluate.py'}:12:5: ACC027 `Tensor` stays a legacy type" in text


def test_given_alone_train_py_is_left_for_the_file_beside_it_left_as_it_is(decided, cli):
    folder, left = decided
    code, out, _ = cli("migrate", folder / "train.py", "--target", "torch_xla")
    assert code == 0 and "+++" not in out and left in " ".join(out.split())


@pytest.mark.parametrize("mode", ["--diff", "--check", "--in-place", "--output-dir"])
def test_every_mode_agrees_and_nothing_is_written(decided, tmp_path, cli, mode):
    folder, left = decided
    before = {path.name: path.read_bytes() for path in folder.glob("*.py")}
    out_dir = tmp_path / "out"
    written = [out_dir] if mode == "--output-dir" else []
    code, out, _ = cli("migrate", folder, "--target", "torch_xla", mode, *written)
    assert code == 0 and "Would migrate" not in out and "+++" not in out and left in " ".join(out.split())
    assert {path.name: path.read_bytes() for path in folder.glob("*.py")} == before
    if mode == "--output-dir":  # the copies are the files as they are
        assert filecmp.cmpfiles(folder, out_dir, list(before), shallow=False)[0] == sorted(before)


@pytest.mark.parametrize("output_format", ["json", "github", "gitlab", "sarif", "full"])
def test_every_output_format_carries_the_diagnostic(decided, cli, output_format):
    folder, left = decided
    code, out, _ = cli("migrate", folder, "--target", "torch_xla", "--output-format", output_format)
    assert code == 0
    assert left.split(" ", 1)[1] in " ".join(out.split())
    if output_format == "json":
        [train] = [f for f in json.loads(out)["files"] if f["path"].endswith("train.py")]
        assert not train["changed"] and train["diff"] == "" and train["fixes"] == []
        assert [(d["code"], d["line"]) for d in train["diagnostics"]] == [(left.split()[0], 1)]


def test_verify_runs_the_project_as_migrate_decides_it(decided):
    folder, _ = decided
    paths = sorted(folder.glob("*.py"))
    errors = []
    outputs = _migrated(paths, Options(target="torch_xla"), folder, errors)
    assert errors == [] and outputs == {path: path.read_bytes() for path in paths}


def test_where_the_script_migrates_so_does_the_module(hogwild, cli):
    code, out, _ = cli("migrate", hogwild, "--target", "runtime")
    assert code == 0 and f"+++ b/{hogwild / 'train.py'}" in out and "left as it is" not in out


def test_what_a_refused_script_drives_further_down_is_left_too_naming_its_importer(hogwild, cli):
    (hogwild / "helpers").mkdir()
    (hogwild / "helpers" / "__init__.py").write_text("")
    (hogwild / "helpers" / "data.py").write_text(
        "import torch\n\n\ndef on_device(x, device):\n    return x.cuda() if device.type == 'cuda' else x\n")
    train = (hogwild / "train.py").read_text()
    imported = train.replace("import torch\n", "import torch\nfrom helpers.data import on_device\n", 1)
    (hogwild / "train.py").write_text(imported)
    code, out, _ = cli("migrate", hogwild, "--target", "torch_xla")
    text = " ".join(out.split())
    assert f"{hogwild / 'helpers' / 'data.py'}:1:1: ACC108 left as it is: ../train.py, which imports it" in text
    assert "+++" not in out


def test_a_module_left_for_its_sync_batch_norm_holds_no_neighbour(tmp_path, cli):
    """timm's shape: a layer library builds a SyncBatchNorm in its conversion (which fails on XLA
    where it is built, migrated neighbours or not) and the training script imports it: the
    script migrates."""
    (tmp_path / "norms.py").write_text(
        "import torch\n\n\ndef convert_sync_batchnorm(module):\n"
        "    if isinstance(module, torch.nn.BatchNorm2d):\n"
        "        return torch.nn.SyncBatchNorm(module.num_features)\n    return module\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom norms import convert_sync_batchnorm\n\n"
        "model = torch.nn.Linear(4, 2).cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4):\n"
        "    x = x.cuda()\n    optimizer.zero_grad()\n    model(x).sum().backward()\n    optimizer.step()\n")
    code, out, _ = cli("migrate", tmp_path, "--target", "torch_xla")
    text = " ".join(out.split())
    assert code == 0 and f"+++ b/{tmp_path / 'train.py'}" in out and "left as it is: it imports" not in text
    assert f"{tmp_path / 'norms.py'}:" in text and "builds a SyncBatchNorm" in text


def test_imports_resolve_as_python_would_from_the_importer(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "pkg/near.py", "pkg/far.py",
                 "top.py", "main.py", "pkg/entry.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "main.py").write_text("import top\nfrom pkg.sub import leaf\nimport pkg.far as far\nimport os, torch\n")
    (tmp_path / "pkg" / "entry.py").write_text("from . import near\nfrom .sub.leaf import thing\nimport top\n")
    graph = project._Graph([tmp_path])

    def imported(name):
        return {path.relative_to(tmp_path.resolve()).as_posix() for path in graph.imports(tmp_path / name)}

    assert imported("main.py") == {"top.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "pkg/far.py"}
    assert imported("pkg/entry.py") == {"pkg/near.py", "pkg/sub/leaf.py", "top.py"}


def test_no_decision_is_made_where_no_file_is_refused_or_drops_ddp_alone(tmp_path, cli, monkeypatch):
    def no_decision(*args, **kwargs):
        raise AssertionError("the project's decision ran")

    monkeypatch.setattr(project, "decide", no_decision)
    monkeypatch.setattr(project, "related", no_decision)
    (tmp_path / "train.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    (tmp_path / "utils.py").write_text("import torch\nimport train\n")
    assert cli("migrate", tmp_path, "--target", "torch_xla")[0] == 0
