import subprocess
import sys

import pytest

from accrewrite.cli import main

TRAIN = b'''import torch

torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Linear(4, 4).cuda()
'''


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def run_module(*args, cwd=None):
    """Run ``python -m accrewrite`` in a subprocess (for what needs a real process)."""
    return subprocess.run([sys.executable, "-m", "accrewrite", *map(str, args)], capture_output=True, cwd=cwd)
