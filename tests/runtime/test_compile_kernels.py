"""Kernel selection: the pass finds the patterns, lists each match and its choice, and the
accrewrite custom ops it can substitute agree with eager."""

import copy
import functools
import importlib
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import accrewrite.runtime.compiler  # noqa: F401  (registers the "accrewrite" backend)
from accrewrite.runtime.compiler.backend import Backend, accrewrite
from accrewrite.runtime.compiler.core.selection import select
from accrewrite.kernels.bias_dropout_add import bias_dropout_add_backward_op, bias_dropout_add_op
from accrewrite.kernels.layer_norm import layer_norm_backward_op, layer_norm_op
from accrewrite.kernels.quick_gelu import quick_gelu_backward_op, quick_gelu_op
from accrewrite.kernels.swin_fmha import swin_fmha_backward_op, swin_fmha_op
from accrewrite.runtime.compiler.cuda import triton_kernels as triton_implementations


pytestmark = pytest.mark.usefixtures("fresh_compiles")


class Tiny(nn.Module):
    """One layer norm and one QuickGELU written out, as CLIP does."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.ln = nn.LayerNorm(12, eps=1e-6)

    def forward(self, x):
        h = self.ln(self.fc(x))
        return h * torch.sigmoid(1.702 * h)


def run_step(model, *inputs):
    """Forward and backward; returns the output and the gradients (parameters and inputs)."""
    out = model(*inputs)
    out.square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    return out.detach(), grads + [x.grad for x in inputs if x.requires_grad]


def inputs():
    return torch.randn(3, 5, 12, requires_grad=True)  # odd sizes, 3-D


KERNELS = ("layer_norm", "quick_gelu", "bias_dropout_add", "swin_fmha")


def pattern_matches(backend):
    """The report's matches of the patterns, without its matmuls (``test_compile_matmul.py``)."""
    return [m for m in backend.report.matches if m.kernel != "matmul"]


def kernel_ops(codes):
    """The accrewrite custom ops called by the generated code of a compile."""
    source = "\n".join(codes)
    names = [op for kernel in KERNELS for op in (kernel, f"{kernel}_backward")]
    return {name for name in names if f"torch.ops.accrewrite.{name}.default" in source}


class WindowAttention(nn.Module):
    """Swin's attention probabilities from the scores ``attn`` (windows, heads, N, N), with the
    shifted windows' ``mask`` (windows per image, N, N) or without, the first view written as
    Swin's own code writes it (``B_ // nW``) or as timm's (``-1``)."""

    def __init__(self, heads=2, n=9, timm=False):
        super().__init__()
        self.relative_position_bias = nn.Parameter(torch.randn(heads, n, n))
        self.timm = timm

    def forward(self, attn, mask=None):
        b_, heads, n, _ = attn.shape
        attn = attn + self.relative_position_bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            images = -1 if self.timm else b_ // nw
            attn = attn.view(images, nw, heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, heads, n, n)
        return torch.softmax(attn, dim=-1)


