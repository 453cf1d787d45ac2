"""Build Triton kernels for an sm_90 (H100/H200) GPU on a machine without one.

The interpreter runs a kernel's Python semantics, which are laxer than the compiler's (types of
loop bounds, pointer casts, constexpr use); building the real cubin catches what only a GPU run
would otherwise reveal. Triton's wheel ships ptxas, so the whole pipeline runs on the CPU.

``build_for_sm90(module, [(kernel_name, signature, constexprs, num_warps), ...])`` compiles each
kernel in a subprocess (the test process has ``TRITON_INTERPRET=1``, under which ``@triton.jit``
gives interpreter objects) and returns the error text of each build, ``""`` when it built.
``signature`` maps every non-constexpr argument to a Triton type string ("*bf16", "i32", "fp32").
"""

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import importlib, json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

module_name, builds = json.loads(sys.argv[1])
module = importlib.import_module(module_name)
errors = []
for kernel_name, signature, constexprs, num_warps in builds:
    kernel = getattr(module, kernel_name)
    names = kernel.arg_names
    full = {name: signature.get(name, "constexpr") for name in names}
    # dtypes travel as "tl.<name>" strings
    values = {(names.index(k),): getattr(tl, v[3:]) if str(v).startswith("tl.") else v
              for k, v in constexprs.items()}
    try:
        triton.compile(ASTSource(fn=kernel, signature=full, constexprs=values),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
        errors.append("")
    except Exception as error:  # reported per build by the caller
        errors.append(f"{kernel_name} {constexprs}: {type(error).__name__}: {error}")
print(json.dumps(errors))
"""


def build_for_sm90(module: str, builds: list) -> list[str]:
    pytest.importorskip("triton.backends.nvidia", reason="Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps([module, builds])],
        capture_output=True, text=True, env=env, timeout=300,
    )
    if result.returncode:
        raise AssertionError(f"the build subprocess failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])
