"""ACC032 beyond its examples: which traces move to a host copy of the model, and which are
reported and left as they are because the copy would not trace what the original does."""

import textwrap

import pytest

from accrewrite.engine import Options, migrate_source

HEADER = """\
import torch

model = Net().to(device)
x = torch.randn(2, 10, device=device)
"""


def migrated(body: str, target: str = "torch_xla"):
    source = HEADER + textwrap.dedent(body)
    result = migrate_source(source.encode(), "t.py", Options(target=target, select=("ACC032",)))
    assert result.error is None
    return source, result


@pytest.mark.parametrize("body, traced", [
    # the traced module only saved, by its method or by torch.jit.save
    ("model.eval()\ntraced = torch.jit.trace(model, x)\ntraced.save('m.pt')\ntorch.jit.save(traced, 'n.pt')\n",
     "traced = torch.jit.trace(copy.deepcopy(model).cpu(), x.cpu())"),
    ("model.train(False)\ntorch.jit.save(torch.jit.trace(model, [x, x]), 'm.pt')\n",
     "torch.jit.save(torch.jit.trace(copy.deepcopy(model).cpu(), [x.cpu(), x.cpu()]), 'm.pt')"),
    ("torch.onnx.export(model, (x, x[0]), 'm.onnx', opset_version=17)\n",
     "torch.onnx.export(copy.deepcopy(model).cpu(), (x.cpu(), x[0].cpu()), 'm.onnx', opset_version=17)"),
])
def test_a_trace_that_stays_on_the_host_traces_a_host_copy(body, traced):
    _, result = migrated(body)
    output = result.output.decode()
    assert traced in output and "import copy" in output
    assert not result.diagnostics and [f.code for f in result.fixes] == ["ACC032"]


@pytest.mark.parametrize("body", [
    # traced in train mode: the copy's batch norm statistics and dropout masks would differ
    "torch.jit.trace(model, x).save('m.pt')\n",
    "model.eval()\nmodel.train()\ntorch.jit.trace(model, x).save('m.pt')\n",
    # the traced module is called on the device's tensors
    "model.eval()\ntraced = torch.jit.trace(model, x)\nprint(traced(x))\n",
    # an input the analysis cannot show is a tensor, a model that is not a name
    "torch.onnx.export(model, (x, hidden), 'm.onnx')\n",
    "torch.onnx.export(build(), x, 'm.onnx')\n",
    # exported in training mode, which the copy would not keep from the model
    "torch.onnx.export(model, x, 'm.onnx', training=torch.onnx.TrainingMode.TRAINING)\n",
])
def test_a_trace_the_copy_cannot_stand_for_is_reported(body):
    source, result = migrated(body)
    assert result.output.decode() == source
    assert [d.code for d in result.diagnostics] == ["ACC032"]
    assert "traces the model on the device" in result.diagnostics[0].message


def test_a_target_that_traces_its_device_keeps_the_call():
    source, result = migrated("torch.onnx.export(model, x, 'm.onnx')\n", target="runtime")
    assert result.output.decode() == source and not result.diagnostics


def test_add_graph_is_a_tensorboard_writer_s():
    body = "from torch.utils.tensorboard import SummaryWriter\nSummaryWriter('runs').add_graph(model, x)\n"
    _, result = migrated(body)
    assert "SummaryWriter('runs').add_graph(copy.deepcopy(model).cpu(), x.cpu())" in result.output.decode()
    source, result = migrated("board.add_graph(model, x)\n")
    assert result.output.decode() == source and not result.diagnostics