class Swin(nn.Module):
    """Unshifted and shifted window attention (each form of the view)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            [WindowAttention(), WindowAttention(), WindowAttention(timm=True)]
        )

    def forward(self, attn, mask):
        plain, shifted, timm = self.blocks
        return plain(attn) + shifted(attn, mask) + timm(attn, mask)


def swin_inputs():
    return torch.randn(6, 2, 9, 9, requires_grad=True), torch.randn(3, 9, 9)  # 2 images


P, P_NO_BIAS = 0.1, 0.3
# where the residual is in the sum
ORDERS = pytest.mark.parametrize("residual_first", [True, False], ids=["r+dropout", "dropout+r"])


class DropoutAdd(nn.Module):
    """Residual dropout as Megatron writes it, with an explicit bias, and as most models do,
    after a Linear (whose bias is inside its matmul): here without a bias, at another rate; the
    residual first in the sum or last. The outputs show the masks: each is residual + kept
    (x + bias) / (1 - p)."""

    def __init__(self, d=64, residual_first=True):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(d))
        self.residual_first = residual_first

    def forward(self, x, residual, y, residual2):
        def add(residual, dropped):
            return residual + dropped if self.residual_first else dropped + residual

        return (
            add(residual, F.dropout(x + self.bias, P, self.training)),
            add(residual2, F.dropout(y, P_NO_BIAS, self.training)),
        )


def dropout_inputs(grad=True):
    return [torch.randn(32, 64, requires_grad=grad) for _ in range(4)]


class SwinAndDropoutAdd(nn.Module):
    """Both kinds in one graph: three Swin matches and two dropout-add ones."""

    def __init__(self, residual_first=True):
        super().__init__()
        self.swin = Swin()
        self.dropout = DropoutAdd(residual_first=residual_first)

    def forward(self, attn, mask, *dropout_inputs):
        return self.swin(attn, mask), *self.dropout(*dropout_inputs)


def test_on_cpu_auto_lists_each_match_and_leaves_it_to_inductor():
    backend = Backend(kernels="auto")
    model = torch.compile(Tiny(), backend=backend)
    _, codes = run_and_get_code(run_step, model, inputs())

    matches = pattern_matches(backend)
    assert sorted(m.kernel for m in matches) == ["layer_norm", "quick_gelu"]
    for m in matches:
        assert (m.shape, m.dtype, m.device, m.training) == ((3, 5, 12), torch.float32, "cpu", True)
        assert m.choice == "inductor" and "on cpu" in m.reason
    assert "layer_norm [3, 5, 12] float32 on cpu (training): inductor" in str(backend.report)
    assert kernel_ops(codes) == set()


@pytest.mark.slow
@ORDERS
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_on_cpu_auto_lists_dropout_add_and_swin_matches(training, residual_first):
    backend = Backend(kernels="auto")
    # in train mode, so that the inference graph has dropout too
    model = torch.compile(SwinAndDropoutAdd(residual_first), backend=backend)

    def step():
        outs = model(*swin_inputs(), *dropout_inputs(training))
        if training:
            sum(out.sum() for out in outs).backward()

    with torch.set_grad_enabled(training):
        _, codes = run_and_get_code(step)

    matches = sorted(backend.report.matches, key=lambda m: m.kernel)
    assert [(m.kernel, m.shape) for m in matches] == [
        ("bias_dropout_add", (32, 64)), ("bias_dropout_add", (32, 64)),
    ] + [("swin_fmha", (6, 2, 9, 9))] * 3
    for m in matches:
        assert (m.dtype, m.device, m.training) == (torch.float32, "cpu", training)
        assert m.choice == "inductor" and "on cpu" in m.reason
    phase = "training" if training else "inference"
    assert f"swin_fmha [6, 2, 9, 9] float32 on cpu ({phase}): inductor" in str(backend.report)
    assert kernel_ops(codes) == set()


def test_forced_kernels_replace_the_patterns_and_match_eager():
    torch.manual_seed(0)
    eager = Tiny()
    compiled = Tiny()
    compiled.load_state_dict(eager.state_dict())
    x = inputs()
    x2 = x.detach().clone().requires_grad_()

    # through the registered backend name, as a user of torch.compile would
    model = torch.compile(compiled, backend="accrewrite", options={"kernels": "accrewrite"})
    (out, grads), codes = run_and_get_code(run_step, model, x2)
    expected, expected_grads = run_step(eager, x)

    assert kernel_ops(codes) == {
        "layer_norm", "layer_norm_backward", "quick_gelu", "quick_gelu_backward"
    }
    # the model's eps (1e-6), not the pattern's example value (1e-5), reaches the kernel
    assert "torch.ops.accrewrite.layer_norm.default(" in "".join(codes)
    assert "1e-06)" in "".join(codes) and "1e-05)" not in "".join(codes)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)


def test_forced_kernels_in_an_inference_graph():
    backend = Backend(kernels="accrewrite")
    model = torch.compile(Tiny(), backend=backend)
    x = torch.randn(7, 12)
    with torch.no_grad():
        out, codes = run_and_get_code(model, x)
        expected = model._orig_mod(x)

    assert kernel_ops(codes) == {"layer_norm", "quick_gelu"}
    assert sorted((m.kernel, m.training, m.choice) for m in pattern_matches(backend)) == [
        ("layer_norm", False, "triton"),
        ("quick_gelu", False, "triton"),
    ]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_forced_swin_fmha_matches_eager():
    torch.manual_seed(0)
    eager = Swin()
    compiled = copy.deepcopy(eager)
    attn, mask = swin_inputs()
    attn2 = attn.detach().clone().requires_grad_()

    backend = Backend(kernels="accrewrite")
    model = torch.compile(compiled, backend=backend)
    (out, grads), codes = run_and_get_code(run_step, model, attn2, mask)
    expected, expected_grads = run_step(eager, attn, mask)

    assert kernel_ops(codes) == {"swin_fmha", "swin_fmha_backward"}
    assert [m.choice for m in backend.report.matches] == ["triton"] * 3
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)

    # Another batch size recompiles with a symbolic image count: the views still match.
    attn = torch.randn(9, 2, 9, 9)
    torch.testing.assert_close(model(attn, mask), eager(attn, mask), rtol=1e-5, atol=1e-5)
    later = backend.report.matches[3:]
    assert [m.choice for m in later] == ["triton"] * 3
    assert all(isinstance(m.shape[0], torch.SymInt) for m in later)


def test_forced_swin_fmha_matches_with_symbolic_windows_per_image():
    """Under dynamic=True the window count and the windows per image are two symbols; both
    forms of the view still match, and one compile serves both resolutions."""
    torch.manual_seed(0)
    eager = Swin()
    compiled = copy.deepcopy(eager)
    backend = Backend(kernels="accrewrite")
    model = torch.compile(compiled, backend=backend, dynamic=True)
    for windows, per_image in ((6, 3), (20, 5)):
        attn = torch.randn(windows, 2, 9, 9, requires_grad=True)
        attn2 = attn.detach().clone().requires_grad_()
        mask = torch.randn(per_image, 9, 9)
        for m in (eager, compiled):
            m.zero_grad(set_to_none=True)
        out, grads = run_step(model, attn2, mask)
        expected, expected_grads = run_step(eager, attn, mask)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)

    assert [m.choice for m in backend.report.matches] == ["triton"] * 3
    assert all(isinstance(m.shape[0], torch.SymInt) for m in backend.report.matches)


class WindowsGroupedTheOtherWay(nn.Module):
    """(windows per image, images) instead of Swin's (images, windows per image): with one
    image the mask broadcasts over a new axis, so this is not Swin's masked attention."""

    def __init__(self, heads=2, n=9):
        super().__init__()
        self.relative_position_bias = nn.Parameter(torch.randn(heads, n, n))

    def forward(self, attn, mask):
        _, heads, n, _ = attn.shape
        scores = (attn + self.relative_position_bias.unsqueeze(0)).view(mask.shape[0], -1, heads, n, n)
        scores = scores + mask.unsqueeze(1).unsqueeze(0)
        return torch.softmax(scores.view(-1, heads, n, n), dim=-1)


