import copy
import io
import logging

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch import nn

from accrewrite.runtime import auto_checkpoint
from accrewrite.runtime.memory import _estimate_peak


class Block(nn.Module):
    calls = 0  # forward runs, recomputation included

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.2)

    def forward(self, x, scale=1.0):
        type(self).calls += 1
        return x + self.drop(self.mlp(self.norm(x))) * scale


class Net(nn.Module):
    def __init__(self, dim=16, depth=6, vocab=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x)


def make(seed=0):
    torch.manual_seed(seed)
    return Net(), torch.randint(0, 32, (4, 24))


def train_step(model, ids, seed=1):
    """Forward + backward from a fixed RNG state: dropout masks are comparable across models."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_training(reference, model, ids, steps=2):
    for seed in range(steps):
        expected_loss, expected = train_step(reference, ids, seed)
        loss, grads = train_step(model, ids, seed)
        torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
        assert grads.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(grads[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_every_block_recomputes_and_gradients_match():
    reference, ids = make()
    model = auto_checkpoint(copy.deepcopy(reference))
    assert model.checkpoint_plan.checkpointed == 6
    assert_same_training(reference, model, ids)
    Block.calls = 0
    train_step(model, ids)
    assert Block.calls == 12  # each block's forward runs again in the backward


def test_without_gradients_blocks_run_once():
    model, ids = make()
    auto_checkpoint(model)
    Block.calls = 0
    with torch.no_grad():
        model(ids)
    assert Block.calls == 6


def test_names_state_dict_and_copies_are_unchanged():
    reference, ids = make()
    model = auto_checkpoint(copy.deepcopy(reference))
    assert list(model.state_dict()) == list(reference.state_dict())
    assert [name for name, _ in model.named_modules()] == [name for name, _ in reference.named_modules()]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert_same_training(reference, clone, ids, steps=1)
        Block.calls = 0
        train_step(clone, ids)
        assert Block.calls == 12


def test_applying_again_replaces_the_plan():
    reference, ids = make()
    model = auto_checkpoint(auto_checkpoint(copy.deepcopy(reference)), budget=1.0)
    train_step(model, ids)  # calibration
    assert model.checkpoint_plan.checkpointed == 0
    Block.calls = 0
    train_step(model, ids)
    assert Block.calls == 6
    assert_same_training(reference, model, ids, steps=1)


def blocks_for(budget):
    model, ids = make()
    auto_checkpoint(model, budget=budget)
    assert model.checkpoint_plan.checkpointed is None  # decided at the first training forward
    train_step(model, ids)
    return model.checkpoint_plan


def test_budget_chooses_how_many_blocks_to_checkpoint():
    plans = {budget: blocks_for(budget) for budget in (1.0, 0.9, 0.75, 0.6, 0.01)}
    chosen = [plans[budget].checkpointed for budget in sorted(plans, reverse=True)]
    assert chosen[0] == 0 and chosen[-1] == 6
    assert chosen == sorted(chosen) and len(set(chosen)) >= 4
    for budget, plan in plans.items():
        estimates = plan.estimates
        assert len(estimates) == 7 and estimates == sorted(estimates, reverse=True)
        if budget > 0.01:
            assert plan.estimated_ratio <= budget
            assert estimates[plan.checkpointed - 1] / estimates[0] > budget if plan.checkpointed else True


def test_budget_plan_trains_like_the_plain_model_and_checkpoints_the_first_blocks():
    reference, ids = make()
    model = auto_checkpoint(copy.deepcopy(reference), budget=0.75)
    assert_same_training(reference, model, ids, steps=3)  # the calibration step included
    assert "forward" not in model.__dict__  # the calibration hook is gone
    chosen = model.checkpoint_plan.checkpointed
    assert 0 < chosen < 6
    Block.calls = 0
    train_step(model, ids)
    assert Block.calls == 6 + chosen
    checkpointed = ["forward" in block.__dict__ for block in model.blocks]
    assert checkpointed == [True] * chosen + [False] * (6 - chosen)


def test_unreachable_budget_checkpoints_everything_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="accrewrite.runtime.memory"):
        plan = blocks_for(0.01)
    assert plan.checkpointed == 6
    assert "below" in caplog.text


def test_evaluation_does_not_calibrate():
    model, ids = make()
    auto_checkpoint(model, budget=0.5)
    model.eval()
    model(ids)
    assert model.checkpoint_plan.checkpointed is None
    model.train()
    train_step(model, ids)
    assert model.checkpoint_plan.checkpointed is not None


def test_estimate_follows_the_backward_timeline():
    # Two blocks: inputs 1, activations 10, parameter gradients 2; 5 bytes outside the blocks.
    plain = _estimate_peak(0, 5, 0, [1, 1], [10, 10], [2, 2])
    assert plain == 5 + 10 + 10 + 2  # backward of the last block: both saved, its grad flow
    every = _estimate_peak(2, 5, 0, [1, 1], [10, 10], [2, 2])
    assert every == 5 + 10 + 2 + 2  # backward of the first block: recomputed, grad flow, grads
    assert plain > _estimate_peak(1, 5, 0, [1, 1], [10, 10], [2, 2]) >= every


@pytest.mark.parametrize(
    "model, budget, error, match",
    [
        (Net(), 0, ValueError, r"\(0, 1\]"),
        (Net(), 1.5, ValueError, r"\(0, 1\]"),
        (Net(), "half", TypeError, "budget"),
        (Net(), True, TypeError, "budget"),
        (nn.Sequential(nn.Linear(2, 2), nn.ReLU()), None, ValueError, "no repeated blocks"),
        ("model", None, TypeError, "nn.Module"),
    ],
)
def test_bad_arguments(model, budget, error, match):
    with pytest.raises(error, match=match):
        auto_checkpoint(model, budget=budget)
