"""benchmarks/codemod_speed.py on a small corpus: every figure is measured, each side in its own
process importing its own tree, and the table shows the ratios to the floor and to the base."""

from types import SimpleNamespace

import pytest
from benchmark_module import load

from accrewrite import engine

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


def _two_scripts(directory):
    directory.mkdir()
    speed.bundled_corpus(directory)
    for extra in sorted(directory.iterdir())[2:]:
        extra.unlink()


@pytest.mark.parametrize("what", speed._COUNTED)
def test_a_counted_run_migrates_parses_or_only_starts(tmp_path, monkeypatch, what):
    _two_scripts(tmp_path / "corpus")
    monkeypatch.setattr(speed.gc, "freeze", lambda: None)  # a counted run's own process freezes its imports; not the tests'
    done = []
    parse = speed.cst.parse_module
    monkeypatch.setattr(speed, "cst", SimpleNamespace(parse_module=lambda source: done.append("parse") or parse(source)))
    migrate = engine.migrate_source
    monkeypatch.setattr(engine, "migrate_source", lambda *args: done.append("migrate") or migrate(*args))
    speed.counted_run(str(tmp_path / "corpus"), 1, what)
    assert done == ["migrate"] + {"none": [], "floor": ["parse"] * 2, "migrate": ["migrate"] * 2}[what]  # a warm-up first


def test_the_instruction_counts_print_each_tree_against_the_floor_and_the_base(tmp_path, monkeypatch, capsys):
    _two_scripts(tmp_path / "corpus")
    monkeypatch.setattr(speed.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(speed, "warm_up", lambda *args: None)
    made = {"none": 100, "floor": 1100, "migrate": 1600}
    calls = []

    def instructions(farm, directory, step, what):
        calls.append((farm.name, what))
        return made[what] * 10**6 + (300 * 10**6 if farm.name == "base" and what == "migrate" else 0)

    monkeypatch.setattr(speed, "instructions", instructions)
    speed.count(str(tmp_path / "corpus"), 1, {"ours": speed._ROOT, "base": speed._ROOT})
    out = capsys.readouterr().out
    assert calls == [("ours", "none"), ("ours", "floor"), ("ours", "migrate"), ("base", "none"), ("base", "migrate")]
    assert "2 files" in out and "floor (parse + codegen)         1000" in out
    assert "/floor 1.500x" in out and "/floor 1.800x" in out and "ours/base 0.833x" in out


def test_counting_without_valgrind_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(speed.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="install it"):
        speed.count(str(tmp_path), 1, {"ours": speed._ROOT})