def test_a_view_that_is_not_swins_is_not_matched():
    attn, mask = torch.randn(3, 2, 9, 9), torch.randn(3, 9, 9)
    backend = Backend(kernels="accrewrite")
    model = WindowsGroupedTheOtherWay()
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(attn, mask)
        torch.testing.assert_close(out, model(attn, mask))
    assert out.shape == (9, 2, 9, 9) and backend.report.matches == []


@ORDERS
def test_forced_bias_dropout_add_draws_one_mask_per_step_for_forward_and_backward(residual_first):
    """Dropout cannot match eager element by element (another generator), so the test checks
    what the outputs and gradients show of the mask: kept elements are exactly (x + bias) /
    (1 - p), the backward keeps the forward's elements, a step draws a new mask, and the kept
    fraction is 1 - p within 5 binomial standard deviations."""
    torch.manual_seed(0)
    backend = Backend(kernels="accrewrite")
    module = DropoutAdd(residual_first=residual_first)
    model = torch.compile(module, backend=backend)

    @torch.no_grad()
    def masks(step_inputs, outs):
        """The keep masks that the outputs show, checked."""
        x, residual, y, residual2 = step_inputs
        keeps = []
        for out, h, r, p in ((outs[0], x + module.bias, residual, P),
                             (outs[1], y, residual2, P_NO_BIAS)):
            keep = out != r
            torch.testing.assert_close(out[keep], (r + h / (1 - p))[keep])
            sigma = (p * (1 - p) / keep.numel()) ** 0.5
            assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma
            keeps.append(keep.float())
        return keeps

    def step(inputs):
        outs = model(*inputs)
        sum(out.sum() for out in outs).backward()
        keep, keep2 = masks(inputs, outs)
        x, residual, y, residual2 = inputs
        # the backward keeps what the forward kept: d out / d x = keep / (1 - p)
        torch.testing.assert_close(x.grad, keep / (1 - P))
        torch.testing.assert_close(y.grad, keep2 / (1 - P_NO_BIAS))
        torch.testing.assert_close(residual.grad, torch.ones_like(residual))
        return keep, keep2

    (first, first2), codes = run_and_get_code(step, dropout_inputs())
    second, second2 = step(dropout_inputs())  # the same compiled code
    assert kernel_ops(codes) == {"bias_dropout_add", "bias_dropout_add_backward"}
    assert not torch.equal(first, second) and not torch.equal(first2, second2)
    torch.testing.assert_close(module.bias.grad, (first + second).sum(0) / (1 - P))

    with torch.no_grad():  # an inference graph, the module still in train mode
        inputs = dropout_inputs(grad=False)
        outs, codes = run_and_get_code(model, *inputs)
        masks(inputs, outs)
    assert kernel_ops(codes) == {"bias_dropout_add"}
    assert sorted((m.training, m.choice) for m in backend.report.matches) == (
        [(False, "triton")] * 2 + [(True, "triton")] * 2
    )


