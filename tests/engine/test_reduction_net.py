"""The net under DistributedDataParallel's removal: an output that drops a DDP wrap the input had
and leaves an optimizer step with no gradient all-reduce before it is refused, naming the step's
line and the rule, and nothing is written. A rule broken on purpose (a third-party pack's) makes
the shape; the built-in rules keep DDP instead, and say why (ACC005)."""

import libcst as cst
import pytest

from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Rule
from accrewrite.unbound import REFUSAL


class DropTheWrap(Rule):
    """Broken on purpose: ``model = DDP(model)`` becomes ``model = model``, nothing in its place."""

    code = "XYZ910"
    name = "drop-the-wrap"
    summary = "drop DDP"
    triggers = frozenset({"DDP"})

    def leave_Call(self, original_node, updated_node):
        if not (isinstance(original_node.func, cst.Name) and original_node.func.value == "DDP"):
            return updated_node
        self.ctx.fix(original_node, "dropped")
        return updated_node.args[0].value


@pytest.fixture
def broken_rule(rule_pack):
    rule_pack("acc_broken_ddp_pack", DropTheWrap)


SCRIPT = b'''import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(model.cuda())
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
'''


def test_a_wrap_dropped_with_the_step_left_unreduced_is_refused_naming_step_and_rule(broken_rule):
    result = migrate_source(SCRIPT, "train.py", Options(select=("XYZ910",)))
    assert result.error is not None and not result.changed and result.output == SCRIPT
    assert result.error.reason.startswith(f"{REFUSAL} the optimizer step at line 8 with no gradient all-reduce ")
    assert "(XYZ910 drop-the-wrap)" in result.error.reason and result.error.line == 8
    assert result.fixes == []


def test_the_same_drop_with_the_targets_step_after_it_passes(broken_rule):
    result = migrate_source(SCRIPT, "train.py", Options(select=("XYZ910", "ACC006")))
    assert result.error is None and b"model = model.cuda()\n" in result.output
    assert b"xm.optimizer_step(optimizer)" in result.output and not result.drops_ddp_alone


def test_a_drop_whose_steps_live_in_another_module_is_not_judged_here(broken_rule):
    elsewhere = SCRIPT.replace(b"    optimizer.step()\n", b"    loss_scaler(loss, optimizer)\n")
    result = migrate_source(elsewhere, "main.py", Options(select=("XYZ910",)))
    assert result.error is None and b"model = model.cuda()\n" in result.output
    assert result.drops_ddp_alone  # the project's pass reads the modules that step


def test_with_the_reduction_not_selected_ddp_is_kept_and_said_so():
    result = migrate_source(SCRIPT, "train.py", Options(ignore=("ACC006",)))
    assert result.error is None and b"model = DDP(model.to(xm.xla_device()))" in result.output
    [kept] = [d for d in result.diagnostics if d.code == "ACC005"]
    assert kept.message == ("DistributedDataParallel kept: ACC006, which all-reduces the gradients in its place, "
                            "does not run")
    assert kept.line == 4


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_a_step_the_reduction_cannot_reach_keeps_ddp_and_nothing_reduces_twice(target):
    factory = SCRIPT.replace(b"optimizer.", b"opt_g.")
    result = migrate_source(factory, "train.py", Options(target=target))
    assert result.error is None
    output = result.output.decode()
    assert "model = DDP(model.to(" in output and "opt_g.step()" in output
    assert not any(added in output for added in ("reduce_gradients", "optimizer_step", "broadcast_master_param"))
    assert [d.message for d in result.diagnostics if d.code == "ACC005"] == [
        "DistributedDataParallel kept: `opt_g.step()` steps where no all-reduce can go"]
