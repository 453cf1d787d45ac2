"""Shared by every test directory."""

import importlib.util
import os
import sys

import pytest

# PyTorch's gloo worker threads can abort a process at interpreter exit, after its work is done
# and its results are written ("terminate called without an active exception"). Processes that
# import accrewrite.runtime no longer do (runtime/_process_exit.py); the reference runs of plain
# PyTorch scripts (the examples' DDP originals under torchrun) still can. Tests that launch ranks
# rerun on exactly that failure; any other failure fails at once.
EXIT_ABORT = "terminate called without an active exception"


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("launches_ranks") or item.get_closest_marker("xla"):
            item.add_marker(pytest.mark.slow)  # real processes and torch_xla runs: the slow tier
        if item.get_closest_marker("launches_ranks"):
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[EXIT_ABORT]))


@pytest.fixture(scope="session")
def xla_python() -> str:
    """An interpreter that imports torch_xla (torch_xla 2.9 pins torch 2.9, so it is usually a
    venv of its own, named by ACCREWRITE_XLA_PYTHON; .ci/run makes one); skips the test where
    there is none."""
    named = os.environ.get("ACCREWRITE_XLA_PYTHON")
    if named:
        return named
    try:
        found = importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        pytest.skip("torch_xla is not importable (set ACCREWRITE_XLA_PYTHON to an interpreter that has it)")
    return sys.executable
