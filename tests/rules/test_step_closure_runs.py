"""ACC009's step closures run on the runtime target and log what the original logged: the
values are those of the step that logged them (evaluated where the call was), in order."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    '''
    import logging
    import torch

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger = logging.getLogger("train")


    def log_metrics(epoch, step, loss):
        print_update(epoch, step, loss)


    def print_update(epoch, step, loss):
        print(f"helper {epoch} {step} {loss.item():.6f}", flush=True)


    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(6)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    running = 0.0
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running = 0.9 * running + 0.1 * loss.detach()
            print(f"epoch {epoch} step {step} loss {loss.item():.6f} running {running:.6f}", flush=True)
            logger.info("loss %s", loss)
            if step % 2 == 0:
                log_metrics(epoch, step, loss)
    '''
).lstrip()


def _run(path):
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return (done.stdout + done.stderr).splitlines()


@pytest.mark.slow
def test_migrated_logging_prints_the_same_lines(tmp_path):
    result = migrate_source(SCRIPT.encode(), "train.py", Options(target="runtime"))
    assert result.error is None
    migrated = result.output.decode()
    assert migrated.count("xm.add_step_closure(") == 3
    original_path, migrated_path = tmp_path / "original.py", tmp_path / "migrated.py"
    original_path.write_text(SCRIPT)
    migrated_path.write_text(migrated)
    original, after = _run(original_path), _run(migrated_path)
    # The main thread prints nothing after the loop: the closures' thread, which finishes the
    # last step's at exit, writes alone.
    assert after == original
    assert len(original) == 30


@pytest.mark.slow
def test_host_reads_kept_on_the_device_print_the_same_lines(tmp_path):
    """The DCGAN loop's ``D_x = output.mean().item()`` and ``float(output.mean())`` stay tensors,
    read in the closure: its lines are the original's, byte for byte."""
    fixture = Path(__file__).parent / "fixtures" / "gan_logged_reads.in.py"
    result = migrate_source(fixture.read_bytes(), "train.py", Options(target="runtime"))
    assert result.error is None
    migrated = result.output.decode()
    assert "D_x = output.mean().detach()" in migrated and "D_G_z1 = output.mean().detach()" in migrated
    assert "scores.append(score)" in migrated and ".item()" in migrated.split("score = ")[1].split("\n")[0]
    migrated_path = tmp_path / "migrated.py"
    migrated_path.write_text(migrated)
    # (the original's float() of a tensor that requires grad also warns, on stderr)
    original, after = ([line for line in _run(path) if line.startswith("loss")] for path in (fixture, migrated_path))
    assert after == original
    assert len(original) == 17
