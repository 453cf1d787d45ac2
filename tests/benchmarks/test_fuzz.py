"""benchmarks/fuzz.py on a small bounded sample: a few dozen drawn and mutated scripts migrated to
every target without a defect, and the fuzzer's own checks and bookkeeping."""

import random

import pytest
from benchmark_module import load

from accrewrite.unbound import REFUSAL

pytest.importorskip("hypothesmith")

fuzz = load("fuzz")


@pytest.mark.slow
def test_a_small_sample_has_no_defects(capsys):
    feeds = fuzz.feeds(["grammar", "node", "mutation"], count=20, seed=0, budget=40, files=[])
    tally = fuzz.run(feeds, fuzz.TARGETS, jobs=2, timeout=60)
    fuzz.print_report(tally, fuzz.TARGETS, 0)
    report = capsys.readouterr().out
    assert tally.counts["mutation", "runtime", "tried"] >= 6, report
    assert tally.counts["grammar", "runtime", "tried"] + tally.counts["node", "runtime", "tried"] >= 6, report
    assert tally.counts["mutation", "runtime", "changed"] > 0, report
    assert tally.failures == [], report


def test_mutations_are_deterministic_and_mostly_valid():
    inputs = [fuzz.mutation(3, index) for index in range(40)]
    assert [item.data for item in inputs] == [fuzz.mutation(3, index).data for index in range(40)]
    assert len({item.data for item in inputs}) == 40
    assert sum(fuzz.compiles(item.data) is True for item in inputs) >= 30


@pytest.mark.parametrize("name", sorted(fuzz.MUTATIONS))
def test_each_mutation_changes_a_script_and_usually_keeps_it_python(name):
    valid = 0
    for index in range(10):
        rng = random.Random(index)
        text = rng.choice(fuzz.FIXTURES).read_text()
        mutated = fuzz.MUTATIONS[name](fuzz.Source(text), rng)
        assert mutated is not None and mutated != text
        valid += fuzz.compiles(mutated.encode()) is True
    assert valid >= 6


def test_the_checks_name_each_defect(monkeypatch):
    good = b"import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n"
    assert fuzz.check(good, "runtime").status == "changed"
    assert fuzz.check(good, "runtime").defects == ()
    # CPython rejects it (return outside a function) while libcst parses it: an error is owed.
    invalid = b"import torch\nreturn torch.zeros(1).cuda()\n"
    outcome = fuzz.check(invalid, "runtime")
    assert outcome.status == "error" or "accepted-invalid" in outcome.defects

    class Result:
        def __init__(self, output, error=None):
            self.output, self.error, self.changed = output, error, error is None and output != good

    class Error:
        reason = "internal error (KeyError: 'x'); the file was left unchanged"

    monkeypatch.setattr(fuzz, "migrate_source", lambda source, path, options: Result(source, Error()))
    assert fuzz.check(good, "runtime").defects == ("internal",)
    Error.reason = f"{REFUSAL} 'device' unbound at line 2 (ACC003 device-loader); the file was left unchanged"
    assert fuzz.check(good, "runtime").defects == ("unbound",)
    Error.reason = "the file is written for target 'torch_xla', not 'runtime' (line 1: `import torch_xla`); ..."
    assert fuzz.check(good, "runtime").defects == ()  # refused on purpose, not a valid file rejected
    monkeypatch.setattr(fuzz, "migrate_source", lambda source, path, options: Result(source + b"x = (\n"))
    assert fuzz.check(good, "runtime").defects == ("noncompiling", "nonidempotent")
    monkeypatch.setattr(fuzz, "migrate_source", lambda source, path, options: Result(source + b"# again\n"))
    assert fuzz.check(good, "runtime").defects == ("nonidempotent",)

    def raises(source, path, options):
        raise RecursionError("deep")

    monkeypatch.setattr(fuzz, "migrate_source", raises)
    assert fuzz.check(good, "runtime").defects == ("exception",)


def _hang(source, target):
    import time

    time.sleep(60)


def _die(source, target):
    import os

    os._exit(3)


@pytest.mark.parametrize("worker, defect", [(_hang, "timeout"), (_die, "crash")])
def test_a_hung_or_dead_worker_is_counted_and_replaced(monkeypatch, worker, defect):
    monkeypatch.setattr(fuzz, "check", worker)
    item = fuzz.Input("file", "x.py", b"import torch\n", "x.py")
    tally = fuzz.run([("file", lambda take: [take(item), take(item)])], ["runtime"], jobs=1, timeout=1)
    # The second input ran in the dead worker's replacement.
    assert [failure.outcome.defects for failure in tally.failures] == [(defect,), (defect,)]


def test_failures_are_saved_byte_for_byte(tmp_path):
    item = fuzz.Input("mutation", "mutation 1 (seed 0): x", b"\xef\xbb\xbfimport torch\r\n", "s0-mutation-1.py")
    tally = fuzz.Tally()
    tally.add(item, "torchacc", fuzz.Outcome("error", ("internal",), "internal error (KeyError)", "internal error (KeyError)"))
    fuzz.save_failures(tally, tmp_path)
    assert (tmp_path / "s0-mutation-1.py").read_bytes() == item.data
    assert "torchacc\tinternal" in (tmp_path / "failures.txt").read_text()
    assert fuzz.main([str(tmp_path / "s0-mutation-1.py")]) == 0
