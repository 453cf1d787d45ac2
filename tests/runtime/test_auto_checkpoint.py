import copy
import io
import logging

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch import nn

from accrewrite.runtime import auto_checkpoint
from accrewrite.runtime.activation_checkpoint import FULL, PLAIN, SELECTIVE, _BlockCost, _estimate_peak, _Outside
from torch.utils._python_dispatch import TorchDispatchMode


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


@pytest.mark.parametrize("selective", [True, False])
def test_every_block_recomputes_and_gradients_match(selective):
    reference, ids = make()
    model = auto_checkpoint(copy.deepcopy(reference), selective=selective)
    assert model.checkpoint_plan.modes == [SELECTIVE if selective else FULL] * 6
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


@pytest.mark.parametrize("first_budget", [None, 0.5])
def test_applying_again_replaces_the_plan(first_budget):
    reference, ids = make()
    model = auto_checkpoint(auto_checkpoint(copy.deepcopy(reference), first_budget), budget=1.0)
    train_step(model, ids)  # calibration
    assert model.checkpoint_plan.checkpointed == 0
    Block.calls = 0
    train_step(model, ids)
    assert Block.calls == 6
    assert "forward" not in model.__dict__
    assert_same_training(reference, model, ids, steps=1)


def blocks_for(budget):
    model, ids = make()
    auto_checkpoint(model, budget=budget)
    assert model.checkpoint_plan.checkpointed is None  # decided at the first training forward
    train_step(model, ids)
    return model.checkpoint_plan


def test_budget_chooses_how_many_blocks_to_checkpoint():
    plans = {budget: blocks_for(budget) for budget in (1.0, 0.9, 0.75, 0.6, 0.45, 0.01)}
    chosen = [plans[budget].modes for budget in sorted(plans, reverse=True)]
    assert chosen[0] == [PLAIN] * 6 and chosen[-1] == [FULL] * 6
    # Tighter budgets walk down the ladder: more blocks checkpointed, then fully recomputed.
    ladder = [modes for modes, _ in plans[1.0].ladder]
    steps = [ladder.index(modes) for modes in chosen]
    assert steps == sorted(steps) and len(set(steps)) >= 5
    for budget, plan in plans.items():
        peaks = [peak for _, peak in plan.ladder]
        assert len(peaks) == 13 and peaks == sorted(peaks, reverse=True)
        position = ladder.index(plan.modes)
        if budget > 0.01:
            assert plan.estimated_ratio <= budget
            assert position == 0 or peaks[position - 1] / peaks[0] > budget  # the first that fits


def test_selective_checkpoint_keeps_down_projections():
    """The MLP's second linear (contraction 4x its width) is not recomputed; the first is."""

    class CountMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten.addmm.default
            return func(*args, **(kwargs or {}))

    counts = {}
    for name, kwargs in {"plain": None, "full": {"selective": False}, "selective": {}}.items():
        model, ids = make()
        if kwargs is not None:
            auto_checkpoint(model, **kwargs)
        with CountMatmuls() as mode:
            train_step(model, ids)
        counts[name] = mode.count
    assert counts["full"] == counts["plain"] + 6 * 2  # both MLP linears of every block again
    assert counts["selective"] == counts["plain"] + 6  # only the up-projection again


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


def test_budget_without_selective_recomputes_fully():
    model, ids = make()
    auto_checkpoint(model, budget=0.6, selective=False)
    train_step(model, ids)
    modes = model.checkpoint_plan.modes
    assert set(modes) == {FULL, PLAIN} and modes == sorted(modes)  # full first, then plain
    assert len(model.checkpoint_plan.ladder) == 7


def test_unreachable_budget_checkpoints_everything_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="accrewrite.runtime.activation_checkpoint"):
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
    # Two blocks: inputs 1, activations 10 (4 of them kept by selective), parameter gradients 2;
    # 5 bytes saved outside the blocks before them.
    costs = [_BlockCost(inputs=1, activations=10, kept=4, grads=2)] * 2
    before = _Outside(before=5, after=0, output=0)
    plain = _estimate_peak([PLAIN, PLAIN], costs, before, 0)
    assert plain == 5 + 10 + 10 + 2  # backward of the last block: both saved, its grad flow
    full = _estimate_peak([FULL, FULL], costs, before, 0)
    assert full == 5 + 10 + 2 + 2  # backward of the first block: recomputed, grad flow, grads
    selective = _estimate_peak([SELECTIVE, SELECTIVE], costs, before, 0)
    assert selective == 5 + (1 + 4) + 10 + 2  # backward of the last: the first keeps 1 + 4
    assert plain > selective > full
    # Checkpointing only the first block helps; only the last does not (its backward is the peak).
    assert plain > _estimate_peak([SELECTIVE, PLAIN], costs, before, 0) >= selective
    assert _estimate_peak([PLAIN, SELECTIVE], costs, before, 0) == plain


def test_the_backward_starts_with_the_output_and_its_gradient_and_frees_what_follows_the_blocks():
    costs = [_BlockCost(inputs=1, activations=10, kept=4, grads=2)] * 2
    head = _Outside(before=5, after=3, output=2)  # a head saves 3 and returns 2 bytes
    # All saved, the output and its gradient: the peak where every block keeps its activations.
    assert _estimate_peak([PLAIN, PLAIN], costs, head, 0) == 5 + 3 + 2 + 10 + 10 + 2
    # Freed before the blocks' backward, where the recomputing blocks peak.
    assert _estimate_peak([FULL, FULL], costs, head, 0) == 5 + 10 + 2 + 2


def allocator_changes(step) -> list[int]:
    """The changes of the bytes the CPU allocator holds during ``step()``, in order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return [change for _, change in sorted((event.time_range.start, event.self_cpu_memory_usage)
                                           for event in prof.events() if event.self_cpu_memory_usage)]


def live_peak(step) -> int:
    """The peak of the bytes the CPU allocator holds during ``step()``, above its start."""
    live = peak = 0
    for change in allocator_changes(step):
        live += change
        peak = max(peak, live)
    return peak


class MLPBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class AttentionBlock(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        return x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


class LM(nn.Module):
    """Blocks under a head four times their width, as a language model's vocabulary is."""

    def __init__(self, dim=32, depth=8, vocab=128, block=MLPBlock):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([block(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_step(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()


@pytest.mark.parametrize("budget", [0.3, 0.4, 0.6])
def test_the_budget_holds_for_the_peak_the_allocator_reaches(budget):
    torch.manual_seed(0)
    plain, ids = LM(), torch.randint(0, 128, (8, 64))
    model = auto_checkpoint(copy.deepcopy(plain), budget=budget)
    lm_step(model, ids)  # the calibration step
    assert model.checkpoint_plan.estimated_ratio <= budget
    assert live_peak(lambda: lm_step(model, ids)) <= (budget + 0.04) * live_peak(lambda: lm_step(plain, ids))


def test_the_calibration_step_holds_nothing_after_it_but_the_gradients():
    # The probed block's output is dropped: its graph, and the activations it saved, go with it
    # (attention saves its own output, which a pack hook returning it kept in a cycle).
    torch.manual_seed(0)
    plain, ids = LM(block=AttentionBlock), torch.randint(0, 128, (8, 64))
    model = auto_checkpoint(copy.deepcopy(plain), budget=0.5)
    assert sum(allocator_changes(lambda: lm_step(model, ids))) == sum(allocator_changes(lambda: lm_step(plain, ids)))


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
