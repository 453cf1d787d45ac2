"""The kernel benchmark's cases and harness, on the CPU: every case of every kernel module in
benchmarks/kernel_cases builds with its smoke shapes and runs each of its callables once (the
compiled baseline through dynamo with the eager backend: traced, not code-generated, to stay
fast), so that no case rots while there is no GPU to run the benchmark on."""

import functools
import importlib.util
import pathlib
import sys

import pytest
import torch

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import kernel_cases  # noqa: E402

cheap_compile = functools.partial(torch.compile, backend="eager")


def _harness():
    spec = importlib.util.spec_from_file_location("benchmark_kernels", BENCHMARKS / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kernel", kernel_cases.kernel_names())
def test_every_case_runs(kernel):
    cases = kernel_cases.load(kernel).cases("cpu", smoke=True, compile=cheap_compile)
    assert cases
    for case in cases:
        assert isinstance(case, kernel_cases.Case) and case.name
        assert {"eager", "compile"} <= case.baselines().keys()
        for fn in (case.ours, *case.baselines().values()):
            fn()


def test_forward_backward_runs_fresh_gradients():
    x = torch.randn(3, requires_grad=True)
    run = kernel_cases.forward_backward(torch.sin, (x,), torch.ones(3))
    run()
    run()  # not accumulated: the second run starts from no gradient
    torch.testing.assert_close(x.grad, torch.cos(x.detach()))


def test_harness_without_cuda_says_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _harness().main([]) == 1
    assert "CUDA GPU" in capsys.readouterr().err


def test_harness_rejects_unknown_kernels(capsys):
    with pytest.raises(SystemExit):
        _harness().main(["--kernels", "no_such_kernel"])
    assert "no_such_kernel" in capsys.readouterr().err


def test_ratio_formatting():
    row = _harness().format_row("eager", 3.0, 2 * 2**20, ours_ms=1.5, ours_peak=2**20)
    assert "speedup  2.00x" in row and "memory   0.50x" in row


def test_harness_prints_a_row_per_implementation(capsys, monkeypatch):
    """main()'s GPU loop with the GPU parts stubbed: every case is measured, ours first, and
    each baseline gets its ratios."""
    harness = _harness()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stub GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    runs = []

    def measure(fn, warmup, rep):
        fn()
        runs.append(fn)
        return 2.0, 2**20

    original_load = kernel_cases.load
    monkeypatch.setattr(harness, "measure", measure)
    monkeypatch.setattr(kernel_cases, "load", lambda name: _SmokeCases(original_load(name)))
    assert harness.main(["--kernels", "quick_gelu,adam"]) == 0
    out = capsys.readouterr().out
    assert "stub GPU" in out and "quick_gelu float32 5x33" in out and "adamw float32" in out
    assert out.count("speedup  1.00x") == 5  # quick_gelu: eager, compile; adam: + torch fused
    assert len(runs) == 7


class _SmokeCases:
    """A case module whose cases() ignores the device and builds the smoke cases on the CPU,
    without compiling (dynamo would believe the stubbed torch.cuda.is_available)."""

    def __init__(self, module):
        self.module = module

    def cases(self, device):
        return self.module.cases("cpu", smoke=True, compile=lambda fn: fn)
