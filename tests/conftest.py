"""Shared by every test directory."""

import pytest

# PyTorch's gloo worker threads can abort a process at interpreter exit, after its work is done
# and its results are written ("terminate called without an active exception"). Processes that
# import accrewrite.runtime no longer do (runtime/_process_exit.py); the reference runs of plain
# PyTorch scripts (the examples' DDP originals under torchrun) still can. Tests that launch ranks
# rerun on exactly that failure; any other failure fails at once.
EXIT_ABORT = "terminate called without an active exception"


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("launches_ranks"):
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[EXIT_ABORT]))
