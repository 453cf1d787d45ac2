"""A large tree migrated in a real terminal (tmux), as a person sees it: a progress bar on
stderr while the files run, then the findings and one summary table, and no bar left behind."""

import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from engine_scripts import HOST_SYNCS, TRAIN

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

FILES = 60  # above the progress bar's threshold (cli.PROGRESS_MIN_FILES)
ENDED = re.compile(r"^EXIT=\d+$", re.MULTILINE)  # the echo's output, not the typed command
BAR = re.compile(r"^migrating .*\b\d+/%d\b" % FILES, re.MULTILINE)


class Terminal:
    """A tmux session of its own (its own server socket, no user configuration)."""

    def __init__(self, cwd, width=100, height=30):
        self.socket = f"accrewrite-test-{time.monotonic_ns()}"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-c", str(cwd),
                   "bash --noprofile --norc")

    def _tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              check=True, capture_output=True, text=True).stdout

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", line, "Enter")

    def screen(self, history: bool = False) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t", *(["-S", "-"] if history else []))

    def run(self, command: str, timeout: float = 120) -> list[str]:
        """Type ``command``, then sample the screen until it has ended; returns the samples."""
        self.type(f"{command}; echo EXIT=$?")
        samples, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            samples.append(self.screen())
            if ENDED.search(samples[-1]):
                return samples
            time.sleep(0.05)
        raise AssertionError("the command did not end:\n" + samples[-1])

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for index in range(FILES - 1):
        (tree / f"t{index:02}.py").write_bytes(TRAIN)
    (tree / "zz_loop.py").write_bytes(HOST_SYNCS)
    opened = Terminal(tmp_path)
    yield opened
    opened.close()


def test_a_large_tree_shows_a_progress_bar_then_the_findings_and_one_table(terminal):
    command = f"{shlex.quote(sys.executable)} -m accrewrite migrate tree --check --jobs 1"
    samples = terminal.run(command)
    assert any(BAR.search(sample) for sample in samples[:-1]), samples[-1]  # seen while it ran
    screen = terminal.screen(history=True)
    assert ENDED.search(screen)[0] == "EXIT=1"  # --check: files would change
    assert not BAR.search(screen)  # the bar is gone once the run ends
    assert screen.count("accrewrite migrate (target runtime)") == 1  # one summary table
    assert screen.count("Would migrate: tree/") == FILES
    assert "tree/zz_loop.py:7:9: ACC101 `loss.item()` syncs the host every step (also on lines 8, 9)" in screen
    assert re.search(r"│\s+60 │\s+60 │\s+\d+ │\s+4 │\s+0 │", screen)  # files, changed, fixes, diagnostics, errors


def test_the_progress_bar_goes_to_stderr_only(terminal, tmp_path):
    command = f"{shlex.quote(sys.executable)} -m accrewrite migrate tree --check --jobs 1 > out.txt"
    samples = terminal.run(command)
    assert any(BAR.search(sample) for sample in samples[:-1])  # stderr is still the terminal
    written = (tmp_path / "out.txt").read_text()
    assert "migrating" not in written and "\x1b" not in written  # stdout: plain findings and table
    assert written.count("accrewrite migrate (target runtime)") == 1
