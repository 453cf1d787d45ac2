"""The net under every migration: an output that reads a name unbound where the input bound it is
refused, naming the line and the rule, and nothing is written. A rule broken on purpose (a
third-party pack's) makes the shape; the built-in rules are expected never to."""

import libcst as cst
import pytest

from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Rule
from accrewrite.unbound import REFUSAL


class LoaderOnDeviceAnywhere(Rule):
    """Broken on purpose: every loop over a ``*dataloader`` iterates the device loader, which
    reads ``device`` wherever the loop is, bound yet or not."""

    code = "XYZ900"
    name = "loader-on-device-anywhere"
    summary = "iterate the device loader"
    concepts = ("device_loader",)
    triggers = frozenset({"test_dataloader"})

    def leave_For(self, original_node, updated_node):
        loader = original_node.iter
        if not (isinstance(loader, cst.Name) and loader.value.endswith("dataloader")):
            return updated_node
        self.ctx.fix(original_node, "iterates the device loader")
        return updated_node.with_changes(iter=self.ctx.expr("device_loader", loader=loader.value, device="device"))


class DropDeviceChoice(Rule):
    """Broken on purpose: removes ``device = torch.device(...)`` and puts nothing in its place."""

    code = "XYZ901"
    name = "drop-device-choice"
    summary = "drop the device choice"
    triggers = frozenset({"device"})

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if "device = torch.device(" not in self.ctx.code(original_node):
            return updated_node
        self.ctx.fix(original_node, "dropped")
        return cst.RemoveFromParent()


@pytest.fixture
def broken_rule(rule_pack):
    """The rules registered as a third-party pack is (an entry point naming its module)."""
    rule_pack("acc_broken_pack", LoaderOnDeviceAnywhere, DropDeviceChoice)


# A tutorial's shape: a look at one batch at module level, above the line that picks the device.
# The seed's fix (ACC001) comes first in the file: the rule named is the one whose removal
# leaves the name bound, not the first that changed something.
TUTORIAL = b'''import torch
from torch import nn
from torch.utils.data import DataLoader

torch.manual_seed(0)
test_dataloader = DataLoader(list(range(8)), batch_size=4)

for X in test_dataloader:
    print(X.shape)
    break

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
'''
BROKEN = Options(target="torch_xla", select=("ACC001", "ACC002", "XYZ900"))


def test_a_name_read_above_its_module_level_binding_is_refused_naming_line_and_rule(broken_rule):
    result = migrate_source(TUTORIAL, "tutorial.py", BROKEN)
    assert result.error is not None and not result.changed and result.output == TUTORIAL
    assert result.error.reason.startswith(f"{REFUSAL} 'device' unbound at line 8, where it writes ")
    assert "`for X in pl.MpDeviceLoader(test_dataloader, device):`" in result.error.reason
    assert "(XYZ900 loader-on-device-anywhere)" in result.error.reason
    assert result.error.line == 8
    assert result.fixes == []


def test_the_same_change_below_the_binding_passes(broken_rule):
    below = TUTORIAL.replace(b"for X in test_dataloader:\n    print(X.shape)\n    break\n\n", b"") + (
        b"for X in test_dataloader:\n    print(X.shape)\n")
    result = migrate_source(below, "tutorial.py", BROKEN)
    assert result.error is None and b"pl.MpDeviceLoader(test_dataloader, device)" in result.output


def test_a_binding_removed_names_the_line_that_reads_it(broken_rule):
    result = migrate_source(TUTORIAL, "tutorial.py", Options(select=("XYZ901",)))
    assert result.error is not None and result.output == TUTORIAL
    assert result.error.reason.startswith(f"{REFUSAL} 'device' unbound at line 13 (XYZ901 drop-device-choice); ")
    assert result.error.line == 13


FUNCTION = b'''import torch
{global_device}

def evaluate(model, test_dataloader):
    for X in test_dataloader:
        print(X.shape)
        break
    device = torch.device("cuda")
    return model.to(device)
'''


