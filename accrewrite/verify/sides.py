"""Running one side of ``accrewrite verify``: its processes, their records, and their end.

A side is the script run by the side's interpreter in its view of the project, with the probe
(``probe.py``, through ``hooks/sitecustomize.py``) in every Python process it starts. Its
processes get a session of their own and a mark in their environment; when the side ends, times
out or verify is stopped, every process carrying the mark is killed, those that left the
session (``setsid``) included.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from accrewrite.targets import all_targets
from accrewrite.verify import probe

HOOKS = Path(__file__).with_name("hooks")
# Found without importing accrewrite.runtime (and torch with it) in verify's own process.
EXIT_GRACE = Path(importlib.util.find_spec("accrewrite.runtime").submodule_search_locations[0]) / "_process_exit.py"
MARK = "ACCREWRITE_VERIFY_SIDE"  # in the environment of each of a side's processes


@dataclass
class Side:
    """One run: the original script, or its migration to ``target``."""

    name: str
    target: str | None = None
    python: str = ""
    nudge: int = 0  # a floor run's seed: its parameters nudged before their first use
    records: dict[int, list[dict]] = field(default_factory=dict)  # per rank, its steps
    stopped: bool = False  # ended by the probe after the steps asked for
    collisions: dict[int, list[int]] = field(default_factory=dict)  # rank -> the pids that claimed it
    returncode: int | None = None  # None: killed at the timeout
    output: str = ""
    migration_errors: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return min((len(steps) for steps in self.records.values()), default=0)

    @property
    def failed(self) -> bool:
        return self.returncode != 0 or self.steps == 0 or bool(self.collisions)


def command(python: str, script: Path, args: list[str], nproc: int) -> list[str]:
    """torchrun itself (not accrun), so that the side's interpreter needs no accrewrite."""
    if nproc <= 1:
        return [python, str(script), *args]
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script), *args]


def environment(side: Side, records: Path, steps: int | None, nproc: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", probe.RECORDS: str(records),
           probe.STEPS: str(steps or 0), probe.NUDGE: str(side.nudge), probe.EXIT_GRACE: str(EXIT_GRACE),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(HOOKS), os.environ.get("PYTHONPATH"))))}
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if side.target is not None:
        needs = all_targets()[side.target].verify
        for name, value in needs.environment.items():
            env.setdefault(name, value)
        if needs.host_random:
            env[probe.HOST_RANDOM] = needs.device
        if needs.paced_loader:
            env[probe.PACED_LOADER] = needs.paced_loader
        if needs.device_finders:
            env[probe.DEVICE_FINDERS] = ",".join(needs.device_finders)
        if needs.metrics:
            names = (needs.compile_metric, needs.execution_metric, needs.transfer_metric)
            env[probe.EXECUTIONS] = ":".join((needs.metrics, *filter(None, names)))
        if needs.wait:
            env[probe.DEVICE_WAIT] = needs.wait
        if needs.analysis_file:
            env.update(needs.analysis)
            env[probe.ANALYSIS_FILE] = needs.analysis_file
        if needs.graph_hash:
            env[probe.GRAPH] = f"{needs.graph_hash},{needs.graph_text}"
    return env


def run(side: Side, argv: list[str], cwd: Path, env: dict[str, str], records: Path, log: Path,
        timeout: float, progress) -> None:
    """Run the side to its end (or ``timeout`` seconds), then read its records."""
    mark = uuid.uuid4().hex
    progress.started(side)
    with open(log, "wb") as output:
        process = subprocess.Popen(argv, cwd=cwd, env={**env, MARK: mark}, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                progress.running(side, records)
                time.sleep(0.2)
            side.returncode = process.poll()
        finally:
            end(process, mark)
    side.output = log.read_text(errors="replace")
    side.records, side.stopped, side.collisions = read_records(records)
    progress.finished(side)


def end(process: subprocess.Popen, mark: str) -> None:
    """Kill the side's process group and every process carrying its mark."""
    for _ in range(3):  # a process may start another while the others are killed
        targets = _marked(mark)
        if process.poll() is None:
            targets.add(process.pid)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not targets:
            break
        time.sleep(0.05)
    process.wait()


def _marked(mark: str) -> set[int]:
    """The processes whose environment carries ``mark`` (Linux's /proc; elsewhere none)."""
    found = set()
    needle = f"{MARK}={mark}".encode()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except FileNotFoundError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.add(pid)
        except OSError:  # gone, or not ours
            continue
    return found


def read_records(folder: Path) -> tuple[dict[int, list[dict]], bool, dict[int, list[int]]]:
    """(steps per rank, whether a process was stopped after its steps, rank -> pids that held
    that rank at the same time: one was born before another made its last step). Processes
    that held a rank one after the other (a process group per demo) follow each other in its
    steps."""
    by_rank: dict[int, list[tuple[float, int, list[dict]]]] = {}
    stopped = False
    for path in folder.glob("rank*.jsonl") if folder.is_dir() else ():
        rank, pid = (int(part) for part in path.name[len("rank"):-len(".jsonl")].split("."))
        text = path.read_text()
        complete = text[:text.rfind("\n") + 1]  # a line still being written (progress reads as it runs)
        lines = [json.loads(line) for line in complete.splitlines() if line.endswith("}")]
        stopped = stopped or any("stopped" in line for line in lines)
        steps = [line for line in lines if "step" in line]
        if steps:
            born = next((line["born"] for line in lines if "born" in line), steps[0]["time"])
            by_rank.setdefault(rank, []).append((born, pid, steps))
    records, collisions = {}, {}
    for rank, runs in sorted(by_rank.items()):
        runs.sort(key=lambda run: run[0])
        together = {pid for j, (born, pid, _) in enumerate(runs) for _, other, steps in runs[:j]
                    if born <= steps[-1]["time"] for pid in (pid, other)}
        if together:
            collisions[rank] = sorted(together)
        records[rank] = [step for _, _, steps in runs for step in steps]
    return records, stopped, collisions
