"""ACC014 beyond its examples: which dimension a clamped bound measures, and that the clamped
slice selects exactly what the original does on CPU PyTorch, whatever the length."""

import pytest
import torch

from accrewrite.engine import Options, migrate_source

HEADER = "import torch\n\nx = torch.arange(60).view(3, 4, 5).cuda()\n"  # a device tensor


def migrated(line: str):
    result = migrate_source((HEADER + f"y = {line}\n").encode(), "s.py", Options(target="torch_xla", select=("ACC014",)))
    assert result.error is None
    return result.output.decode().splitlines()[-1].removeprefix("y = "), result.diagnostics


@pytest.mark.parametrize("line, clamped", [
    ("x[-n:]", "x[-min(n, x.size(0)):]"),
    ("x[:, -n:]", "x[:, -min(n, x.size(1)):]"),
    ("x[0, :, -n:]", "x[0, :, -min(n, x.size(2)):]"),
    ("x[..., -n:]", "x[..., -min(n, x.size(-1)):]"),
    ("x[..., -n:, 0]", "x[..., -min(n, x.size(-2)):, 0]"),
    ("x[:, :-n]", "x[:, :-min(n, x.size(1))]"),
    ("x[:, -n:-m]", "x[:, -min(n, x.size(1)):-min(m, x.size(1))]"),
])
def test_the_bound_is_clamped_to_its_dimension_and_selects_the_same(line, clamped):
    got, diagnostics = migrated(line)
    assert got == clamped and not diagnostics
    x = torch.arange(60).view(3, 4, 5)
    for n in range(0, 9):
        for m in range(0, 9):
            assert torch.equal(eval(line), eval(clamped)), (n, m)


@pytest.mark.parametrize("line", ["x[None, -n:]", "x[..., -n:, ...]", "torch.relu(x)[:, -n:]"])
def test_an_unknown_dimension_or_a_computed_value_is_reported(line):
    got, [diagnostic] = migrated(line)
    assert got == line and diagnostic.code == "ACC014"


@pytest.mark.parametrize("line", ["x[:, -2:]", "[1, 2, 3][-n:]", "x[:, -(n + 1):]"])
def test_literals_host_values_and_other_bounds_are_left(line):
    assert migrated(line) == (line, [])


def test_runtime_clamps_as_torch_does_and_does_not_run_the_rule():
    source = (HEADER + "y = x[:, -n:]\n").encode()
    result = migrate_source(source, "s.py", Options(target="runtime", select=("ACC014",)))
    assert result.output == source and not result.diagnostics
