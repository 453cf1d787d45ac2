"""Jupyter notebooks: migrated as one script across their code cells, written back cell by cell
with the rest of the file as it was, positions given as cell and line."""

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from accrewrite.cli import main
from accrewrite.engine import Options
from accrewrite.notebook import Notebook
from accrewrite.runner import migrate_text

SETUP = "!pip install -q torchvision\n%matplotlib inline\nimport torch\nimport torch.nn as nn\ntorch.manual_seed(0)"
DEVICE = "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\nprint(device)"
DATA = (
    "model = nn.Linear(4, 2).to(device)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "X, y = torch.randn(64, 4), torch.randn(64, 2)\n"
    "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=8)"
)
TRAIN = (
    "%%time\n"
    "for epoch in range(2):\n"
    "    for xb, yb in loader:\n"
    "        xb, yb = xb.to(device), yb.to(device)\n"
    "        loss = ((model(xb) - yb) ** 2).mean()\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        !echo step\n"
    "    print(epoch, loss.item())"
)
BASH = "%%bash\nnvidia-smi\npython -c 'import torch; torch.zeros(1).cuda()'"


def lesson() -> nbformat.NotebookNode:
    """A course notebook: the device in cell 3, the model in cell 5, the loop in cell 6."""
    book = nbformat.v4.new_notebook(metadata={"accelerator": "GPU", "kernelspec": {"name": "python3", "display_name": "Python 3"}})
    book.cells = [
        nbformat.v4.new_markdown_cell("# Training on a GPU\n\nRun `model.cuda()` first."),
        nbformat.v4.new_code_cell(SETUP, execution_count=1,
                                  outputs=[nbformat.v4.new_output("stream", text="installed\n")]),
        nbformat.v4.new_code_cell(DEVICE, execution_count=2,
                                  outputs=[nbformat.v4.new_output("stream", text="cuda\n")]),
        nbformat.v4.new_code_cell(BASH),
        nbformat.v4.new_code_cell(DATA, metadata={"tags": ["setup"]}),
        nbformat.v4.new_code_cell(TRAIN, outputs=[nbformat.v4.new_output("stream", text="0 0.5\n1 0.4\n")]),
    ]
    return book


def migrated(data: bytes, target="torch_xla", mode="diff", name="lesson.ipynb"):
    return migrate_text(name, data, Options(target=target), mode)


def cells_of(data: bytes) -> list[str]:
    return [cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for cell in json.loads(data)["cells"]]


def test_the_notebook_is_one_script_and_each_cell_keeps_its_own_code():
    data = nbformat.writes(lesson()).encode()
    outcome, output = migrated(data)
    assert outcome.error is None and outcome.changed
    cells = cells_of(output)
    setup, device, bash, model, train = cells[1:]
    # Imports join the cell that imports, after the lines that install and configure.
    assert setup.startswith("!pip install -q torchvision\n%matplotlib inline\nimport torch_xla.core.xla_model as xm\n")
    assert "import torch_xla.distributed.parallel_loader as pl" in setup
    # The device chosen in cell 3 is known where cells 5 and 6 use it.
    assert "device = torch_xla.device()\nprint(device)" in device
    assert "syncfree.SGD(model.parameters(), lr=0.1)" in model
    assert train.startswith("%%time\n")  # a cell magic stays the cell's first line
    assert "for xb, yb in pl.MpDeviceLoader(loader, device):" in train
    assert "xb.to(device)" not in train
    assert "        xm.optimizer_step(opt)\n        !echo step\n" in train
    assert bash == BASH  # not Python: left as it is
    assert cells[0] == lesson().cells[0].source


def test_only_the_changed_sources_are_written_and_the_json_keeps_its_layout():
    expected = lesson()
    data = nbformat.writes(expected).encode()
    _, output = migrated(data)
    before, after = json.loads(data), json.loads(output)
    for old, new in zip(before["cells"], after["cells"]):
        assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
    assert before["metadata"] == after["metadata"]
    for cell, source in zip(expected.cells, cells_of(output)):
        cell.source = source
    assert output.decode() == nbformat.writes(expected)  # nbformat's own layout, byte for byte


