"""FusedAdam / FusedAdamW as drop-ins for torch.optim.Adam / AdamW (CPU: the reference path).

The fused step computes the same formulas in a different order, so parameters are compared with
rtol/atol 1e-5 after several steps.
"""

import copy
import inspect

import pytest
import torch

from accrewrite.runtime.optim import FusedAdam, FusedAdamW

PAIRS = [(FusedAdam, torch.optim.Adam), (FusedAdamW, torch.optim.AdamW)]
TOL = dict(rtol=1e-5, atol=1e-5)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))


def _groups(model, **extra):
    first, second = model[0], model[2]
    return [
        {"params": first.parameters(), **extra},
        {"params": second.parameters(), "lr": 3e-2, "weight_decay": 0.05},
    ]


def _train(model, optimizer, steps, seed=1):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def _parameters(cls):
    """The constructor's parameters: names, kinds and defaults (annotations aside)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters]


def _assert_same_params(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL)


@pytest.mark.parametrize("ours_class, torch_class", PAIRS, ids=["adam", "adamw"])
@pytest.mark.parametrize("extra", [dict(), dict(maximize=True), dict(betas=(0.5, 0.9), eps=1e-4)])
def test_same_signature_defaults_and_updates(ours_class, torch_class, extra):
    assert _parameters(ours_class) == _parameters(torch_class)
    a, b = _model(), _model()
    ours = ours_class(_groups(a, **extra), lr=1e-2)
    theirs = torch_class(_groups(b, **extra), lr=1e-2)
    assert isinstance(ours, torch_class)
    assert ours.defaults == theirs.defaults
    _train(a, ours, 5)
    _train(b, theirs, 5)
    _assert_same_params(a, b)
    for p, q in zip(a.parameters(), b.parameters()):
        assert ours.state[p].keys() == theirs.state[q].keys()
        assert ours.state[p]["step"].dtype == torch.float32 and ours.state[p]["step"].item() == 5


@pytest.mark.parametrize("ours_class, torch_class", PAIRS, ids=["adam", "adamw"])
def test_state_dict_interchangeable_both_ways(ours_class, torch_class):
    for first, second in ((ours_class, torch_class), (torch_class, ours_class)):
        a, b = _model(), _model()
        opt_a = first(_groups(a), lr=1e-2)
        _train(a, opt_a, 3)
        # continue a's run in `first` and, from a's checkpoint, in `second`
        b.load_state_dict(a.state_dict())
        opt_b = second(_groups(b), lr=1e-2)
        # a copy, as a checkpoint would be: load_state_dict keeps the given tensors, and both
        # runs go on updating their state in place
        opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
        _train(a, opt_a, 3, seed=2)
        _train(b, opt_b, 3, seed=2)
        _assert_same_params(a, b)
        assert opt_b.state_dict()["param_groups"] == opt_a.state_dict()["param_groups"]


def test_grad_scaler_passes_scale_and_skips_overflow_on_device():
    a, b = _model(), _model()
    ours, theirs = FusedAdam(a.parameters(), lr=1e-2), torch.optim.Adam(b.parameters(), lr=1e-2)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    x = torch.randn(8, 6)
    for step in range(3):
        for model, optimizer, scaler in zip((a, b), (ours, theirs), scalers):
            optimizer.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            if step == 1:  # an overflow: the step must change nothing
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        _assert_same_params(a, b)
    assert scalers[0].get_scale() == scalers[1].get_scale() == 512.0
    assert all(s["step"].item() == 2 for s in ours.state.values())


def test_closure_and_lr_scheduler():
    model = _model()
    optimizer = FusedAdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x = torch.randn(4, 6)

    def closure():
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    first = optimizer.step(closure)
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 5e-3
    assert optimizer.step(closure) < first


@pytest.mark.parametrize("ours_class, torch_class", PAIRS, ids=["adam", "adamw"])
def test_amsgrad_runs_torchs_own_step(ours_class, torch_class):
    a, b = _model(), _model()
    ours = ours_class(_groups(a, amsgrad=True), lr=1e-2)
    theirs = torch_class(_groups(b, amsgrad=True), lr=1e-2)
    assert ours._step_supports_amp_scaling is False  # GradScaler unscales for torch's step
    _train(a, ours, 4)
    _train(b, theirs, 4)
    _assert_same_params(a, b)
    assert "max_exp_avg_sq" in ours.state[a[0].weight]


def test_differentiable_runs_torchs_own_step():
    results = []
    for optimizer_class in (FusedAdam, torch.optim.Adam):
        start = torch.arange(3.0, requires_grad=True)
        param = start.clone()  # the update stays differentiable with respect to `start`
        param.grad = torch.ones(3)
        optimizer_class([param], lr=0.1, differentiable=True).step()
        (grad,) = torch.autograd.grad(param.sum(), start)
        results.append((param.detach(), grad))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_bad_hyperparameters_are_reported():
    with pytest.raises(ValueError, match="learning rate"):
        FusedAdam(_model().parameters(), lr=-1.0)
    with pytest.raises(ValueError, match="beta"):
        FusedAdamW(_model().parameters(), betas=(1.5, 0.9))
