"""memory_budget: a lower budget makes the compiled forward keep less for the backward."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from accrewrite.runtime import compile


pytestmark = pytest.mark.usefixtures("fresh_compiles")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )


def forward_saving(model, x):
    """The output of ``model(x)`` and the bytes its forward saved for the backward, not
    counting the inputs and parameters saved by reference (they are alive anyway). AOTAutograd
    partitions, and so decides what to save, when it compiles the forward."""
    alive = {t.untyped_storage().data_ptr() for t in [x, *model.parameters()]}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in alive:
            saved.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return out, sum(saved)


@pytest.mark.parametrize("budget", [-0.1, 1.01, True, "half"])
def test_budget_outside_zero_one_is_rejected(budget):
    with pytest.raises(ValueError, match="memory_budget"):
        compile(mlp(), memory_budget=budget)


@pytest.mark.slow
def test_lower_budget_saves_less_and_computes_the_same():
    x = torch.randn(128, 16)
    eager_model, low = mlp(), compile(mlp(), memory_budget=0.0)
    expected, eager = forward_saving(eager_model, x)
    _, default = forward_saving(compile(mlp()), x)
    out, minimal = forward_saving(low, x)

    # The default min-cut plan already recomputes the pointwise ops that eager saves; a zero
    # budget also recomputes the matmuls and keeps (almost) nothing but the inputs.
    assert default < eager
    assert minimal < default

    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(low.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
