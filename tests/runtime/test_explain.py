"""accrewrite.runtime.explain: each graph break with its file:line and reason."""

import inspect

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from accrewrite.runtime import explain


def line_of(fn, text):
    """The file line number of the first line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


class Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent control flow
            h = h * 2
        return h.relu()


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


def test_lists_each_break_with_file_line_and_reason():
    result = explain(Breaks(), torch.randn(2, 4))

    assert result.graph_count >= 2
    assert len(result.breaks) == 1
    (brk,) = result.breaks
    assert brk.filename == __file__
    assert brk.lineno == line_of(Breaks.forward, "if h.sum() > 0")
    assert brk.reason.startswith("Python control flow depends on a tensor's value")
    assert str(brk) == f"{__file__}:{brk.lineno}: {brk.reason}"
    assert f"{__file__}:{brk.lineno}" in str(result)


def test_host_sync_is_a_break():
    def step(x):
        y = x * 2
        print("loss", y.sum().item())
        return y + 1

    result = explain(step, torch.randn(3))
    assert [b.lineno for b in result.breaks] == [line_of(step, "print(")]
    assert "Tensor.item()" in result.breaks[0].reason


def test_a_clean_model_has_one_graph_and_no_breaks():
    result = explain(Clean(), torch.randn(2, 4))
    assert (result.graph_count, result.breaks) == (1, ())
    assert str(result) == "1 graph(s), 0 graph break(s)"


def test_rejects_what_cannot_be_called():
    with pytest.raises(TypeError, match="model or function, got int"):
        explain(3)
