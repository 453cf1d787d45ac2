"""Cross-entropy by accrewrite's C++ kernel (compiler/cpu/cross_entropy.py, cpu_kernels.cpp) and
its choice by kernel selection: the kernel equals ``F.cross_entropy`` (loss, gradient and the
gradient's column sums) over odd shapes, ignored targets and strided logits; on the CPU
``kernels="auto"`` replaces inductor's code for rows of many classes, and the bias gradient of
the linear layer before it comes from the kernel's column sums; other cross-entropies (few
classes, a weight, label smoothing, another reduction or ignore_index, bfloat16) stay
inductor's."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from accrewrite.runtime.compiler.cpu import cross_entropy
from accrewrite.runtime.compiler.backend import Backend


def logits_and_target(rows, classes, ignored=0):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, classes, generator=g) * 3
    target = torch.randint(0, classes, (rows,), generator=g)
    target[:ignored] = -100
    return logits, target


@pytest.mark.parametrize(
    "rows, classes, ignored",
    [(1, 1, 0), (7, 5, 2), (33, 17, 0), (64, 1000, 10), (300, 4099, 1), (4, 6, 4)],
    ids=lambda v: str(v),
)
def test_kernel_equals_torchs_cross_entropy(rows, classes, ignored):
    logits, target = logits_and_target(rows, classes, ignored)
    loss, lse = cross_entropy.cross_entropy(logits, target, -100)
    grad_logits, column_sum = cross_entropy.cross_entropy_backward(
        torch.tensor(0.7), logits, target, lse, -100
    )

    x = logits.clone().requires_grad_()
    expected = F.cross_entropy(x, target)
    (expected_grad,) = torch.autograd.grad(expected * 0.7, x)
    torch.testing.assert_close(loss, expected, equal_nan=True)  # all ignored: nan, as torch
    torch.testing.assert_close(lse, torch.logsumexp(logits, 1))
    torch.testing.assert_close(grad_logits, expected_grad)
    torch.testing.assert_close(column_sum, expected_grad.sum(0))


def test_strided_logits():
    logits, target = logits_and_target(9, 40, 1)
    wide = torch.randn(9, 50)
    wide[:, 5:45] = logits
    for strided in (wide[:, 5:45], logits.t().contiguous().t()):  # row stride 50; columns
        x = strided.clone().requires_grad_()
        loss, lse = cross_entropy.cross_entropy(strided, target, -100)
        grad_logits, _ = cross_entropy.cross_entropy_backward(
            torch.tensor(1.0), strided, target, lse, -100
        )
        expected = F.cross_entropy(x, target)
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(grad_logits, torch.autograd.grad(expected, x)[0])


def test_a_target_out_of_bounds_is_an_error_not_a_crash():
    logits, target = logits_and_target(5, 7)
    _, lse = cross_entropy.cross_entropy(logits, target, -100)
    target[3] = 7
    with pytest.raises(RuntimeError, match="target 7 is out of bounds"):
        cross_entropy.cross_entropy(logits, target, -100)
    target[3] = -2
    with pytest.raises(RuntimeError, match="target -2 is out of bounds"):
        cross_entropy.cross_entropy_backward(torch.ones(()), logits, target, lse, -100)


@pytest.mark.parametrize(
    "args, message",
    [((torch.ones(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.long)), "float32"),
     ((torch.ones(2, 3, 4), torch.zeros(2, dtype=torch.long)), "(rows, classes)"),
     ((torch.ones(2, 3), torch.zeros(3, dtype=torch.long)), "(rows, classes)")],
    ids=["float64", "3d", "rows differ"],
)
def test_kernel_rejects_what_it_does_not_compute(args, message):
    with pytest.raises(ValueError, match=message):
        cross_entropy.cross_entropy(*args, -100)


class Head(torch.nn.Module):
    """A language model's last layer and loss: logits over ``classes`` for each token."""

    def __init__(self, classes, loss=F.cross_entropy):
        super().__init__()
        self.linear = torch.nn.Linear(16, classes)
        self.loss = loss

    def forward(self, x, target):
        return self.loss(self.linear(x).flatten(0, 1), target.flatten())