@pytest.mark.parametrize("indent, ascii_only, newline, lines", [
    (2, False, "\n", True),  # Colab's layout
    (1, True, "\n", False),  # sources as one string, non-ASCII escaped
    (1, False, "\r\n", True),  # written on Windows
])
def test_other_layouts_are_kept_byte_for_byte(indent, ascii_only, newline, lines):
    raw = json.loads(nbformat.writes(lesson()))
    raw["cells"][0]["source"] = "# Entraînement sur un GPU ✓"
    for cell in raw["cells"]:
        text = "".join(cell["source"])
        cell["source"] = text.splitlines(keepends=True) if lines else text

    def written(document) -> bytes:
        return (json.dumps(document, indent=indent, ensure_ascii=ascii_only) + "\n").replace("\n", newline).encode()

    _, output = migrated(written(raw))
    sources = cells_of(output)
    assert "device = torch_xla.device()" in sources[2]
    for cell, source in zip(raw["cells"], sources):
        cell["source"] = source.splitlines(keepends=True) if lines else source
    assert output == written(raw)


def test_an_empty_cell_that_gains_code_is_laid_out_as_its_neighbours():
    book = lesson()
    book.cells.insert(1, nbformat.v4.new_code_cell(""))
    notebook = Notebook.read(nbformat.writes(book).encode())
    text = notebook.with_sources({2: "import torch_xla\nprint(1)"}).decode()
    assert '"source": [\n    "import torch_xla\\n",\n    "print(1)"\n   ]' in text
    assert json.loads(text)["cells"][1]["source"] == ["import torch_xla\n", "print(1)"]


def test_ipython_lines_are_kept_and_never_break_the_analysis():
    source = (
        "files = !ls\n"
        "model?\n"
        "??torch.nn\n"
        "!pip install a \\\n"
        "    b\n"
        "text = '''\n"
        "%d items\n"
        "'''\n"
        "total = (3\n"
        "    % 2)\n"
        "model = Net().cuda()\n"
        "for x in loader:\n"
        "    %time out = model(x.cuda())\n"
    )
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell("import torch\nfrom torch import nn\nclass Net(nn.Linear):\n"
                                            "    def __init__(self):\n        super().__init__(2, 2)"),
                  nbformat.v4.new_code_cell(source)]
    outcome, output = migrated(nbformat.writes(book).encode(), target="runtime")
    assert outcome.error is None
    new = cells_of(output)[1]
    for kept in ("files = !ls\n", "model?\n", "??torch.nn\n", "!pip install a \\\n    b\n", "'''\n%d items\n'''",
                 "total = (3\n    % 2)", "    %time out = model(x.cuda())"):
        assert kept in new
    assert "model = Net().to(xm.xla_device())" in new or "xm.xla_device()" in new


def test_findings_point_at_the_cell_and_the_line_in_it(cli, tmp_path):
    book = lesson()
    book.cells[5].source += "\n    if loss.item() > 10:\n        break"
    path = tmp_path / "lesson.ipynb"
    path.write_text(nbformat.writes(book))
    code, out, _ = cli("migrate", path, "--target", "torch_xla", "--format", "json")
    document = json.loads(out)["files"][0]
    sync = next(d for d in document["diagnostics"] if d["code"] == "ACC101")
    assert (sync["cell"], sync["line"]) == (6, 11)
    assert "loss.item()" in book.cells[5].source.splitlines()[sync["line"] - 1]
    assert {f["cell"] for f in document["fixes"]} >= {3, 5, 6}

    code, out, _ = cli("migrate", path, "--target", "torch_xla")
    assert f"{path}:cell 6:11:" in out
    assert f"--- a/{path}:cell 3\n+++ b/{path}:cell 3\n" in out

    code, out, _ = cli("migrate", path, "--target", "torch_xla", "--format", "github")
    annotation = next(line for line in out.splitlines() if "title=ACC101" in line)
    file_line = int(annotation.split("line=")[1].split(",")[0])
    assert "loss.item() > 10" in path.read_text().splitlines()[file_line - 1]
    assert "::cell 6, line 11: " in annotation

    code, out, _ = cli("migrate", path, "--target", "torch_xla", "--format", "sarif")
    result = next(r for r in json.loads(out)["runs"][0]["results"] if r["ruleId"] == "ACC101")
    assert result["properties"]["cell"] == 6 and result["properties"]["line"] == 11
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == file_line

    code, out, _ = cli("migrate", path, "--target", "torch_xla", "--format", "gitlab")
    issue = next(i for i in json.loads(out) if i["check_name"] == "ACC101")
    assert issue["location"]["lines"]["begin"] == file_line and "cell 6, line 11" in issue["description"]


