"""benchmarks/codemod_cli_speed.py: every command of each tree runs in a fresh process, and the
table shows the ratios to the floor, to the base and of the two runs of the machine's ceiling."""

import pytest
from benchmark_module import load

speed = load("codemod_cli_speed")
scripts = load("codemod_speed")


@pytest.mark.slow  # fourteen processes
def test_ours_and_a_base_run_each_command_in_turn(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    scripts.bundled_corpus(tmp_path / "corpus")
    for extra in sorted((tmp_path / "corpus").iterdir())[2:]:
        extra.unlink()  # two scripts are enough to run every command
    medians = speed.measure([str(tmp_path / "corpus")], 1, {"ours": speed._ROOT, "base": speed._ROOT})
    assert set(medians) == {("ours", what) for what in speed.commands([])} | {
        ("base", what) for what in speed.commands([]) if what not in speed._MACHINE}
    assert all(seconds > 0 for seconds in medians.values())
    speed.print_table(medians, ["ours", "base"])
    out = capsys.readouterr().out
    assert out.count("/floor") == 4 and out.count("ours/base") == 3 and out.count("speed-up over --jobs 1") == 2


def test_the_table_divides_the_medians(capsys):
    medians = {("ours", "floor"): 2.0, ("ours", "jobs 1"): 3.0, ("ours", "jobs 2"): 2.0, ("ours", "one file"): 0.3,
               ("ours", "busy 1"): 1.0, ("ours", "busy 2"): 0.8, ("base", "jobs 1"): 4.0, ("base", "jobs 2"): 2.5,
               ("base", "one file"): 0.4}
    speed.print_table(medians, ["ours", "base"])
    lines = capsys.readouterr().out.splitlines()

    def line(start):
        return next(line for line in lines if line.startswith(start))

    assert "/floor 1.50x" in line("ours  jobs 1") and "/floor 1.00x" in line("ours  jobs 2")
    assert "ours/base 0.75x" in line("base  jobs 1") and "ours/base 0.75x" in line("base  one file")
    assert line("ours  --jobs 2").endswith("1.50x") and line("base  --jobs 2").endswith("1.60x")
    assert line("the machine").endswith("1.25x")