def choose(op, x, policy):
    """(the implementation's name, why) for ``op`` with ``x`` as its main input."""
    args = {"x": x, "weight": None, "bias": None, "eps": 1e-5, "residual": x, "p": 0.1}
    implementation, reason = select(op, {"attn": x, **args} if op == "swin_fmha" else args, policy)
    return implementation.name, reason


def test_choice_by_policy_device_and_shape(monkeypatch):
    x = torch.empty(4, 8)
    assert choose("layer_norm", x, "accrewrite") == ("triton", "kernels='accrewrite'")
    assert choose("layer_norm", x, "inductor") == ("inductor", "kernels='inductor'")
    assert choose("layer_norm", x, "auto") == (
        "inductor", "on cpu the kernel is its PyTorch reference"
    )

    # On CUDA: layer norm by hidden size, pointwise kernels left to inductor's fusion.
    cuda = lambda *shape: torch.empty(*shape, device="meta").as_subclass(_Cuda)  # noqa: E731
    monkeypatch.setattr(triton_implementations, "triton_available", lambda: True)
    assert choose("layer_norm", cuda(8, 4096), "auto") == ("triton", "hidden size 4096 >= 4096")
    assert choose("layer_norm", cuda(8, 1024), "auto") == ("inductor", "hidden size 1024 < 4096")
    assert choose("quick_gelu", cuda(8, 8192), "auto")[0] == "inductor"
    assert choose("bias_dropout_add", cuda(8, 8192), "auto")[0] == "inductor"
    # Swin-T at batch 128: stages 1-3 have 8192 to 512 windows, stage 4 128; 7x7 windows
    bias = torch.empty(12, 49, 49, device="meta")
    swin = lambda attn: select(  # noqa: E731
        "swin_fmha", {"attn": attn, "relative_pos_bias": bias[: attn.shape[1]]}, "auto"
    )[0].name
    assert swin(cuda(512, 12, 49, 49)) == "triton"
    assert swin(cuda(128, 12, 49, 49)) == "inductor"
    monkeypatch.setattr(triton_implementations, "triton_available", lambda: False)
    assert choose("layer_norm", cuda(8, 4096), "auto") == (
        "inductor", "triton does not take it: triton is not installed"
    )


class _Cuda(torch.Tensor):
    """A meta tensor that says it lives on CUDA, to exercise the CUDA rules without a GPU."""

    @property
    def device(self):
        return torch.device("cuda")


