"""amp: device-aware autocast, GradScaler on the runtime device, syncfree optimizers (equal to
torch.optim, overflow steps skipped on the device, no host sync), and AMP with gradients
all-reduced before unscale_ on 2 gloo ranks."""

import contextlib

import pytest
import torch

import accrewrite.runtime.xla_model as xm
from accrewrite.runtime.amp import GradScaler, autocast, syncfree

from _ranks import run_ranks

STEPS = 50

# --- autocast and GradScaler ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults")
def test_autocast_defaults_to_bf16_on_the_cpu():
    a = torch.randn(4, 4)
    with autocast():
        assert (a @ a).dtype == torch.bfloat16
    with autocast("xla"):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(xm.xla_device(), dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    with autocast(enabled=False):
        assert (a @ a).dtype == torch.float32

    @autocast()
    def matmul(x):
        return x @ x

    assert matmul(a).dtype == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_autocast_defaults_to_fp16_on_cuda():
    a = torch.randn(4, 4, device="cuda")
    with autocast():
        assert (a @ a).dtype == torch.float16
    with autocast(dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16


def test_grad_scaler_runs_on_the_runtime_device():
    scaler = GradScaler(init_scale=8.0)
    assert scaler.is_enabled() and scaler._device == xm.xla_device().type
    assert scaler.get_scale() == 8.0
    assert GradScaler(enabled=False).scale(torch.ones(1, device=xm.xla_device())).item() == 1.0


def test_autocast_rejects_an_unknown_device():
    with pytest.raises(RuntimeError):
        autocast("nodevice")


# --- syncfree optimizers against torch.optim -------------------------------------------------

CONFIGS = {
    "adam": (syncfree.Adam, torch.optim.Adam, dict(lr=1e-2)),
    "adam-wd-maximize": (syncfree.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, maximize=True)),
    "adamw": (syncfree.AdamW, torch.optim.AdamW, dict(lr=1e-2)),
    "adamw-wd": (syncfree.AdamW, torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.3, eps=1e-6)),
    "sgd": (syncfree.SGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd-momentum-damp-wd": (syncfree.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov": (syncfree.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "sgd-maximize": (syncfree.SGD, torch.optim.SGD, dict(lr=1e-3, momentum=0.5, weight_decay=0.01, maximize=True)),
}
EQUALITY_CASES = [pytest.param(*config, id=name) for name, config in CONFIGS.items()]
OVERFLOW_CASES = [pytest.param(*config, id=name) for name, config in CONFIGS.items()]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))


def _pair(ours_cls, ref_cls, kwargs):
    ours_model, ref_model = _model(), _model()
    return ours_model, ours_cls(ours_model.parameters(), **kwargs), ref_model, ref_cls(ref_model.parameters(), **kwargs)


def _set_grads(models, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)
    for model in models:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()


def _assert_same(ours_model, ours, ref_model, ref):
    """Parameters equal to 1e-6; optimizer state (moments, step counts) to float32 rounding."""
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        assert ours.state[p].keys() >= ref.state[q].keys()
        for key, value in ref.state[q].items():
            torch.testing.assert_close(ours.state[p][key].cpu(), value.cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ours_cls, ref_cls, kwargs", EQUALITY_CASES)
def test_updates_equal_torch_optim_over_50_steps(ours_cls, ref_cls, kwargs):
    ours_model, ours, ref_model, ref = _pair(ours_cls, ref_cls, kwargs)
    for step in range(STEPS):
        _set_grads([ours_model, ref_model], step)
        ours.step()
        ref.step()
    assert not torch.equal(ours_model[0].weight, _model()[0].weight)  # it trained
    _assert_same(ours_model, ours, ref_model, ref)


@pytest.mark.parametrize("kwargs", [kwargs for name, (_, _, kwargs) in CONFIGS.items() if name.startswith("sgd")])
def test_sgd_updates_are_torch_optims_bit_for_bit(kwargs):
    """Same ops in the same order: a migrated script's losses match the original's exactly, not
    after a few steps of rounding that BatchNorm over small batches amplifies."""
    ours_model, ours, ref_model, ref = _pair(syncfree.SGD, torch.optim.SGD, kwargs)
    for step in range(STEPS):
        _set_grads([ours_model, ref_model], step)
        ours.step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ours_model.parameters(), ref_model.parameters()))


@pytest.mark.parametrize("ours_cls, ref_cls, kwargs", OVERFLOW_CASES)
def test_overflow_steps_change_nothing(ours_cls, ref_cls, kwargs):
    """found_inf set on some steps (the first among them): ours must match torch.optim that
    simply did not step then, parameters and state alike."""
    ours_model, ours, ref_model, ref = _pair(ours_cls, ref_cls, kwargs)
    overflow = {0, 1, 7, 30}
    for step in range(STEPS):
        _set_grads([ours_model, ref_model], step)
        before = [p.clone() for p in ours_model.parameters()]
        ours.step(found_inf=torch.tensor(1.0 if step in overflow else 0.0))
        if step in overflow:
            assert all(torch.equal(p, b) for p, b in zip(ours_model.parameters(), before))
        else:
            ref.step()
    _assert_same(ours_model, ours, ref_model, ref)


