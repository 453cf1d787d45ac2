"""benchmarks/codemod_speed.py on a small corpus: every figure is measured, each side in its own
process importing its own tree, and the table shows the ratios to the floor and to the base."""

import pytest
from benchmark_module import load

speed = load("codemod_speed")


@pytest.mark.slow  # eight migrate processes
def test_ours_and_a_base_are_measured_in_turn(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    speed.bundled_corpus(tmp_path / "corpus")
    for extra in sorted((tmp_path / "corpus").iterdir())[2:]:
        extra.unlink()  # two scripts are enough to run every path
    best = speed.measure(str(tmp_path / "corpus"), 1, {"ours": speed._ROOT, "base": speed._ROOT})
    assert best["files"] == 2 and min(best["floor"]) > 0
    assert all(min(best[name, jobs]) > 0 for name in ("ours", "base") for jobs in speed._JOBS)
    assert all(0 < best[name, "interleaved"][0] < best[name, "interleaved"][1] for name in ("ours", "base"))
    speed.print_table(best, ["ours", "base"])
    out = capsys.readouterr().out
    assert "ours/base" in out and out.count("/floor") == 10 and "speed-up over --jobs 1" in out
    assert out.count("in one process, file by file") == 2