class WideAndNarrow(nn.Module):
    """A layer norm on each side of the CUDA rule's hidden size, then a QuickGELU."""

    def __init__(self):
        super().__init__()
        self.wide, self.down, self.narrow = nn.LayerNorm(4096), nn.Linear(4096, 1024), nn.LayerNorm(1024)

    def forward(self, x):
        h = self.narrow(self.down(self.wide(x)))
        return h * torch.sigmoid(1.702 * h)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_auto_follows_the_rules_and_matches_eager():
    """The rules test_choice_by_policy_device_and_shape checks on fake CUDA tensors, on real
    ones: the Triton layer norm at hidden 4096, inductor's at 1024 and for QuickGELU."""
    torch.manual_seed(0)
    eager = WideAndNarrow().cuda()
    compiled = copy.deepcopy(eager)
    x = torch.randn(8, 4096, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    backend = Backend(kernels="auto")
    (out, grads), codes = run_and_get_code(run_step, torch.compile(compiled, backend=backend), x2)
    expected, expected_grads = run_step(eager, x)

    assert sorted((m.kernel, m.shape, m.choice) for m in pattern_matches(backend)) == [
        ("layer_norm", (8, 1024), "inductor"),
        ("layer_norm", (8, 4096), "triton"),
        ("quick_gelu", (8, 1024), "inductor"),
    ]
    assert kernel_ops(codes) == {"layer_norm", "layer_norm_backward"}
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-3, atol=1e-3)


def test_backend_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown accrewrite backend options"):
        accrewrite(None, [], options={"kernel": "auto"})
    with pytest.raises(ValueError, match="kernels='fast'"):
        accrewrite(None, [], options={"kernels": "fast"})


# --- the kernels' operators, as compiled graphs call them ---


def layer_norm(x, w, b, eps):
    return layer_norm_op(x, list(x.shape[-1:]), w, b, eps)[0]


def swin_fmha(attn, bias, mask):
    return swin_fmha_op(attn, bias, mask)[0]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_layer_norm_op_matches_torch(dtype, tol):
    x = torch.randn(2, 3, 7, dtype=dtype, requires_grad=True)
    w = torch.randn(7, dtype=dtype, requires_grad=True)
    b = torch.randn(7, dtype=dtype, requires_grad=True)
    out = layer_norm(x, w, b, 1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), grad)

    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    expected = F.layer_norm(xr, (7,), wr, br, 1e-5)
    expected_grads = torch.autograd.grad(expected, (xr, wr, br), grad.float())

    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
    for g, e in zip(got, expected_grads):
        torch.testing.assert_close(g.float(), e, rtol=tol, atol=tol * 10)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
def test_ops_on_the_triton_path_match_torch(kernel):
    """The ops run the kernels' Triton code, forward and backward. On CPU the Triton interpreter runs them, in a fresh
    process: triton fixes the interpreter setting when it is first imported (inductor imports
    it), so it cannot be switched on in a process that has already compiled something."""
    pytest.importorskip("triton")
    env = dict(os.environ, ACCREWRITE_KERNELS="triton")
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
        f"import test_compile_kernels as t; t.check_triton_path({kernel!r})"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"{kernel}: triton path ok"


def check_triton_path(kernel):
    """Run ``kernel``'s op on the Triton path and compare it with torch (outputs, gradients)."""
    module = importlib.import_module(f"accrewrite.kernels.{kernel}")
    setattr(module, f"{kernel}_reference", _must_not_run)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args, op, reference = _triton_case(kernel, module, device)
    out = op(*args)
    grad = torch.randn_like(out)
    expected = reference(*args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        torch.autograd.grad(out, args, grad),
        torch.autograd.grad(expected, args, grad),
        rtol=1e-4,
        atol=1e-4,
    )
    print(f"{kernel}: triton path ok")


