"""No global side effects: after ``accrewrite.runtime.compile(model)`` has compiled and run, a
plain ``torch.compile`` in the same process compiles exactly as in a fresh process (the same
generated code, the same number of graphs), and torch's compiler settings are as they were.

Each side runs in a process of its own, with inductor's caches off so that both compile.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import json, re, sys

    import torch
    import torch._inductor.async_compile as async_compile
    from torch import nn
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    def settings():
        return {
            "inductor": torch._inductor.config.save_config_portable(),
            "functorch": torch._functorch.config.save_config_portable(),
            "dynamo": torch._dynamo.config.save_config_portable(),
            "AsyncCompile": repr(async_compile.AsyncCompile),
        }

    class Other(nn.Module):  # what accrewrite's passes would change: oneDNN GEMMs, layer norm
        def __init__(self):
            super().__init__()
            self.fc, self.ln = nn.Linear(256, 256), nn.LayerNorm(256)

        def forward(self, x):
            h = self.ln(self.fc(x))
            return h * torch.sigmoid(1.702 * h)

    before = settings()
    if sys.argv[1] == "after accrewrite":
        from accrewrite.runtime import compile

        model = compile(nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256)))
        model(torch.randn(256, 256)).sum().backward()

    torch.manual_seed(0)
    graphs = counters["stats"]["unique_graphs"]
    compiled = torch.compile(Other())
    _, codes = run_and_get_code(lambda x: compiled(x).sum().backward(), torch.randn(256, 256))
    # the only line that numbers the process's compilations so far
    codes = [re.sub(r"# AOT ID: .*", "", code) for code in codes]
    print(json.dumps({
        "codes": codes,
        "graphs": counters["stats"]["unique_graphs"] - graphs,
        "settings unchanged": settings() == before,
    }))
    """
)


def compile_other(side: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, side], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_plain_torch_compile_after_accrewrites_compiles_as_in_a_fresh_process():
    fresh, after = compile_other("fresh"), compile_other("after accrewrite")
    assert after["settings unchanged"] and fresh["settings unchanged"]
    assert after["graphs"] == fresh["graphs"] == 1
    assert len(after["codes"]) == len(fresh["codes"]) == 2  # forward and backward
    assert after["codes"] == fresh["codes"]
    assert "accrewrite" not in "".join(after["codes"])
