"""The runtime's exit handler waits for gloo's threads only where they run (runtime/_process_exit.py)."""

import subprocess
import sys
import textwrap

from _ranks import free_port

SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    import torch
    import torch.distributed as dist

    from accrewrite.runtime import _process_exit

    print(_process_exit._gloo_threads_alive())
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    dist.all_reduce(torch.ones(3))
    print(_process_exit._gloo_threads_alive())
    dist.destroy_process_group()
    """
)


def test_gloo_threads_are_seen_once_a_group_has_run_a_collective():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port())], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"]