def test_check_in_place_and_again(cli, tmp_path):
    path = tmp_path / "lesson.ipynb"
    path.write_text(nbformat.writes(lesson()))
    os.chmod(path, 0o640)
    original = path.read_bytes()
    code, out, _ = cli("migrate", path, "--check")
    assert code == 1 and path.read_bytes() == original and "Would migrate" in out
    code, _, _ = cli("migrate", path, "--in-place")
    assert code == 0 and path.read_bytes() != original
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["lesson.ipynb"]  # no temporary left
    nbformat.validate(nbformat.read(path, as_version=4))
    migrated_once = path.read_bytes()
    code, _, _ = cli("migrate", path, "--in-place")
    assert code == 0 and path.read_bytes() == migrated_once
    assert cli("migrate", path, "--check")[0] == 0


def test_folders_take_notebooks_unless_excluded(cli, tmp_path):
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "lesson.ipynb").write_text(nbformat.writes(lesson()))
    (tmp_path / "course" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "course" / ".ipynb_checkpoints" / "lesson-checkpoint.ipynb").write_text(nbformat.writes(lesson()))
    code, out, _ = cli("migrate", tmp_path, "--format", "json")
    assert [f["path"] for f in json.loads(out)["files"]] == [str(tmp_path / "course" / "lesson.ipynb")]
    code, out, _ = cli("migrate", tmp_path, "--format", "json", "--exclude", "*.ipynb")
    assert json.loads(out)["files"] == []
    (tmp_path / "pyproject.toml").write_text('[tool.accrewrite]\nexclude = ["course/*.ipynb"]\n')
    code, out, _ = cli("migrate", tmp_path, "--format", "json")
    assert json.loads(out)["files"] == []


@pytest.mark.parametrize("text, said", [
    ('{"cells": [', "its JSON is invalid at line 1, column 12"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "metadata": {}}]}',
     "cell 1 has no source text"),
    ('{"nbformat": 4, "nbformat_minor": 5, "cells": []}', "not a notebook nbformat can read (The notebook is invalid"),
])
def test_a_broken_notebook_is_an_error_and_the_other_files_still_run(cli, tmp_path, text, said):
    (tmp_path / "broken.ipynb").write_text(text)
    (tmp_path / "lesson.ipynb").write_text(nbformat.writes(lesson()))
    code, out, _ = cli("migrate", tmp_path, "--in-place", "--format", "json")
    files = {os.path.basename(f["path"]): f for f in json.loads(out)["files"]}
    assert code == 2 and said in files["broken.ipynb"]["error"]["message"]
    assert files["lesson.ipynb"]["written"]
    assert (tmp_path / "broken.ipynb").read_text() == text


def test_a_cell_that_does_not_parse_is_named_with_its_line(tmp_path):
    book = lesson()
    book.cells[4].source = "model = nn.Linear(4, 2).to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1"
    outcome, output = migrated(nbformat.writes(book).encode())
    assert outcome.error is not None and outcome.error.cell == 5 and outcome.error.line == 2
    assert output == nbformat.writes(book).encode()


def test_nbformat_is_imported_only_when_a_notebook_is_given(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    probe = ("import sys\nfrom accrewrite.cli import main\nmain(['migrate', sys.argv[1]])\n"
             "print('nbformat' in sys.modules, file=sys.stderr)")
    found = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "train.py")], capture_output=True, text=True)
    assert found.stderr.strip().splitlines()[-1] == "False", found.stderr