@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_state_dict_round_trip_continues_the_same_run(name, tmp_path):
    kwargs = dict(lr=0.05, momentum=0.9) if name == "SGD" else dict(lr=1e-2)
    models = [_model(), _model()]
    straight = getattr(syncfree, name)(models[0].parameters(), **kwargs)
    for step in range(3):
        _set_grads(models, step)
        straight.step()
    xm.save(straight.state_dict(), tmp_path / "optimizer.pt")
    models[1].load_state_dict(models[0].state_dict())
    resumed = getattr(syncfree, name)(models[1].parameters(), **kwargs)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt"))
    for step in range(3, 6):
        _set_grads(models, step)
        straight.step()
        resumed.step()
    for p, q in zip(*(m.parameters() for m in models)):
        assert torch.equal(p, q)
    assert all(s["step"].item() == 6 for s in resumed.state.values())


def test_grad_scale_divides_the_gradients():
    ours_model, ours, ref_model, ref = _pair(syncfree.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.5))
    for step in range(5):
        _set_grads([ours_model, ref_model], step)
        for p in ours_model.parameters():
            p.grad.mul_(1024.0)
        ours.grad_scale = torch.tensor(1024.0)  # what GradScaler sets for the call
        ours.step()
        del ours.grad_scale
        ref.step()
    _assert_same(ours_model, ours, ref_model, ref)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda p: syncfree.Adam(p, amsgrad=True), "amsgrad"),
        (lambda p: syncfree.AdamW(p, lr=-1.0), "learning rate"),
        (lambda p: syncfree.Adam(p, betas=(0.9, 1.0)), "betas"),
        (lambda p: syncfree.SGD(p, nesterov=True), "nesterov"),
        (lambda p: syncfree.SGD(p, momentum=-0.1), "momentum"),
    ],
)
def test_bad_hyperparameters_are_rejected(build, message):
    with pytest.raises(ValueError, match=message):
        build(_model().parameters())


# --- GradScaler + syncfree: no host sync -----------------------------------------------------


class HostSync(AssertionError):
    pass


@contextlib.contextmanager
def host_syncs_raise():
    """Make every way of reading a tensor's value on the host raise."""

    def forbid(name):
        def raiser(self, *args, **kwargs):
            raise HostSync(f"host sync: Tensor.{name}")

        return raiser

    names = ["item", "tolist", "__bool__", "__float__", "__int__"]
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, forbid(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def test_the_sync_detector_works():
    with host_syncs_raise(), pytest.raises(HostSync):
        bool(torch.tensor(1.0))
    with host_syncs_raise(), pytest.raises(HostSync):
        torch.ones(1).item()


def _scaled_training(optimizer_factory, overflow_steps, sync_guard):
    model = _model()
    optimizer = optimizer_factory(model.parameters())
    scaler = GradScaler(init_scale=2.0**10, growth_interval=3)
    scales = []
    for step in range(12):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)
        optimizer.zero_grad()
        with autocast():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if step in overflow_steps:
            model[0].weight.grad[0, 0] = float("inf")
        with sync_guard():
            scaler.step(optimizer)
            scaler.update()
        scales.append(scaler.get_scale())
    return model, optimizer, scales


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_scaler_step_makes_no_host_sync_and_matches_torch_optim(name):
    kwargs = dict(lr=1e-2, momentum=0.9) if name == "SGD" else dict(lr=1e-2)
    overflow = {0, 5}
    ours_model, ours, ours_scales = _scaled_training(
        lambda p: getattr(syncfree, name)(p, **kwargs), overflow, host_syncs_raise
    )
    ref_model, ref, ref_scales = _scaled_training(
        lambda p: getattr(torch.optim, name)(p, **kwargs), overflow, contextlib.nullcontext
    )
    assert ours_scales == ref_scales and ours_scales[0] == 2.0**9  # the overflow backed off
    _assert_same(ours_model, ours, ref_model, ref)


# --- two ranks: all-reduce before unscale_ -----------------------------------------------------


def _amp_rank(rank):
    model = _model()
    optimizer = syncfree.AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler(init_scale=2.0**12)
    scales, params = [], []
    for step in range(6):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
        if step == 3 and rank == 1:
            x[0, 0] = float("inf")  # only rank 1 overflows
        optimizer.zero_grad()
        with autocast():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        xm.all_reduce(xm.REDUCE_SUM, xm._fetch_gradients(optimizer), scale=1.0 / xm.world_size())
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return scales, params


@pytest.mark.slow  # two spawned processes
def test_overflow_on_one_rank_is_skipped_on_every_rank():
    (scales0, params0), (scales1, params1) = run_ranks(_amp_rank, 2)
    assert scales0 == scales1 and scales0[3] == scales0[2] / 2  # both ranks saw the overflow
    for step in range(6):
        for a, b in zip(params0[step], params1[step]):
            assert torch.equal(a, b), f"replicas diverged at step {step}"
    assert all(torch.equal(a, b) for a, b in zip(params0[3], params0[2]))  # step 3 skipped
    assert not torch.equal(params0[4][0], params0[3][0])  # and training went on
