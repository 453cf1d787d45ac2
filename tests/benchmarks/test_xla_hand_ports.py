"""benchmarks/xla_hand_ports.py: a step's counts are the differences of the metrics read after
consecutive optimizer steps, the warm-up left out; a notebook loses the cells that need Colab; a
hand port whose text moved is refused rather than measured unedited; a folder's file that does
not parse stops only its own migration; and, with torch_xla, a CUDA
script migrated and run for its steps, its host read counted in each."""

import argparse
import json
import textwrap

import pytest
from benchmark_module import load

hp = load("xla_hand_ports")


def _mark(executions, compilations, transfers, time, compile_s=0.0):
    return {"executions": executions, "compilations": compilations, "compile_s": compile_s,
            "transfers": transfers, "time": time}


def test_a_step_is_what_runs_between_two_optimizer_steps_and_the_warm_up_is_left_out():
    marks = [_mark(0, 0, 0, 0.0), _mark(3, 2, 1, 5.0, 4.0), _mark(5, 3, 1, 8.0, 6.5),
             _mark(6, 3, 1, 8.5, 6.5), _mark(8, 4, 2, 9.5, 7.0)]
    profile = hp.Profile(marks)
    assert [s["executions"] for s in profile.steps()] == [3, 2, 1, 2]
    assert profile.summary() == {"warm-up compile s": 6.5, "graphs/step": "1-2", "compilations after warm-up": 1,
                                 "host transfers/step": "0-1", "s/step": 0.75}


def test_a_failed_run_is_its_reason():
    assert hp.Profile(error="made fewer than --steps + 1 optimizer steps").summary() == {
        "error": "made fewer than --steps + 1 optimizer steps"}
    assert hp.row("GAN", "hand port", hp.Profile(error="a | b")).startswith("| GAN | hand port | a / b |")


def test_a_notebook_keeps_its_code_cells_but_those_that_need_colab(tmp_path):
    cells = [{"cell_type": "code", "source": ["import os\n", "assert os.environ['COLAB_TPU_ADDR']"]},
             {"cell_type": "code", "source": ["!pip install torch_xla\n", "import torch\n", "%matplotlib inline"]},
             {"cell_type": "markdown", "source": ["# Training"]},
             {"cell_type": "code", "source": ["from google.colab.patches import cv2_imshow"]},
             {"cell_type": "code", "source": ["x = torch.ones(2)"]}]
    notebook = tmp_path / "gan.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    assert hp.notebook_script(notebook).read_text() == "import torch\nx = torch.ones(2)\n"


def test_a_hand_port_whose_text_moved_is_refused(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("FLAGS['batch_size'] = 128\n")
    hp.edit(script, (("FLAGS['batch_size'] = 128", "FLAGS['batch_size'] = 16"),))
    assert script.read_text() == "FLAGS['batch_size'] = 16\n"
    with pytest.raises(LookupError, match="the hand port changed"):
        hp.edit(script, (("FLAGS['num_cores'] = 8", "FLAGS['num_cores'] = 1"),))


def test_a_file_beside_the_script_that_does_not_parse_stops_only_its_own_migration(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    (tmp_path / "other.py").write_text("import torch\n  x = 1\n")
    hp.migrate(tmp_path, script)
    assert "torch_xla" in script.read_text()
    script.write_text("import torch\ndef f(:\n")
    with pytest.raises(RuntimeError, match="exit 2"):
        hp.migrate(tmp_path, script)


CUDA_SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(80, 8), torch.randint(0, 2, (80,)))
    loader = DataLoader(data, batch_size=8)
    model = torch.nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(loss.item())
""")


@pytest.mark.xla
def test_a_migrated_script_runs_its_steps_on_torch_xla_and_its_host_read_counts(tmp_path, xla_python):
    script = tmp_path / "examples" / "tiny" / "main.py"
    script.parent.mkdir(parents=True)
    script.write_text(CUDA_SCRIPT)
    side = hp.Side("examples", "tiny/main.py", migrate=True)
    args = argparse.Namespace(xla_python=xla_python, steps=4, timeout=300)
    profile = hp.run(side, {"examples": tmp_path / "examples"}, args)
    summary = profile.summary()
    assert "error" not in summary, summary
    assert len(profile.steps()) == 4
    assert summary["compilations after warm-up"] == 0
    assert int(summary["graphs/step"]) >= 1  # the same count in every step after warm-up
    assert summary["host transfers/step"] == "1"  # print(loss.item())
