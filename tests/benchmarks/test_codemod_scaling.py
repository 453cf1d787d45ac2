"""benchmarks/codemod_scaling.py on tiny sizes: the generated scripts, the largest one under the
size limit, the table and its slopes, and a run of the command line with another source tree
side by side. No timing is asserted."""

import ast
import pathlib
import re

import pytest
from benchmark_module import load

scaling = load("codemod_scaling")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("loops", [2, 5, 9])
def test_a_script_holds_that_many_training_loops_each_its_own(loops):
    source = scaling.script(loops)
    ast.parse(source)
    assert source.count(".backward()") == loops
    assert source.count("DataLoader(dataset") == -(-loops // 4)  # a loader per four loops
    assert source.count(".cuda()") >= loops and "print(" in source
    heads = re.findall(r"^\s*for .*:$", source, re.MULTILINE)
    assert len(set(heads)) > len(heads) // 2  # the loops' names vary


def test_the_largest_script_under_the_limit(monkeypatch):
    monkeypatch.setattr(scaling, "MAX_BYTES", 5_000)
    loops = scaling.largest_under_limit()
    assert len(scaling.script(loops).encode()) <= 5_000 < len(scaling.script(loops + 1).encode())


def rows(seconds: dict[int, float], error: str = "") -> list:
    run = scaling.Run
    made = [scaling.Row(str(loops), loops, 100 * loops, {("runtime", "now"): run(s, s / 2, s * 10)})
            for loops, s in seconds.items()]
    made.append(scaling.Row("limit", 9, 900, {("runtime", "now"): run(150.0, 150.0, 99.0, error)}))
    return made


def test_the_table_gives_per_loop_figures_and_the_slope(capsys):
    scaling.print_table(rows({2: 1.0, 4: 2.0, 8: 8.0}, "file.py: error: timed out"))
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["file", "loops", "bytes", "target", "tree", "s", "cpu", "s", "peak", "MB",
                              "s/loop", "MB/loop"]
    assert out[1].split() == ["2", "2", "200", "runtime", "now", "1.00", "0.50", "10", "0.5000", "5.000"]
    assert out[4].split()[:6] == ["limit", "9", "900", "runtime", "now", "150.0"]
    assert out[4].endswith("error: file.py: error: timed out")
    assert out[-1].split() == ["runtime", "now", "4", "->", "8", "loops:", "time", "2.00", "cpu", "2.00",
                               "peak", "RSS", "2.00"]


def test_the_slope_is_of_the_two_largest_sizes_migrated():
    failed = rows({2: 1.0, 4: 2.0, 8: 4.0})
    failed[2].runs["runtime", "now"].error = "timed out"
    small, large, ratios = scaling.slope(failed, ("runtime", "now"))
    assert (small.loops, large.loops, ratios) == (2, 4, [1.0, 1.0, 1.0])
    assert scaling.slope(rows({2: 1.0}), ("runtime", "now")) is None


def test_each_figure_is_the_least_of_the_rounds(monkeypatch, tmp_path):
    runs = iter([scaling.Run(3.0, 1.0, 50.0), scaling.Run(2.0, 2.0, 60.0), scaling.Run(1.0, 1.0, 1.0, "timed out")])
    monkeypatch.setattr(scaling, "migrate", lambda path, target, tree: next(runs))
    [row] = scaling.measure([("2", 2)], ["runtime"], {"now": None}, tmp_path, repeat=2)
    assert row.runs["runtime", "now"] == scaling.Run(2.0, 1.0, 50.0)
    [row] = scaling.measure([("2", 2)], ["runtime"], {"now": None}, tmp_path, repeat=2)
    assert row.runs["runtime", "now"].error == "timed out"  # and not run again: the iterator is spent


@pytest.mark.slow
def test_before_migrates_with_another_tree_side_by_side(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "MAX_BYTES", 3_000)
    assert scaling.main(["--sizes", "2,4", "--targets", "runtime", "--before", str(ROOT)]) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines()[1:7]]
    assert [(cells[0], cells[4]) for cells in table] == [
        ("2", "before"), ("2", "now"), ("4", "before"), ("4", "now"), ("limit", "before"), ("limit", "now")]
    assert not any("error:" in line for line in out.splitlines())
    assert "runtime    before  2 -> 4 loops: time" in out and "runtime    now     2 -> 4 loops: time" in out
