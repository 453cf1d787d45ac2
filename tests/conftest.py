"""Shared by every test directory."""

import pytest

# An open bug: a worker process now and then aborts at interpreter exit, after its work is done
# and its results are written ("terminate called without an active exception"; the runtime's own
# threads are already stopped at exit, see runtime/_closures.py and runtime/parallel_loader.py).
# Tests that launch ranks rerun on exactly that failure; any other failure fails at once.
EXIT_ABORT = "terminate called without an active exception"


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("launches_ranks"):
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[EXIT_ABORT]))
