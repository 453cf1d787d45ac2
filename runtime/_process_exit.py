"""A distributed process's exit: give gloo's worker threads the GIL before the interpreter ends.

A gloo worker thread drops its reference to a collective just after completing it. When that is
the last reference, freeing the collective's tensors decrefs their Python objects, which needs
the GIL. The main thread, back from ``wait()``, keeps the GIL for up to the switch interval
(5 ms). A script whose last collective is that close to its end (the last step's all-reduce,
``xm.rendezvous`` before exit) reaches interpreter finalization first; the worker thread is then
ended inside a noexcept destructor and the process aborts with "terminate called without an
active exception" after its work is done. ``destroy_process_group`` does not prevent it: the
group's threads live until the group is garbage-collected. PyTorch leaves this to the caller
(pytorch#179291).

This handler is registered when ``accrewrite.runtime`` is imported, before any other of the
runtime's exit handlers, so it runs after them all: after the step closures have drained and
the process group is destroyed. Sleeping releases the GIL; a waiting worker takes it at once,
so the grace period only bounds how late the scheduler may run that thread.
"""

import atexit
import os
import sys
import time

GRACE_S = 0.1


def _gloo_threads_alive():
    """Whether a gloo thread runs in this process (they name themselves), or None where
    ``/proc`` cannot tell."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if "gloo" in comm.read():
                    return True
        except OSError:
            pass  # the thread has ended since the listing
    return False


def _may_have_gloo_threads():
    alive = _gloo_threads_alive()
    if alive is not None:
        return alive
    dist = sys.modules.get("torch.distributed")
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    return launched or (dist is not None and dist.is_available() and dist.is_initialized())


@atexit.register
def _let_collective_threads_finish():
    if _may_have_gloo_threads():
        time.sleep(GRACE_S)
