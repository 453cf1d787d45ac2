"""The host memory cache (runtime/compiler/cpu/host_memory.py): freed host memory is reused, not
faulted again; ``compile`` turns it on only when asked.

Each case runs in a process of its own, since the cache is set once per process. What is
counted is the page faults of a "step" that fills three 40 MiB tensors and frees them: without
the cache glibc maps them afresh at every step (a fault per 4 KiB page), with it the heap keeps
them once it has grown to hold them.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

PAGES = 3 * (40 << 20) // 4096  # per step

FAULTS = textwrap.dedent(
    """
    import resource

    import torch

    def step():
        activations = [torch.empty(10 << 20).fill_(1) for _ in range(3)]

    def faults_per_step():
        for _ in range(8):  # the heap grows, if it is to keep the memory
            step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            step()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4
    """
)


def run(script: str, env=None) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", FAULTS + textwrap.dedent(script)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("\n")


@pytest.mark.slow
def test_freed_memory_is_reused_once_the_cache_is_on():
    before, reason, after = run(
        """
        from accrewrite.runtime.compiler.cpu.host_memory import cache_host_memory

        print(faults_per_step())
        print(cache_host_memory())
        print(faults_per_step())
        """
    )[:3]
    assert int(before) > PAGES // 2  # faulted in afresh each time
    assert reason == "None"
    assert int(after) < PAGES // 50


def compile_script(arguments: str) -> str:
    return f"""
    from torch import nn

    from accrewrite.runtime import compile
    from accrewrite.runtime.compiler import compile_report

    model = compile(nn.Linear(4, 4){arguments})
    print(compile_report(model).notes)
    print(faults_per_step())
    """


@pytest.mark.slow
def test_compile_leaves_host_memory_alone_unless_asked():
    notes, faults = run(compile_script(""))[:2]
    assert notes == "[]"
    assert int(faults) > PAGES // 2


@pytest.mark.parametrize(
    "arguments, env",
    [(", host_memory=True", {}), ("", {"ACCREWRITE_HOST_MEMORY_CACHE": "1"})],
    ids=["argument", "environment"],
)
@pytest.mark.slow
def test_compile_turns_it_on_when_asked(arguments, env):
    notes, faults = run(compile_script(arguments), env)[:2]
    assert "host memory cache on" in notes
    assert int(faults) < PAGES // 50


@pytest.mark.slow
def test_the_argument_overrides_the_environment():
    notes, faults = run(
        compile_script(", host_memory=False"), {"ACCREWRITE_HOST_MEMORY_CACHE": "1"}
    )[:2]
    assert notes == "[]"
    assert int(faults) > PAGES // 2


def test_a_model_off_the_cpu_leaves_host_memory_alone():
    from torch import nn

    from accrewrite.runtime import compile
    from accrewrite.runtime.compiler import compile_report

    model = compile(nn.Linear(4, 4, device="meta"), host_memory=True)
    assert not any("host memory" in note for note in compile_report(model).notes)
