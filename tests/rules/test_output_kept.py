"""The migrated script prints every line the original prints, in the same order: the last
iteration's, and those of loops left by ``break``, ``return`` or an exception, with plain lines
between lines that read tensors. Run on the runtime target, and on torch_xla where it is there."""

import os
import subprocess
import sys
import textwrap

import pytest

from accrewrite.engine import Options, migrate_source

PRELUDE = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).cuda() if torch.cuda.is_available() else torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(5)]
loader = torch.utils.data.DataLoader(data, batch_size=None)
device = "cuda" if torch.cuda.is_available() else "cpu"
"""

SCRIPTS = {
    "break": """
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item():.5f}")
            if step == 2:
                break
        print("left the loop")
    """,
    "return": """
        def train():
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print(f"step {step} loss {loss.item():.5f}")
                if step == 3:
                    return step
            return -1

        print("returned", train())
    """,
    "exception": """
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item():.5f}")
            if step == 1:
                raise SystemExit(3)
    """,
    "interleaved": """
        for epoch in range(2):
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                print(f"epoch {epoch} step {step} begins")
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print(f"epoch {epoch} step {step} loss {loss.item():.5f}")
            print(f"epoch {epoch} ends")
        print(f"last loss {loss.item():.5f}")
    """,
}


def script(shape: str) -> str:
    return PRELUDE + textwrap.dedent(SCRIPTS[shape])


def run(python: str, path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    return subprocess.run([python, str(path)], cwd=path.parent, env=environment, capture_output=True, text=True,
                          timeout=300)


def compare(shape, target, python, tmp_path, **env):
    original = tmp_path / "original.py"
    original.write_text(script(shape))
    result = migrate_source(original.read_bytes(), str(original), Options(target=target))
    assert result.error is None and result.changed
    assert any(fix.code == "ACC009" for fix in result.fixes)  # a line did move into a step closure
    migrated = tmp_path / "train.py"
    migrated.write_bytes(result.output)
    expected, found = run(sys.executable, original), run(python, migrated, **env)
    assert found.returncode == expected.returncode, found.stderr
    assert found.stdout.splitlines() == expected.stdout.splitlines(), result.output.decode()


@pytest.mark.slow
@pytest.mark.parametrize("shape", SCRIPTS)
def test_runtime_prints_what_the_original_prints(shape, tmp_path):
    compare(shape, "runtime", sys.executable, tmp_path)


@pytest.mark.xla
@pytest.mark.parametrize("shape", SCRIPTS)
def test_torch_xla_prints_what_the_original_prints(shape, tmp_path, xla_python):
    compare(shape, "torch_xla", xla_python, tmp_path, PJRT_DEVICE="CPU")
