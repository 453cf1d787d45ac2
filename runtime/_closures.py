"""Step closures: callables queued during a step and run at the step boundary (``xm.mark_step``).

Semantics follow torch_xla's ``xm.add_step_closure``:

* synchronous closures run on the calling thread, in the order they were added; if one raises,
  the exception propagates out of ``mark_step`` and the closures queued behind it in that step
  are dropped (torch_xla clears the list before running it);
* ``run_async=True`` closures run on one worker thread, in the order they were added, without
  blocking the step. An exception raised there is kept and re-raised, with its original
  traceback, at the next step boundary; closures queued behind a failed one are dropped until
  the error has been raised, so that nothing runs out of order after a failure.

Interpreter exit is the last step boundary, so a loop that ends (or ``break``s) right after
queuing its last log line does not lose it: the async closures already submitted finish, then the
pending synchronous closures run in order, then the pending async ones, on the worker, which is
then ended. (The two kinds are queued apart, so their relative order within a step is not
known.) Nothing can catch an error there: it is printed to stderr.
"""

import atexit
import queue
import sys
import threading
import traceback


class _AsyncRunner:
    """One daemon thread running submitted closures in FIFO order."""

    def __init__(self):
        self._queue = queue.Queue()
        self._error = None
        self._error_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._loop, name="accrewrite-async-step-closures", daemon=True
        )
        self._thread.start()

    def close(self):
        """Run what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _loop(self):
        while True:
            closure = self._queue.get()
            if closure is None:
                self._queue.task_done()
                return
            try:
                with self._error_lock:
                    failed = self._error is not None
                if not failed:
                    closure()
            except BaseException as error:  # noqa: BLE001 - surfaced on the main thread
                with self._error_lock:
                    self._error = error
            finally:
                self._queue.task_done()

    def submit(self, closures):
        for closure in closures:
            self._queue.put(closure)

    def wait(self):
        """Block until every submitted closure has run."""
        self._queue.join()

    def take_error(self):
        """The first exception raised since the last call, or None; clears it."""
        with self._error_lock:
            error, self._error = self._error, None
        return error


class StepClosures:
    """The closures of the current step; one instance per process (see ``STEP_CLOSURES``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sync = []
        self._async = []
        self._runner = None
        atexit.register(self.run_at_exit)

    def add(self, closure, args=(), run_async=False):
        if not callable(closure):
            raise TypeError(f"add_step_closure: closure must be callable, got {type(closure).__name__}")
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"add_step_closure: args must be a tuple or list, got {type(args).__name__}")
        args = tuple(args)
        with self._lock:
            (self._async if run_async else self._sync).append(lambda: closure(*args))

    def run(self):
        """Run this step's closures: the step boundary. Cheap when nothing is queued."""
        self._raise_async_error()
        with self._lock:
            sync, self._sync = self._sync, []
            pending_async, self._async = self._async, []
        if pending_async:
            if self._runner is None:
                self._runner = _AsyncRunner()
            self._runner.submit(pending_async)
        for closure in sync:
            closure()

    def wait(self):
        """Block until queued async closures have run, then raise the first one's error."""
        if self._runner is not None:
            self._runner.wait()
        self._raise_async_error()

    def _raise_async_error(self):
        if self._runner is None:
            return
        error = self._runner.take_error()
        if error is not None:
            error.add_note("(raised by an async step closure; surfaced at the next step boundary)")
            raise error

    def run_at_exit(self):
        """The last step boundary (see the module docstring); ends the worker thread, since one
        that ran torch ops and is alive while the interpreter tears down can abort the process
        ("terminate called without an active exception"). Safe to call more than once."""
        if self._runner is not None:
            self._runner.wait()  # what earlier steps submitted runs first
        with self._lock:
            sync, self._sync = self._sync, []
            pending_async, self._async = self._async, []
        try:
            for closure in sync:
                closure()
        except BaseException as error:  # noqa: BLE001 - nobody is left to catch it
            _report(error, "a step closure failed at exit")
        if pending_async:
            if self._runner is None:
                self._runner = _AsyncRunner()
            self._runner.submit(pending_async)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            runner.close()
            _report(runner.take_error(), "an async step closure failed after the last step")


def _report(error, what):
    if error is not None:
        print(f"accrewrite: {what}:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)


STEP_CLOSURES = StepClosures()
