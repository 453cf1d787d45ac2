"""adam_step: the reference against torch.optim.Adam/AdamW, the Triton kernel against the reference.

Tolerances: the reference and torch.optim agree to float32 rounding (rtol 1e-5, atol 1e-6, the
formulas are reordered). The kernel and the reference both compute in float32; for float32
storage they agree to float32 rounding; for bfloat16/float16 storage a step may round a value to
the neighbouring representable number, so each step (run from the same state through both) is
compared to one unit in the last place: rtol 2**-7 (bfloat16), 2**-10 (float16), plus an atol
for results that cancel to near zero.
"""

import pytest
import torch

from accrewrite.kernels import adam

N_STEPS = 3
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.bfloat16: dict(rtol=2**-7, atol=1e-5),
    torch.float16: dict(rtol=2**-10, atol=1e-5),
}
SHAPES = [(3, 5), (1,), (2049,), (7, 11, 13), (0,), (20000,)]  # 20000 spans two kernel chunks


def _state(params, dtype=None):
    return (
        [torch.zeros_like(p, dtype=dtype) for p in params],
        [torch.zeros_like(p, dtype=dtype) for p in params],
        [torch.zeros((), dtype=torch.float32, device=p.device) for p in params],
    )


def _hyper(**overrides):
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                 decoupled_weight_decay=False, maximize=False)
    hyper.update(overrides)
    return hyper


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("maximize", [False, True])
def test_reference_matches_torch_optim(decoupled, maximize):
    torch.manual_seed(0)
    params = [torch.randn(s) for s in SHAPES]
    theirs = [p.clone().requires_grad_() for p in params]
    optimizer_class = torch.optim.AdamW if decoupled else torch.optim.Adam
    optimizer = optimizer_class(theirs, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                                maximize=maximize)
    exp_avgs, exp_avg_sqs, steps = _state(params)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        optimizer.step()
        adam.adam_step_reference(
            params, grads, exp_avgs, exp_avg_sqs, steps,
            **_hyper(beta1=0.8, beta2=0.99, eps=1e-6, decoupled_weight_decay=decoupled,
                     maximize=maximize),
        )
    for ours, p in zip(params, theirs):
        torch.testing.assert_close(ours, p.detach(), **TOL[torch.float32])
    for m, v, s, p in zip(exp_avgs, exp_avg_sqs, steps, theirs):
        torch.testing.assert_close(m, optimizer.state[p]["exp_avg"], **TOL[torch.float32])
        torch.testing.assert_close(v, optimizer.state[p]["exp_avg_sq"], **TOL[torch.float32])
        assert s.item() == optimizer.state[p]["step"].item() == 4


def _compare_steps(device, dtype, grad_scale=None, found_inf=None, state_dtype=None, **hyper):
    """Run N_STEPS steps; each one from the same state through the kernel and the reference."""
    torch.manual_seed(1)
    params = [torch.randn(s, device=device).to(dtype) for s in SHAPES]
    state = [params, *_state(params, state_dtype)]
    for _ in range(N_STEPS):
        grads = [torch.randn_like(p) for p in params]
        results = []
        for step_fn in (adam._adam_step_triton, adam.adam_step_reference):
            copy = [[t.clone() for t in tensors] for tensors in state]
            step_fn(copy[0], grads, *copy[1:], grad_scale=grad_scale, found_inf=found_inf,
                    **_hyper(**hyper))
            results.append(copy)
        for ours, theirs in zip(*results):
            for a, b in zip(ours, theirs):
                assert a.dtype == b.dtype
                torch.testing.assert_close(a, b, **TOL[dtype])
        state = results[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "hyper",
    [dict(), dict(decoupled_weight_decay=True), dict(maximize=True, weight_decay=0.0),
     dict(beta1=0.0)],
    ids=["adam", "adamw", "maximize", "no-momentum"],
)
def test_triton_matches_reference(device, dtype, hyper):
    _compare_steps(device, dtype, **hyper)


def test_triton_low_precision_params_with_float32_moments(device):
    _compare_steps(device, torch.bfloat16, state_dtype=torch.float32)


def test_triton_grad_scale_and_tensor_lr(device):
    _compare_steps(device, torch.float32, grad_scale=torch.tensor(1024.0, device=device),
                   lr=torch.tensor(3e-3, device=device))


# A skipped first step computes lr / (1 - beta1**0) for lanes that are all masked off; numpy (the
# interpreter) warns about that division, the GPU does not.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("step_fn", ["triton", "reference"])
def test_found_inf_skips_everything(device, step_fn):
    fn = adam._adam_step_triton if step_fn == "triton" else adam.adam_step_reference
    torch.manual_seed(2)
    params = [torch.randn(s, device=device) for s in SHAPES]
    before = [p.clone() for p in params]
    exp_avgs, exp_avg_sqs, steps = _state(params)
    grads = [torch.full_like(p, float("inf")) for p in params]
    fn(params, grads, exp_avgs, exp_avg_sqs, steps, found_inf=torch.ones((), device=device),
       grad_scale=torch.tensor(2.0, device=device), **_hyper())
    for p, b, m, v, s in zip(params, before, exp_avgs, exp_avg_sqs, steps):
        assert torch.equal(p, b)
        assert not m.any() and not v.any() and s.item() == 0
    # found_inf == 0: the same call updates, with the grads unscaled by grad_scale.
    grads = [torch.ones_like(p) for p in params]
    fn(params, grads, exp_avgs, exp_avg_sqs, steps, found_inf=torch.zeros((), device=device),
       grad_scale=torch.tensor(2.0, device=device), **_hyper(weight_decay=0.0))
    for p, b, m, s in zip(params, before, exp_avgs, steps):
        assert s.item() == 1
        torch.testing.assert_close(m, torch.full_like(m, 0.1 * 0.5))
        # first Adam step moves every element by lr (m_hat / sqrt(v_hat) = 1)
        torch.testing.assert_close(p, b - 1e-2, **TOL[torch.float32])


