"""Each file in a worker process that a crash or a hang cannot take down.

libcst's native parser can crash its process, and one pathological file can run for minutes.
So every file runs in a worker: a worker that dies takes only its file with it (that file's
result says how it died) and is replaced; a file that runs past the timeout has its worker
killed the same way. Killing the run kills its workers (Linux: ``PR_SET_PDEATHSIG``), so none
goes on writing files after the run is gone.

Workers are forked where the platform allows it, so they start with the parent's modules
already imported; the parent starts no thread of its own while they run (3.12 warns about
forking a threaded process).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Lost:
    """A task whose worker died or ran past the timeout."""

    reason: str


def map_isolated(function, tasks: list, workers: int, timeout: float | None, done=None) -> list:
    """``function(task)`` for every task, in ``workers`` processes, in the order of ``tasks``; a
    task whose worker died or timed out gives ``Lost``. ``done()`` is called after each task."""
    results: list = [None] * len(tasks)
    pending = deque(range(len(tasks)))
    idle: list[_Worker] = []
    busy: dict[_Worker, tuple[int, float]] = {}
    context = _context()

    def finish(index: int, result) -> None:
        results[index] = result
        if done:
            done()

    try:
        while pending or busy:
            while pending and len(busy) < max(1, workers):
                worker = idle.pop() if idle else _Worker(context, function)
                index = pending.popleft()
                try:
                    worker.connection.send(tasks[index])
                except OSError:  # it died idle
                    finish(index, Lost(worker.end("crashed")))
                    continue
                busy[worker] = (index, time.monotonic() + timeout if timeout else float("inf"))
            if not busy:
                continue
            nearest = min(deadline for _, deadline in busy.values())
            waiting = None if nearest == float("inf") else max(0.0, nearest - time.monotonic())
            ready = set(wait([w.connection for w in busy] + [w.process.sentinel for w in busy], waiting))
            for worker, (index, deadline) in list(busy.items()):
                if worker.connection in ready:
                    try:
                        result = worker.connection.recv()
                    except (EOFError, OSError):  # died while sending
                        result = Lost(worker.end("crashed"))
                    else:
                        idle.append(worker)
                elif worker.process.sentinel in ready:
                    result = Lost(worker.end("crashed"))
                elif time.monotonic() >= deadline:
                    result = Lost(worker.end(f"timed out after {timeout:g} s"))
                else:
                    continue
                del busy[worker]
                finish(index, result)
    finally:
        for worker in [*idle, *busy]:
            worker.close()
    return results


def _context():
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


class _Worker:
    def __init__(self, context, function):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, function, os.getpid()), daemon=True)
        self.process.start()
        child.close()

    def end(self, how: str) -> str:
        """Kill the worker (if it still runs) and say how it ended."""
        self.process.kill()
        self.process.join()
        self.connection.close()
        code = self.process.exitcode
        if how == "crashed" and code is not None and code < 0:
            how = f"crashed ({signal.Signals(-code).name})"
        return f"the worker migrating this file {how}; the file was left unchanged"

    def close(self) -> None:
        """Ask an idle worker to exit (a busy one is killed). Not by closing the pipe: forked
        workers hold copies of the parent's ends of the pipes made before them, so the one that
        waits on that pipe would never read EOF."""
        try:
            self.connection.send(_STOP)
        except OSError:
            pass  # it is gone already
        self.connection.close()
        self.process.join(timeout=_EXIT_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


_STOP = None  # the task that ends a worker
_EXIT_GRACE = 5.0  # seconds an idle worker has to exit once asked


def usable_cpus() -> int:
    """The CPUs this process may run on: more workers than these only wait for each other."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _serve(connection, function, parent: int) -> None:
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # A task builds a syntax tree of many thousand objects; Python's cycle collector would walk
    # them (and the modules imported before the fork) again and again while it runs. Out of the
    # collector's sight, the imports stay; with it paused, a task's own cycles wait for the next.
    gc.freeze()
    while True:
        try:
            task = connection.recv()
        except EOFError:  # the run is gone
            return
        if task is _STOP:
            return
        gc.disable()
        try:
            result = function(task)
        finally:
            gc.enable()
        connection.send(result)


def _die_with(parent: int) -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request above
        os._exit(1)
