"""kernels="autotune" (compiler/core/autotune.py): the implementations that take a match are
timed on its shapes, the fastest is chosen and named in the report, and the times are kept per
machine and shape, so that a later compile reads them instead of timing again. (What wins
depends on the machine: the tests check that the choice is the fastest measured, not which.)"""

import inspect
import json

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from accrewrite.runtime import compile
from accrewrite.runtime.compiler.backend import Backend
from accrewrite.runtime.compiler.core import autotune
from accrewrite.runtime.compiler.core.selection import select


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setenv(autotune.ENV, str(path))
    return path


def attention_args(tokens):
    with FakeTensorMode():
        q = torch.empty(1, 2, tokens, 16)
    return {"q": q, "k": q, "v": q}


def test_the_fastest_is_chosen_and_its_times_are_kept(cache, monkeypatch):
    implementation, reason = select("causal_attention", attention_args(40), "autotune")

    (key, times), = json.loads(cache.read_text()).items()
    assert "|causal_attention|" in key and "q=[1, 2, 40, 16]:float32:cpu" in key
    assert key.endswith("|training")
    assert sorted(times) == ["aten", "cpp"] and all(t > 0 for t in times.values())
    assert implementation.name == min(times, key=times.get)
    assert reason.startswith("autotuned: aten ") and ", cpp " in reason

    # a later compile on this machine reads the times
    monkeypatch.setattr(autotune, "_time", lambda *args: pytest.fail("timed again"))
    again, reason = select("causal_attention", attention_args(40), "autotune")
    assert again is implementation and reason.startswith("autotuned (cached): ")

    # another shape is timed on its own
    monkeypatch.undo()
    monkeypatch.setenv(autotune.ENV, str(cache))
    select("causal_attention", attention_args(24), "autotune", training=False)
    keys = sorted(json.loads(cache.read_text()))
    assert len(keys) == 2 and any("q=[1, 2, 24, 16]" in k and k.endswith("|inference") for k in keys)


def test_a_match_that_only_its_default_takes_is_not_timed(cache):
    args = attention_args(40)
    args["q"] = args["q"].double()  # the C++ kernel takes float32 only
    implementation, reason = select("causal_attention", args, "autotune")
    assert implementation.name == "aten" and "cpp does not take it" in reason
    assert not cache.exists()


def test_the_default_policy_is_the_rules():
    assert inspect.signature(compile).parameters["kernels"].default == "auto"
    assert Backend().kernels == "auto"


class Head(nn.Module):
    """Causal attention, then a language model's head and loss."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 1100)

    def forward(self, q, target):
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return F.cross_entropy(self.head(y).flatten(0, 2), target)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiles")
def test_a_compile_names_the_measured_choices(cache):
    torch.manual_seed(0)
    model, q = Head(), torch.randn(1, 2, 24, 16, requires_grad=True)
    target = torch.randint(0, 1100, (48,))
    backend = Backend(kernels="autotune")
    loss = torch.compile(model, backend=backend)(q, target)
    loss.backward()
    grad, q.grad = q.grad, None
    expected = model(q, target)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, q.grad, rtol=1e-4, atol=1e-4)

    measured = json.loads(cache.read_text())
    for op in ("causal_attention", "cross_entropy"):
        (match,) = [m for m in backend.report.matches if m.kernel == op]
        (times,) = [t for key, t in measured.items() if f"|{op}|" in key]
        assert match.choice == min(times, key=times.get)
        assert match.reason.startswith("autotuned: ")
        assert f"{op} " in str(backend.report) and match.reason in str(backend.report)
