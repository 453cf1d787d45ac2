"""Shared by every test directory."""

import importlib.util
import os
import sys
import types

import pytest



@pytest.fixture
def rule_pack(monkeypatch):
    """``rule_pack(name, *rules)`` registers ``rules`` as a third-party pack does (an entry point
    naming a module that defines them), for the test."""
    from accrewrite import registry

    def register(name, *rules):
        module = types.ModuleType(name)
        for rule in rules:
            setattr(module, rule.__name__, rule)
            monkeypatch.setattr(rule, "__module__", name)
        monkeypatch.setitem(sys.modules, name, module)

        class EntryPoint:
            def load(self):
                return module

        monkeypatch.setattr(registry, "entry_points",
                            lambda group: [EntryPoint()] if group == registry.ENTRY_POINT_GROUP else [])
        registry.all_rules.cache_clear()

    yield register
    registry.all_rules.cache_clear()


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("launches_ranks") or item.get_closest_marker("xla"):
            item.add_marker(pytest.mark.slow)  # real processes and torch_xla runs: the slow tier


@pytest.fixture(autouse=True)
def exit_grace_for_plain_ranks(request, monkeypatch):
    """PyTorch's gloo worker threads can abort a process at interpreter exit, after its work is
    done ("terminate called without an active exception", runtime/_process_exit.py). Processes
    that import accrewrite.runtime wait for those threads; the reference runs of plain PyTorch
    scripts (a DDP original under torchrun) get the same wait the way verify gives it to every
    side: verify's sitecustomize loads it, and records nothing without a records folder."""
    if request.node.get_closest_marker("launches_ranks") is None:
        return
    from accrewrite.verify import probe
    from accrewrite.verify.sides import EXIT_GRACE, HOOKS

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HOOKS), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(probe.EXIT_GRACE, str(EXIT_GRACE))


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