@pytest.mark.parametrize("global_device", [b"", b"device = 'cpu'"], ids=["no-global", "global-too"])
def test_a_local_read_before_the_function_binds_it_is_refused(broken_rule, global_device):
    """Without a module-level ``device`` pyflakes calls the read undefined; with one, a local
    read before assignment (Python's UnboundLocalError): both are the migration's."""
    source = FUNCTION.replace(b"{global_device}", global_device)
    result = migrate_source(source, "evaluate.py", BROKEN)
    assert result.error is not None and result.output == source
    assert result.error.reason.startswith(f"{REFUSAL} 'device' unbound at line 5, where it writes ")
    assert "(XYZ900 loader-on-device-anywhere)" in result.error.reason


def test_names_the_input_already_leaves_unbound_are_not_blamed_on_the_migration():
    """A star import, names that ``exec`` binds and a plain undefined one stay as unbound as they
    were: only a name the output reads unbound and the input never does counts."""
    source = b'''import torch
from helpers import *

exec(open("config.py").read())
torch.manual_seed(seed)
model = model.cuda()
for batch in loader:
    loss = model(batch.cuda()).sum()
    loss.backward()
    optimizer.step()
'''
    result = migrate_source(source, "fragment.py", Options(target="runtime"))
    assert result.error is None and result.changed
    assert b"xm.set_rng_state(seed)" in result.output and b"model.to(xm.xla_device())" in result.output


def test_more_reads_of_a_name_the_input_already_reads_unbound_are_not_blamed(broken_rule):
    """``device`` comes from ``exec``: the rule's read of it is no worse than the script's own.
    And a script that reads ``model`` before ``model = DDP(model)`` binds it fails as it did
    when the unwrapping leaves ``model`` unbound below."""
    from_exec = b'''import torch

exec(open("config.py").read())
test_dataloader = torch.utils.data.DataLoader(list(range(8)))
for X in test_dataloader:
    print(X.to(device))
'''
    result = migrate_source(from_exec, "from_exec.py", BROKEN)
    assert result.error is None and b"pl.MpDeviceLoader(test_dataloader, device)" in result.output
    unbound_model = b'''import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main(local_rank):
    model = DDP(model, device_ids=[local_rank])
    for x in loader:
        model(x).sum().backward()
'''
    result = migrate_source(unbound_model, "unbound_model.py", Options(target="runtime"))
    assert result.error is None and b"model = DDP(" not in result.output


def test_in_place_writes_nothing_for_the_refused_file_and_the_others_still_migrate(broken_rule, tmp_path, cli):
    refused, fine = tmp_path / "tutorial.py", tmp_path / "fine.py"
    refused.write_bytes(TUTORIAL)
    below = b'import torch\ndevice = torch.device("cuda")\nfor X in test_dataloader:\n    print(X.to(device))\n'
    fine.write_bytes(below)
    code, out, _ = cli("migrate", refused, fine, "--in-place", "--target", "torch_xla", "--select", "ACC001,ACC002,XYZ900")
    assert code == 2
    assert f"{refused}:8:1: error: {REFUSAL} 'device' unbound at line 8" in " ".join(out.split())
    assert refused.read_bytes() == TUTORIAL
    assert b"pl.MpDeviceLoader(test_dataloader, device)" in fine.read_bytes()


# A function whose device variable is bound on some paths only; the broken rule's loop reads it.
PATHS = b'''import os
import torch


def evaluate(model, test_dataloader, cuda, rank):
{body}
'''
WRAPPED = "`for X in pl.MpDeviceLoader(test_dataloader, device):`"
ON_A_PATH = " on a path that skips its binding"
# shape -> (line of the read, what the refusal says of the path, the function's body)
REFUSED_SHAPES = {
    "bound in one arm of an if": (8, ON_A_PATH, b'''    if cuda:
        device = torch.device("cuda")
    for X in test_dataloader:
        print(X.shape)'''),
    "bound in a loop's body, read after it": (8, ON_A_PATH, b'''    for attempt in range(3):
        device = torch.device("cuda")
    for X in test_dataloader:
        print(X.shape)'''),
    # (pyflakes reads the function in source order: the read above the binding is its finding)
    "bound after the read, in the same loop": (7, "", b'''    for epoch in range(2):
        for X in test_dataloader:
            print(X.shape)
        device = torch.device("cuda")'''),
    "bound in a try body whose handler goes on": (10, ON_A_PATH, b'''    try:
        device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}")
    except KeyError:
        print("one process")
    for X in test_dataloader:
        print(X.shape)'''),
}


