"""Matmul selection on the CPU (compiler/cpu/onednn.py): oneDNN's GEMM equals ATen's over odd
shapes and layouts, the selector follows the measured rule, and a compiled layer runs its forward,
input-gradient and weight-gradient matmuls on oneDNN, each with a row-major left operand, with
eager's results."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn
from torch._inductor.utils import run_and_get_code

from torch._subclasses.fake_tensor import FakeTensorMode

from accrewrite.runtime.compiler.backend import Backend
from accrewrite.runtime.compiler.core.selection import select
from accrewrite.runtime.compiler.cpu import onednn  # noqa: F401  (defines the op)

ONEDNN = "torch.ops.accrewrite.onednn_matmul.default("


def operands(m, k, n, layout, bias):
    """(a, b, bias) of an (m, k) @ (k, n) product; ``layout`` says how a and b lie in memory."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k + 3, generator=g)[:, :k]  # rows further apart than k
    if layout == "b transposed":  # a linear layer's forward: x @ weight.t()
        b = torch.randn(n, k, generator=g).t()
    elif layout == "b strided":
        b = torch.randn(2 * k, 2 * n, generator=g)[::2, ::2]
    else:
        b = torch.randn(k, n, generator=g)
    if layout == "a transposed":  # a weight gradient: grad.t() @ x
        a = torch.randn(k, m, generator=g).t()
    return a, b, torch.randn(n, generator=g) if bias else None


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 13, 5), (33, 257, 129), (130, 64, 300)])
@pytest.mark.parametrize("layout", ["row-major", "b transposed", "b strided", "a transposed"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_onednn_matmul_equals_atens(m, k, n, layout, bias):
    a, b, c = operands(m, k, n, layout, bias)
    out = torch.ops.accrewrite.onednn_matmul(a, b, c)
    expected = a.double() @ b.double() + (0 if c is None else c.double())
    assert out.shape == (m, n) and out.is_contiguous()
    torch.testing.assert_close(out, expected.float(), rtol=1e-5, atol=1e-5 * k**0.5)


_FAKE = FakeTensorMode()


def fake(*shape, dtype=torch.float32, transposed=False):
    """A fake CPU tensor, as the pass sees a graph's values."""
    with _FAKE:
        if transposed:
            return torch.empty(*reversed(shape), dtype=dtype).t()
        return torch.empty(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "a, b, bias, policy, expected",
    [
        (fake(2048, 256), fake(256, 768), fake(768), "auto", "onednn"),
        (fake(16, 1024), fake(1024, 1024, transposed=True), None, "auto", "onednn"),
        # a weight gradient: the pass copies the left operand row-major
        (fake(256, 2048, transposed=True), fake(2048, 1024), None, "auto", "onednn"),
        (fake(8192, 1024), fake(1024, 32), None, "auto",
         "aten: slower than ATen's with K or N under 256"),
        (fake(128, 256), fake(256, 256), None, "auto", "aten: slower than ATen's under 32 MFLOP"),
        (fake(2048, 256, dtype=torch.bfloat16), fake(256, 768, dtype=torch.bfloat16), None,
         "auto", "aten: onednn does not take it: bfloat16, not float32"),
        (fake(2048, 256), fake(256, 768), fake(1, 768), "auto",
         "aten: onednn does not take it: bias [1, 768] is not a contiguous vector over the "
         "columns"),
        (fake(3, 0), fake(0, 768), None, "accrewrite",
         "aten: onednn does not take it: K or N is 0"),
        (fake(3, 5, transposed=True), fake(5, 2), None, "accrewrite", "onednn"),
        (fake(2048, 256), fake(256, 768), None, "inductor", "aten"),
    ],
)
def test_choose(a, b, bias, policy, expected):
    """The measured rule under "auto" (on any CPU), what oneDNN cannot take, and the forced
    policies."""
    implementation, reason = select("matmul", {"a": a, "b": b, "bias": bias}, policy)
    assert implementation.name == expected.split(":")[0]
    if ":" in expected:
        assert f"{implementation.name}: {reason}" == expected


def test_choose_respects_onednn_turned_off():
    with torch.backends.mkldnn.flags(enabled=False):
        implementation, reason = select(
            "matmul", {"a": fake(2048, 256), "b": fake(256, 768), "bias": None}, "accrewrite"
        )
    assert (implementation.name, reason) == (
        "aten",
        "onednn does not take it: oneDNN is turned off (torch.backends.mkldnn.enabled)",
    )


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(256, 512), nn.Linear(512, 256)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))