def compile_and_run(head, kernels="auto", dtype=torch.float32):
    """(loss, gradients of x and of the head's parameters, backward graph code, eager loss and
    gradients, kernel-selection matches)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 11, 16, generator=g, dtype=dtype, requires_grad=True)
    target = torch.randint(0, head.linear.out_features, (3, 11), generator=g)
    target[0, :2] = -100
    head = head.to(dtype)

    def loss_and_grads(fn):
        loss = fn(x, target)
        return loss, torch.autograd.grad(loss, (x, *head.parameters()))

    backend = Backend(kernels=kernels)
    (loss, grads), codes = run_and_get_code(
        loss_and_grads, torch.compile(head, backend=backend)
    )
    expected, expected_grads = loss_and_grads(head)
    return loss, grads, codes[-1], expected, expected_grads, backend.report.matches


@pytest.mark.usefixtures("fresh_compiles")
def test_on_cpu_auto_runs_a_vocabulary_cross_entropy_on_the_kernel():
    loss, grads, backward, expected, expected_grads, matches = compile_and_run(Head(1500))

    assert [str(m) for m in matches if m.kernel == "cross_entropy"] == [
        "cross_entropy [33, 1500] float32 on cpu (training): cpp "
        "(accrewrite's C++ kernel: fewer passes over the logits than inductor's)"
    ]
    assert "torch.ops.accrewrite.cross_entropy_backward.default(" in backward
    # the bias gradient is the kernel's column sums: inductor sums nothing in the backward
    assert "sum" not in "".join(line for line in backward.splitlines() if "cpp_fused" in line)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grads, expected_grads)


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize(
    "classes, kernels, dtype, reason",
    [(10, "auto", torch.float32, "10 classes, under the 1024 it is measured at"),
     (1500, "accrewrite", torch.bfloat16, "cpp does not take it: bfloat16, not float32"),
     (1500, "inductor", torch.float32, "kernels='inductor'")],
    ids=["few classes", "bfloat16", "kernels=inductor"],
)
@pytest.mark.slow
def test_cross_entropy_left_to_inductor_says_why(classes, kernels, dtype, reason):
    loss, grads, backward, expected, expected_grads, matches = compile_and_run(
        Head(classes), kernels, dtype
    )

    (match,) = [m for m in matches if m.kernel == "cross_entropy"]
    assert match.choice == "inductor" and reason in match.reason
    assert "accrewrite.cross_entropy" not in backward
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, expected, **tol)
    torch.testing.assert_close(grads, expected_grads, **tol)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiles")
def test_where_the_kernel_cannot_run_inductors_code_is_kept(monkeypatch):
    monkeypatch.setattr(cross_entropy, "unavailable", lambda: "RuntimeError: no C++ compiler")
    *_, matches = compile_and_run(Head(1500))
    assert [(m.choice, m.reason) for m in matches if m.kernel == "cross_entropy"] == [
        ("inductor", "cpp does not take it: RuntimeError: no C++ compiler")
    ]


OTHER_LOSSES = {
    "weight": lambda x, t: F.cross_entropy(x, t, weight=torch.linspace(0.5, 1.5, x.shape[1])),
    "label smoothing": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
    "sum": lambda x, t: F.cross_entropy(x, t, reduction="sum"),
    "ignore_index 0": lambda x, t: F.cross_entropy(x, t.clamp(min=0), ignore_index=0),
}


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("kind", OTHER_LOSSES)
def test_cross_entropy_the_kernel_does_not_compute_is_not_matched(kind):
    # kernels="accrewrite" would replace any match: none is made
    loss, grads, backward, expected, expected_grads, matches = compile_and_run(
        Head(1500, OTHER_LOSSES[kind]), "accrewrite"
    )
    assert [m for m in matches if m.kernel == "cross_entropy"] == []
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grads, expected_grads)
