"""ACC003 beyond its examples: a loader is read through the device loader only where its loop
moves every batch element before any host-side use of it. A loop that first works on an element
on the host (fills a host tensor with it, reads it with numpy, in a function of the file too)
keeps its loader and its moves, and says where; a use after the move, or one that works where
the tensor is (its size, indexing it with a permutation made on the host), does not count."""

from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = """\
import numpy as np
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
model = torch.nn.Linear(4, 3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=8)
"""
STEP = """\
    loss = torch.nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
"""


def migrated(body: str, target: str = "torch_xla", header: str = HEADER):
    result = migrate_source((header + body).encode(), "train.py", Options(target=target, select=("ACC003",)))
    assert result.error is None
    return result.output.decode(), [d for d in result.diagnostics if d.code == "ACC003"]


def wrapped(output: str) -> bool:
    return "MpDeviceLoader(loader, device)" in output


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_one_hot_labels_built_on_the_host_keep_the_loader_and_the_moves(target):
    source = (FIXTURES / "gan_onehot_labels.in.py").read_bytes()
    result = migrate_source(source, "solver.py", Options(target=target))
    output = result.output.decode()
    assert "MpDeviceLoader" not in output and output.count(".to(self.device)") == 7
    [diagnostic] = [d for d in result.diagnostics if d.code == "ACC003"]
    assert (diagnostic.line, diagnostic.message) == (
        43, "`label_org` is used on the host (line 28) before it is moved; `data_loader` left unwrapped")
    assert diagnostic.help.startswith("`out[np.arange(batch_size), labels.long()]` indexes a tensor made on the host")
    assert "mark_step()" in output or "torch_xla.sync()" in output  # the step loop marks its steps itself


def test_each_loop_is_decided_on_its_own():
    output = migrate_source((FIXTURES / "gan_label_shuffle.in.py").read_bytes(), "gan.py",
                            Options(target="runtime", select=("ACC003",)))
    text = output.output.decode()
    assert "for x_real, label_org in pl.MpDeviceLoader(loader, device):" in text
    assert "for x, y in loader:" in text and "x, y = x.to(device), y.to(device)" in text
    [diagnostic] = output.diagnostics
    assert diagnostic.message == "`y` is used on the host (line 50) before it is moved; `loader` left unwrapped"
    assert diagnostic.help.startswith("`y.numpy()` reads it with .numpy().")


@pytest.mark.parametrize("body", [
    # one-hot labels filled into a tensor made on the host
    "    onehot = torch.zeros(labels.size(0), 3)\n    onehot[torch.arange(labels.size(0)), labels] = 1\n",
    "    onehot = torch.zeros(len(labels), 3).scatter_(1, labels.unsqueeze(1), 1)\n",
    "    onehot = np.zeros((labels.size(0), 3))\n    onehot[np.arange(labels.size(0)), labels] = 1\n",
    # numpy, directly or on a value read from the batch
    "    counts = np.bincount(labels)\n",
    "    first = labels[:4].numpy()\n",
    "    picked = labels[torch.randperm(8)]\n    kept = picked.numpy()\n",
    # computed with a tensor made on the host
    "    x = torch.cat([x, torch.zeros(x.size(0), 1)], dim=1)[:, :4]\n",
])
def test_a_host_side_use_before_the_move_keeps_the_loader(body):
    loop = "for x, labels in loader:\n" + body + "    x, labels = x.to(device), labels.to(device)\n" + STEP
    output, [diagnostic] = migrated(loop)
    assert not wrapped(output) and "x, labels = x.to(device), labels.to(device)" in output
    assert diagnostic.message.endswith("before it is moved; `loader` left unwrapped")


