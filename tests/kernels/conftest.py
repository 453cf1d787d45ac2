"""Kernel tests run every Triton kernel: on CUDA where present, else under the Triton interpreter.

TRITON_INTERPRET must be set before triton compiles anything, hence here, before test modules
import the kernels.
"""

import os

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device():
    return "cuda" if torch.cuda.is_available() else "cpu"