@pytest.mark.parametrize("line, path, body", REFUSED_SHAPES.values(), ids=list(REFUSED_SHAPES))
def test_a_read_on_a_path_that_skips_the_binding_is_refused(broken_rule, line, path, body):
    """pyflakes takes any binding in the function for one on every path; these shapes run into
    UnboundLocalError on the path that skips it."""
    source = PATHS.replace(b"{body}", body)
    result = migrate_source(source, "evaluate.py", BROKEN)
    assert result.error is not None and result.output == source
    assert result.error.reason.startswith(
        f"{REFUSAL} 'device' unbound at line {line}{path}, where it writes {WRAPPED} "
        "(XYZ900 loader-on-device-anywhere); ")
    assert result.error.line == line


ACCEPTED_SHAPES = {
    "both arms bind": b'''    if cuda:
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    for X in test_dataloader:
        print(X.shape)''',
    "the other arm returns": b'''    if cuda:
        device = torch.device("cuda")
    else:
        return None
    for X in test_dataloader:
        print(X.shape)''',
    "the read is guarded as the binding is": b'''    if cuda:
        device = torch.device("cuda")
    print("evaluating")
    if cuda:
        for X in test_dataloader:
            print(X.shape)''',
    "the input reads it on such a path already": b'''    if cuda:
        device = torch.device("cuda")
    print(device)
    for X in test_dataloader:
        print(X.shape)''',
}


@pytest.mark.parametrize("body", ACCEPTED_SHAPES.values(), ids=list(ACCEPTED_SHAPES))
def test_a_read_where_every_path_binds_or_the_input_read_so_passes(broken_rule, body):
    source = PATHS.replace(b"{body}", body)
    result = migrate_source(source, "evaluate.py", BROKEN)
    assert result.error is None and "pl.MpDeviceLoader(test_dataloader, device)" in result.output.decode()


def test_another_names_read_on_such_a_path_does_not_hide_a_new_one(broken_rule):
    """A rank-0-only TensorBoard writer, read on every rank below (research code's own
    possibly-unbound read), is the script's; the device read that the rule adds is not."""
    body = b'''    if rank == 0:
        writer = open("log.txt", "w")
    if cuda:
        device = torch.device("cuda")
    for X in test_dataloader:
        writer.write(str(X.shape))'''
    source = PATHS.replace(b"{body}", body)
    result = migrate_source(source, "evaluate.py", BROKEN)
    assert result.error is not None and result.output == source
    assert result.error.reason.startswith(f"{REFUSAL} 'device' unbound at line 10{ON_A_PATH}")


def test_the_guards_repeated_test_takes_the_branch_it_took_before():
    """``--guard``'s ``if enabled():`` blocks read the target's imports that its first such block
    binds: the guard reads one environment variable, the same for the whole run."""
    source = b'import torch\n\ndevice = torch.device("cuda")\nmodel = torch.nn.Linear(2, 2).to(device)\n'
    result = migrate_source(source, "guarded.py", Options(target="torchacc", guard="TORCHACC_COMPILER_OPT"))
    assert result.error is None
    output = result.output.decode()
    assert "if enable_torchacc_compiler():\n    import torchacc.torch_xla.core.xla_model as xm" in output
    assert "if enable_torchacc_compiler():\n    device = xm.xla_device()" in output


def test_a_name_the_input_never_binds_is_the_inputs_on_every_path_of_the_output():
    """A fragment reads ``xm`` it never imports; guarded, the output imports it where the guard
    is on, and the original line reads it where it is off: unbound there as in the input."""
    source = b"import torch\n\nmodel = model.cuda()\nxm.mark_step()\n"
    result = migrate_source(source, "fragment.py", Options(target="torchacc", guard="TORCHACC_COMPILER_OPT"))
    assert result.error is None and b"    import torchacc.torch_xla.core.xla_model as xm" in result.output