def _triton_case(kernel, module, device):
    """(differentiable inputs, ``kernel``'s op on them, the PyTorch reference) for
    :func:`check_triton_path`."""
    randn = functools.partial(torch.randn, device=device, requires_grad=True)
    x = randn(3, 33)
    if kernel == "layer_norm":

        def op(x, w, b):
            return layer_norm(x, w, b, 1e-5)

        def reference(x, w, b):
            return F.layer_norm(x, (33,), w, b, 1e-5)

        return (x, randn(33), randn(33)), op, reference
    if kernel == "quick_gelu":
        return (x,), quick_gelu_op, lambda x: x * torch.sigmoid(1.702 * x)
    if kernel == "swin_fmha":
        mask = torch.randn(3, 9, 9, device=device)

        def op(attn, bias):
            return swin_fmha(attn, bias, mask)

        def reference(attn, bias):  # WindowAttention.forward with a given bias
            scores = (attn + bias.unsqueeze(0)).view(2, 3, 2, 9, 9)
            scores = scores + mask.unsqueeze(1).unsqueeze(0)
            return torch.softmax(scores.view(6, 2, 9, 9), dim=-1)

        return (randn(6, 2, 9, 9), randn(2, 9, 9)), op, reference
    # bias_dropout_add: the reference applies the mask that the op's output shows; a seed tensor
    # (the op's) and the same int seed (the kernel's own argument) draw the same mask
    p, seed = 0.3, 1234
    b, r = randn(33), randn(3, 33)

    def op(x, b, r):
        return bias_dropout_add_op(x, b, r, p, torch.tensor(seed, device=device))

    with torch.no_grad():
        out = op(x, b, r)
        assert torch.equal(out, module.bias_dropout_add(x, b, r, p, seed=seed))
        keep = out != r
        assert keep.any() and not keep.all()
    return (x, b, r), op, lambda x, b, r: r + (x + b) * keep / (1 - p)


def _must_not_run(*args, **kwargs):
    raise AssertionError("the reference ran instead of the Triton kernel")


def test_quick_gelu_op_matches_torch():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(quick_gelu_op(x), x * torch.sigmoid(1.702 * x))
    assert torch.autograd.gradcheck(quick_gelu_op, (x,))


def t(*shape, grad=False):
    return torch.randn(*shape, requires_grad=grad)


def seed():
    return torch.tensor(7)


@pytest.mark.parametrize(
    "op, args",
    [
        (layer_norm_op, lambda: (t(3, 6, grad=True), [6], t(6, grad=True), t(6, grad=True), 1e-5)),
        (layer_norm_op, lambda: (t(3, 2, 3, grad=True), [2, 3], None, None, 1e-5)),
        (layer_norm_backward_op,
         lambda: (t(3, 6), t(3, 6), [6], t(6), t(6), t(3), t(3).abs())),
        (quick_gelu_op, lambda: (t(3, 6, grad=True),)),
        (quick_gelu_backward_op, lambda: (t(3, 6), t(3, 6))),
        (bias_dropout_add_op,
         lambda: (t(3, 6, grad=True), t(6, grad=True), t(3, 6, grad=True), 0.3, seed())),
        (bias_dropout_add_op, lambda: (t(3, 6, grad=True), None, t(3, 6), 0.3, seed())),
        (bias_dropout_add_backward_op, lambda: (t(3, 6), 0.3, seed(), torch.float32)),
        (swin_fmha_op, lambda: (t(4, 2, 5, 5, grad=True), t(2, 5, 5, grad=True), t(2, 5, 5))),
        (swin_fmha_op, lambda: (t(4, 2, 5, 5, grad=True), t(2, 5, 5, grad=True), None)),
        (swin_fmha_backward_op, lambda: (t(4, 2, 5, 5), t(4, 2, 5, 5), t(2, 5, 5), None, t(4, 2, 5))),
    ],
    ids=[
        "layer_norm", "layer_norm_2d_no_affine", "layer_norm_backward", "quick_gelu",
        "quick_gelu_backward", "bias_dropout_add", "dropout_add", "bias_dropout_add_backward",
        "swin_fmha_masked", "swin_fmha", "swin_fmha_backward",
    ],
)
def test_custom_op_registration(op, args):
    """Schema, fake implementation (what inductor plans with) and autograd registration."""
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(op, args(), test_utils=checks)
