"""benchmarks/gpu.py without a GPU: the dry run writes a report that lists every part with a
status, pytest's JUnit files are read per test, and the kernel part measures every case (its
GPU calls stubbed), so that the command is ready when a GPU is lent."""

import json
import subprocess
import sys
import textwrap

import pytest
from benchmark_module import BENCHMARKS, load

gpu = load("gpu")


@pytest.mark.slow
def test_dry_run_reports_every_part(tmp_path):
    result = subprocess.run([sys.executable, str(BENCHMARKS / "gpu.py"), str(tmp_path), "--dry-run"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr  # 1: a part failed; 2 would be a refusal
    report = json.loads((tmp_path / "report.json").read_text())
    markdown = (tmp_path / "report.md").read_text()
    assert [p["name"] for p in report["parts"]] == [p.name for p in gpu.PARTS]
    for part in report["parts"]:
        assert part["status"] not in ("not run yet", "running"), part
        assert f"| {part['name']} | {part['status']} |" in markdown
        if part["status"] == gpu.SKIPPED:
            assert not report["machine"]["gpu"]
    assert (tmp_path / "logs.tar.gz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.tar.gz", "report.json", "report.md"]


def test_the_runtime_cuda_tests_exist():
    for node in gpu.RUNTIME_CUDA_TESTS:
        path, name = node.split("::")
        assert f"def {name}(" in (BENCHMARKS.parent / path).read_text(), node


def test_pytest_groups_are_read_per_test(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""\
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert 1 == 2, "one is not two"

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass

        @pytest.fixture
        def broken():
            raise RuntimeError("the fixture broke")

        def test_errors(broken):
            pass
    """))
    results = gpu.Results(tmp_path, "tests")
    counts = gpu.run_pytest_groups([[str(tmp_path / "test_sample.py")]], tmp_path, results,
                                   test_timeout=60)
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "error": 1}
    rows = {row[0].rsplit("::", 1)[-1]: row for row in results.data["tables"][0]["rows"]}
    assert rows["test_fails"][1] == "failed" and "one is not two" in rows["test_fails"][3]
    assert rows["test_skipped"][1:2] == ["skipped"] and "not here" in rows["test_skipped"][3]
    assert json.loads((tmp_path / "tests.json").read_text())["summary"] == \
        "1 error, 1 failed, 1 passed, 1 skipped"


def test_kernel_part_measures_every_case(tmp_path, monkeypatch):
    """part_kernels with the smoke cases built on the CPU, uncompiled, and a stubbed measure."""
    import kernel_cases
    import kernels as harness
    import torch

    original_load = kernel_cases.load
    monkeypatch.setattr(kernel_cases, "load", lambda name: _CpuCases(original_load(name)))
    monkeypatch.setattr(harness, "measure", lambda fn, warmup, rep: (fn(), (2.0, 2**20))[1])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    results = gpu.Results(tmp_path, "kernels")
    assert gpu.part_kernels(results, tmp_path, 60, tiny=True) == gpu.OK
    rows = results.data["tables"][0]["rows"]
    assert rows[0][:2] == ["layer_norm float32 6x127", "ours"]
    measured = {row[0].split()[0] for row in rows}
    assert measured == {case.split()[0] for name in kernel_cases.kernel_names()
                        for case in _case_names(original_load(name))}
    assert all(row[4] == "1.00x" for row in rows if row[1] != "ours")
    assert any("Liger-Kernel" in note for note in results.data["notes"])


class _CpuCases:
    """A case module whose cases() builds the smoke cases on the CPU, without compiling."""

    def __init__(self, module):
        self.module = module

    def cases(self, device, smoke):
        assert device == "cuda" and smoke
        return self.module.cases("cpu", smoke=True, compile=lambda fn: fn)


def _case_names(module):
    return [case.name for case in module.cases("cpu", smoke=True, compile=lambda fn: fn)]