def onednn_calls(fn) -> tuple[list, int]:
    """While ``fn`` runs: the shape of each left operand that oneDNN's op gets, and how many
    copies of its operands the op makes itself (of a left operand that is not row-major)."""
    with torch.profiler.profile(record_shapes=True) as profile:
        fn()

    def inside(event):
        if event is None:
            return False
        return event.name == "mkldnn::_linear_pointwise" or inside(event.cpu_parent)

    events = profile.events()
    lefts = [e.input_shapes[0] for e in events if e.name == "mkldnn::_linear_pointwise"]
    return lefts, sum(e.name == "aten::copy_" and inside(e.cpu_parent) for e in events)


@pytest.mark.usefixtures("fresh_compiles")
def test_a_compiled_layer_runs_its_matmuls_on_onednn_with_row_major_left_operands():
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(1024, 256)
    backend = Backend()
    compiled = torch.compile(model, backend=backend)

    def step(fn):
        out = fn(x)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        return out.detach(), grads

    (out, grads), codes = run_and_get_code(step, compiled)

    # forward: both layers; backward: the input gradient of out (fc's input needs none) and both
    # weight gradients (grad.t() @ input): out's from a row-major copy of its grad.t() (256 x
    # 1024), fc's computed transposed, from a copy of its input.t() (256 x 1024)
    assert [(m.shape, m.choice) for m in backend.report.matches] == [
        ((1024, 256, 512), "onednn"),
        ((1024, 512, 256), "onednn"),
        ((1024, 256, 512), "onednn"),
        ((256, 1024, 512), "onednn"),
        ((512, 1024, 256), "onednn"),
    ]
    assert (
        "kernel selection: 2x matmul [1024, 256, 512] float32 on cpu (training): onednn "
        "(oneDNN's GEMM: 6-16% faster than MKL's where measured (AMD CPUs))" in str(backend.report)
    )
    forward, backward = codes
    assert forward.count(ONEDNN) == 2 and "extern_kernels.addmm(" not in forward
    assert backward.count(ONEDNN) == 3 and "extern_kernels.mm(" not in backward
    expected, expected_grads = step(model)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-4)
    # oneDNN is handed the copies that the graph makes, not views for ATen to copy
    lefts, copies = onednn_calls(lambda: step(compiled))
    assert len(lefts) == 5 and copies == 0


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize(
    "m, n, bias, left",
    [
        (96, 512, False, [96, 300]),  # a copied: 96 x 300 < 512 x 300 + 96 x 512
        (512, 80, False, [80, 300]),  # the product transposed: b^T (80 x 300) copied
        (512, 80, True, [512, 300]),  # with a bias: a copied
    ],
)
def test_a_transposed_left_operand_is_copied_the_cheaper_way(m, n, bias, left):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, m, generator=g).t(), torch.randn(300, n, generator=g)
    c = torch.randn(n, generator=g) if bias else None

    def product(a, b, c):
        return a @ b if c is None else torch.addmm(c, a, b)

    compiled = torch.compile(product, backend=Backend(kernels="accrewrite"), dynamic=False)
    torch.testing.assert_close(compiled(a, b, c), product(a, b, c), rtol=1e-5, atol=1e-4)
    assert onednn_calls(lambda: compiled(a, b, c)) == ([left], 0)


@pytest.mark.usefixtures("fresh_compiles")
def test_with_dynamic_shapes_the_rows_are_not_counted():
    torch.manual_seed(0)
    model = MLP()
    backend = Backend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (5, 300):  # one graph for both, chosen with M symbolic
            x = torch.randn(rows, 256)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)

    fc, out = backend.report.matches
    assert isinstance(fc.shape[0], torch.SymInt) and fc.shape[1:] == (256, 512)
    assert (fc.choice, out.choice) == ("onednn", "onednn")
