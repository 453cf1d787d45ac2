"""Kernel selection: the pass finds the patterns, lists each match and its choice, and the
accrewrite custom ops it can substitute agree with eager."""

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
from accrewrite.runtime.compiler import ops
from accrewrite.runtime.compiler.backend import Backend, accrewrite
from accrewrite.runtime.compiler.kernel_selection import choose


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


def run_step(model, x):
    """Forward and backward; returns the output and the gradients (parameters and input)."""
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [p.grad for p in model.parameters()] + [x.grad]


def inputs():
    return torch.randn(3, 5, 12, requires_grad=True)  # odd sizes, 3-D


def kernel_ops(codes):
    """The accrewrite custom ops called by the generated code of a compile."""
    source = "\n".join(codes)
    names = ("layer_norm", "layer_norm_backward", "quick_gelu", "quick_gelu_backward")
    return {name for name in names if f"torch.ops.accrewrite.{name}.default" in source}


def test_on_cpu_auto_lists_each_match_and_leaves_it_to_inductor():
    backend = Backend(kernels="auto")
    model = torch.compile(Tiny(), backend=backend)
    _, codes = run_and_get_code(run_step, model, inputs())

    matches = backend.report.matches
    assert sorted(m.kernel for m in matches) == ["layer_norm", "quick_gelu"]
    for m in matches:
        assert (m.shape, m.dtype, m.device, m.training) == ((3, 5, 12), torch.float32, "cpu", True)
        assert m.choice == "inductor" and "on cpu" in m.reason
    assert "layer_norm [3, 5, 12] float32 on cpu (training): inductor" in str(backend.report)
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
    assert sorted((m.kernel, m.training, m.choice) for m in backend.report.matches) == [
        ("layer_norm", False, "accrewrite"),
        ("quick_gelu", False, "accrewrite"),
    ]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_choice_by_policy_device_and_shape(monkeypatch):
    x = torch.empty(4, 8, device="meta")
    assert choose("layer_norm", x, "accrewrite") == ("accrewrite", "kernels='accrewrite'")
    assert choose("layer_norm", x, "inductor") == ("inductor", "kernels='inductor'")
    assert choose("layer_norm", x, "auto")[0] == "inductor"  # not CUDA

    # On CUDA: layer norm by hidden size, pointwise kernels left to inductor's fusion.
    from accrewrite.runtime.compiler import kernel_selection

    cuda = lambda *shape: torch.empty(*shape, device="meta").as_subclass(_Cuda)  # noqa: E731
    monkeypatch.setattr(kernel_selection, "triton_available", lambda: True)
    assert choose("layer_norm", cuda(8, 4096), "auto")[0] == "accrewrite"
    assert choose("layer_norm", cuda(8, 1024), "auto")[0] == "inductor"
    assert choose("quick_gelu", cuda(8, 8192), "auto")[0] == "inductor"
    monkeypatch.setattr(kernel_selection, "triton_available", lambda: False)
    assert choose("layer_norm", cuda(8, 4096), "auto") == ("inductor", "triton is not installed")


class _Cuda(torch.Tensor):
    """A meta tensor that says it lives on CUDA, to exercise the CUDA rules without a GPU."""

    @property
    def device(self):
        return torch.device("cuda")


def test_backend_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown accrewrite backend options"):
        accrewrite(None, [], options={"kernel": "auto"})
    with pytest.raises(ValueError, match="kernels='fast'"):
        accrewrite(None, [], options={"kernels": "fast"})


# --- the custom ops themselves ---


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_layer_norm_op_matches_torch(dtype, tol):
    x = torch.randn(2, 3, 7, dtype=dtype, requires_grad=True)
    w = torch.randn(7, dtype=dtype, requires_grad=True)
    b = torch.randn(7, dtype=dtype, requires_grad=True)
    out = ops.layer_norm(x, w, b, 1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), grad)

    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    expected = F.layer_norm(xr, (7,), wr, br, 1e-5)
    expected_grads = torch.autograd.grad(expected, (xr, wr, br), grad.float())

    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
    for g, e in zip(got, expected_grads):
        torch.testing.assert_close(g.float(), e, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("kernel", ["layer_norm", "quick_gelu"])
def test_ops_on_the_triton_path_match_torch(kernel):
    """The ops run the kernels' Triton code and the generic backward differentiates through
    the kernel's own autograd.Function. On CPU the Triton interpreter runs them, in a fresh
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
    x = torch.randn(3, 33, device=device, requires_grad=True)
    if kernel == "layer_norm":
        w = torch.randn(33, device=device, requires_grad=True)
        b = torch.randn(33, device=device, requires_grad=True)
        args, reference = (x, w, b), lambda x, w, b: F.layer_norm(x, (33,), w, b, 1e-5)
        out = ops.layer_norm(x, w, b, 1e-5)
    else:
        args, reference = (x,), lambda x: x * torch.sigmoid(1.702 * x)
        out = ops.quick_gelu(x)
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


def _must_not_run(*args, **kwargs):
    raise AssertionError("the reference ran instead of the Triton kernel")


def test_quick_gelu_op_matches_torch():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ops.quick_gelu(x), x * torch.sigmoid(1.702 * x))
    assert torch.autograd.gradcheck(ops.quick_gelu, (x,))


def t(*shape, grad=False):
    return torch.randn(*shape, requires_grad=grad)


@pytest.mark.parametrize(
    "op, args",
    [
        (ops.layer_norm, lambda: (t(3, 6, grad=True), t(6, grad=True), t(6, grad=True), 1e-5)),
        (ops.layer_norm_backward, lambda: (t(3, 6), t(3, 6), t(6), t(6), 1e-5)),
        (ops.quick_gelu, lambda: (t(3, 6, grad=True),)),
        (ops.quick_gelu_backward, lambda: (t(3, 6), t(3, 6))),
    ],
    ids=["layer_norm", "layer_norm_backward", "quick_gelu", "quick_gelu_backward"],
)
def test_custom_op_registration(op, args):
    """Schema, fake implementation (what inductor plans with) and autograd registration."""
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(op, args(), test_utils=checks)