@pytest.mark.parametrize("body", [
    # what is known without the values, or works where the tensor is
    "    n = labels.size(0)\n    shape = x.shape\n    count = len(labels)\n",
    "    labels = labels[torch.randperm(labels.size(0))]\n",
    "    seen = np.zeros(3)\n    seen[0] += labels.sum().item()\n    first = labels.cpu().numpy()\n",
    # the counter of enumerate is a number
    "    steps = np.arange(x.size(0))\n",
])
def test_uses_that_work_where_the_batch_is_keep_the_wrap(body):
    output, diagnostics = migrated("for step, (x, labels) in enumerate(loader):\n" + body
                                   + "    x, labels = x.to(device), labels.to(device)\n" + STEP)
    assert wrapped(output) and not diagnostics and "labels.to(device)" not in output


@pytest.mark.parametrize("moves", [
    # a use after the move is on the device either way
    "    x, labels = x.to(device), labels.to(device)\n",
    # a move on one path: timm's prefetching loader moves batches itself, otherwise the loop does
    "    if not prefetching:\n        x, labels = x.to(device), labels.to(device)\n",
])
def test_a_use_after_a_move_keeps_the_wrap(moves):
    body = (
        "for x, labels in loader:\n" + moves +
        "    onehot = torch.zeros(labels.size(0), 3)\n"
        "    onehot[torch.arange(labels.size(0)), labels] = 1\n" + STEP
    )
    output, diagnostics = migrated(body)
    assert wrapped(output) and not diagnostics


def test_a_value_drawn_on_either_branch_is_followed():
    body = (
        "batches = iter(loader)\n"
        "for step in range(10):\n"
        "    try:\n"
        "        x, labels = next(batches)\n"
        "    except StopIteration:\n"
        "        if step % 2:\n"
        "            batches = iter(loader)\n"
        "            x, labels = next(batches)\n"
        "        else:\n"
        "            x, labels = torch.zeros(8, 4), torch.zeros(8).long()\n"
        "    onehot = torch.zeros(8, 3)\n"
        "    onehot[torch.arange(8), labels] = 1\n"
        "    x, labels = x.to(device), labels.to(device)\n" + STEP
    )
    output, [diagnostic] = migrated(body)
    assert "MpDeviceLoader" not in output and diagnostic.message.startswith("`labels` is used on the host (line 20)")


@pytest.mark.parametrize("body", ["    batch = {k: v.numpy() for k, v in batch.items()}\n",
                                  "    ids = np.asarray(batch['ids'])\n"])
def test_a_batch_read_by_key_is_followed(body):
    loop = "for batch in loader:\n" + body + "    x, labels = batch['x'].to(device), batch['y'].to(device)\n" + STEP
    output, [diagnostic] = migrated(loop)
    assert not wrapped(output) and diagnostic.message.startswith("`batch` is used on the host")


def test_the_files_functions_are_followed_through_the_calls_they_make():
    helpers = HEADER + (
        "def fill(out, labels):\n"
        "    out[torch.arange(labels.size(0)), labels] = 1\n"
        "    return out\n\n\n"
        "def one_hot(labels, n):\n"
        "    return fill(torch.zeros(labels.size(0), n), labels)\n\n\n"
        "def countdown(labels, n):\n"  # recursive: followed once
        "    return labels if n == 0 else countdown(labels, n - 1)\n\n\n"
    )
    body = "for x, labels in loader:\n    c = one_hot(countdown(labels, 2), 3)\n    x, c = x.to(device), c.to(device)\n"
    body += STEP
    output, [diagnostic] = migrated(body, header=helpers)
    assert not wrapped(output)
    assert (diagnostic.line, diagnostic.message) == (
        23, "`labels` is used on the host (line 10) before it is moved; `loader` left unwrapped")
    output, diagnostics = migrated(body.replace("one_hot(", "countdown("), header=helpers)
    assert wrapped(output) and not diagnostics


def test_noqa_silences_the_finding_not_the_decision():
    body = "for x, labels in loader:\n    counts = np.bincount(labels)  # noqa: ACC003\n    x = x.to(device)\n" + STEP
    output, diagnostics = migrated(body)
    assert not wrapped(output) and not diagnostics