def test_triton_path_leaves_what_it_cannot_take_to_the_reference(device):
    torch.manual_seed(3)
    base = torch.randn(6, 8, device=device)
    # a non-dense view, a float64 tensor (no kernel dtype) and a plain one
    params = [base.t()[:, :3], torch.randn(4, device=device, dtype=torch.float64),
              torch.randn(5, device=device)]
    grads = [torch.randn_like(p) for p in params]
    expected = [p.clone() for p in params]
    adam.adam_step_reference(expected, grads, *_state(expected), **_hyper())
    adam._adam_step_triton(params, grads, *_state(params), **_hyper())
    for a, b in zip(params, expected):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_public_function_dispatches(monkeypatch):
    calls = []
    monkeypatch.setattr(adam, "_adam_step_triton", lambda *a, **k: calls.append("triton"))
    monkeypatch.setattr(adam, "adam_step_reference", lambda *a, **k: calls.append("reference"))
    args = ([torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)],
            [torch.zeros(())])
    for mode in ("triton", "reference", "auto"):
        monkeypatch.setenv("ACCREWRITE_KERNELS", mode)
        adam.adam_step(*args, **_hyper())
    assert calls == ["triton", "reference", "reference"]  # auto: CPU tensors take the reference


def test_bad_input_is_reported():
    p = [torch.zeros(3)]
    with pytest.raises(ValueError, match="same length"):
        adam.adam_step(p, [], [], [], [], **_hyper())
    with pytest.raises(ValueError, match="shape"):
        adam.adam_step(p, [torch.zeros(4)], [torch.zeros(3)], [torch.zeros(3)],
                       [torch.zeros(())], **_hyper())
    with pytest.raises(ValueError, match="scalar"):
        adam.adam_step(p, [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)],
                       [torch.zeros(2)], **_hyper())


@pytest.mark.parametrize("mode", ["triton", "reference"])
def test_complex_params_match_torch_optim(device, monkeypatch, mode):
    monkeypatch.setenv("ACCREWRITE_KERNELS", mode)
    torch.manual_seed(4)
    param = torch.randn(3, 4, dtype=torch.complex64, device=device)
    theirs = param.clone().requires_grad_()
    optimizer = torch.optim.Adam([theirs], lr=1e-2, weight_decay=0.1)
    exp_avgs, exp_avg_sqs, steps = _state([param])
    for _ in range(2):
        grad = torch.randn_like(param)
        theirs.grad = grad.clone()
        optimizer.step()
        adam.adam_step([param], [grad], exp_avgs, exp_avg_sqs, steps, **_hyper())
    torch.testing.assert_close(param, theirs.detach(), **TOL[torch.float32])


def test_reference_keeps_float64_precision():
    torch.manual_seed(5)
    param = torch.randn(10, dtype=torch.float64)
    theirs = param.clone().requires_grad_()
    optimizer = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1)
    exp_avgs, exp_avg_sqs, steps = _state([param])
    grad = torch.randn_like(param)
    theirs.grad = grad.clone()
    optimizer.step()
    adam.adam_step_reference([param], [grad], exp_avgs, exp_avg_sqs, steps,
                             **_hyper(decoupled_weight_decay=True))
    torch.testing.assert_close(param, theirs.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_builds_for_sm90():
    from _gpu_build import build_for_sm90

    signature = dict(table_ptr="*i64", n_tensors="i32", lr_ptr="*fp32", lr="fp32", beta1="fp32",
                     beta2="fp32", log2_beta1="fp32", log2_beta2="fp32", eps="fp32",
                     weight_decay="fp32", grad_scale_ptr="*fp32", found_inf_ptr="*fp32")
    builds = []
    for param, state, extras in [("float32", "float32", False), ("bfloat16", "float32", True),
                                 ("float16", "float16", False)]:
        flags = dict(LR_IS_TENSOR=extras, DECOUPLED=not extras, MAXIMIZE=extras,
                     HAS_GRAD_SCALE=extras, HAS_FOUND_INF=extras)
        builds.append(("_adam_kernel", signature,
                       dict(flags, PARAM_TY=f"tl.{param}", GRAD_TY=f"tl.{param}",
                            STATE_TY=f"tl.{state}", CHUNK=adam._CHUNK, BLOCK=adam._BLOCK), 4))
    assert build_for_sm90("accrewrite.kernels.adam", builds) == [""] * len(builds)


@pytest.mark.parametrize("mode", ["reference", "triton"])
def test_operator_declares_what_it_updates(monkeypatch, mode):
    """opcheck's schema test runs the op and fails if it updates an input that its schema does
    not declare as mutated (or declares one it leaves alone)."""
    monkeypatch.setenv("ACCREWRITE_KERNELS", mode)
    params = [torch.randn(5), torch.randn(3, 2)]
    args = (params, [torch.randn_like(p) for p in params],
            [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
            [torch.zeros(()) for _ in params])
    kwargs = dict(lr=1e-2, lr_tensor=None, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                  decoupled_weight_decay=True, maximize=False, grad_scale=None, found_inf=None)
    torch.library.opcheck(adam.adam_step_op, args, kwargs,
                          test_utils=("test_schema", "test_faketensor"))
