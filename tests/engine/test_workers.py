"""The worker processes: each exits when asked, also while later workers hold copies of its
pipe, and --jobs never starts more workers than there are CPUs or files."""

import gc

import accrewrite.runner
from accrewrite import workers
from accrewrite.cli import main


def double(value):
    return value * 2


def test_every_worker_exits_by_itself_when_the_run_ends():
    context = workers._context()
    started = [workers._Worker(context, double) for _ in range(3)]  # each later one forked with the pipes before it
    for index, worker in enumerate(started):
        worker.connection.send(index)
        assert worker.connection.recv() == index * 2
    for worker in started:
        worker.close()
    assert [worker.process.exitcode for worker in started] == [0, 0, 0]  # not killed (-9)


def collector_state(task):
    return gc.isenabled(), gc.get_freeze_count() > 0


def test_a_task_runs_with_the_cycle_collector_paused_and_the_imports_frozen_out_of_it():
    assert workers.map_isolated(collector_state, [1, 2], 1, timeout=None) == [(False, True), (False, True)]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the caller's process is as it was


def test_map_isolated_keeps_the_order_of_its_tasks():
    assert workers.map_isolated(double, list(range(7)), 3, timeout=None) == [0, 2, 4, 6, 8, 10, 12]


def test_jobs_are_capped_at_the_cpus_and_the_files(tmp_path, monkeypatch, capsys):
    for name in "abc":
        (tmp_path / f"{name}.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    asked = []
    run = accrewrite.runner.run

    def counting(jobs, mode, count=1, *args, **kwargs):
        asked.append(count)
        return run(jobs, mode, count, *args, **kwargs)

    monkeypatch.setattr(accrewrite.runner, "run", counting)
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    for jobs in ("100000", "0", "1"):
        assert main(["migrate", str(tmp_path), "--diff", "--jobs", jobs]) == 0
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    assert main(["migrate", str(tmp_path), "--diff", "--jobs", "100000"]) == 0
    assert asked == [2, 2, 1, 3]
    capsys.readouterr()