def test_the_runnable_script_skips_ipython_lines_and_says_so():
    code, skipped = Notebook.read(nbformat.writes(lesson()).encode()).runnable()
    assert skipped == ["!pip install -q torchvision", "%matplotlib inline", "%%time", "!echo step"]
    compile(code, "lesson.ipynb.py", "exec")
    assert b"nvidia-smi" not in code  # a %%bash cell is not Python
    assert b"        pass  # IPython, not run: !echo step\n" in code


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course folder holding the notebook, verify's workspace beside it."""
    (tmp_path / "course").mkdir()
    (tmp_path / "temp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "temp"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.chdir(tmp_path / "course")
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "course" / "lesson.ipynb").write_text(nbformat.writes(lesson()))
    return tmp_path / "course"


@pytest.mark.slow
def test_verify_runs_the_notebook_cells_in_order_and_says_what_it_skipped(course, capsys):
    written = (course / "lesson.ipynb").read_text()
    code = main(["verify", "lesson.ipynb", "--steps", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "4 IPython lines not run: `!pip install -q torchvision`, `%matplotlib inline`, `%%time`" in captured.err
    assert "match: 4 steps within their tolerances" in captured.out
    assert (course / "lesson.ipynb").read_text() == written


@pytest.mark.slow
@pytest.mark.xla
def test_verify_runs_the_notebook_migrated_to_torch_xla_on_the_device(course, capsys, xla_python, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    code = main(["verify", "lesson.ipynb", "--target", "torch_xla", "--python", f"torch_xla={xla_python}"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    executions = int(re.search(r"torch_xla: (\d+) graph executions on the xla device", captured.out).group(1))
    assert executions > 0
    assert "match: 16 steps within their tolerances" in captured.out


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_the_bundled_notebook_migrates_on_every_target_and_again_changes_nothing(target):
    path = Path(__file__).resolve().parents[2] / "examples" / "notebook" / "lesson.ipynb"
    outcome, output = migrated(path.read_bytes(), target=target, name=str(path))
    assert outcome.error is None and outcome.changed
    assert "MpDeviceLoader(train_loader, device)" in output.decode()
    again, _ = migrated(output, target=target, name=str(path))
    assert again.error is None and not again.changed


def test_a_writefile_cell_is_the_module_it_writes_migrated_on_its_own():
    book = lesson()
    module = ("%%writefile train.py\nimport torch\nmodel = torch.nn.Linear(2, 2).cuda()\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n"
              "    loss = model(torch.randn(4, 2).cuda()).sum()\n    loss.backward()\n    opt.step()\n"
              "    if loss.item() > 10:\n        break")
    book.cells += [nbformat.v4.new_code_cell(module), nbformat.v4.new_code_cell("!python train.py"),
                   nbformat.v4.new_code_cell("%%writefile -a train.py\nmodel.cuda()")]
    outcome, output = migrated(nbformat.writes(book).encode(), target="runtime")
    written = cells_of(output)[6]
    assert written.startswith("%%writefile train.py\nimport torch\nimport accrewrite.runtime.xla_model as xm\n")
    assert ".cuda()" not in written and "model = torch.nn.Linear(2, 2).to(xm.xla_device())" in written
    assert cells_of(output)[7:] == ["!python train.py", "%%writefile -a train.py\nmodel.cuda()"]
    sync = next(d for d in outcome.diagnostics if d.code == "ACC101")
    assert (sync.cell, sync.line) == (7, 9) and outcome.lines[(7, 9)] == "    if loss.item() > 10:"
    book.cells[6].source = module + "\n    if loss.item( > 1:"  # the module does not parse: nothing is written
    outcome, output = migrated(nbformat.writes(book).encode(), target="runtime")
    assert (outcome.error.cell, outcome.error.line) == (7, 11) and not outcome.changed


def test_a_line_a_message_names_is_a_line_of_a_cell():
    _, runtime = migrated(nbformat.writes(lesson()).encode(), target="runtime")
    outcome, _ = migrated(runtime, target="torch_xla")
    assert (outcome.error.cell, outcome.error.line) == (2, 3)
    assert "written for target 'runtime', not 'torch_xla' (cell 2, line 3: `import accrewrite" in outcome.error.reason


def test_a_byte_order_mark_is_kept():
    data = nbformat.writes(lesson()).encode()
    _, plain = migrated(data)
    _, marked = migrated(b"\xef\xbb\xbf" + data)
    assert marked == b"\xef\xbb\xbf" + plain
