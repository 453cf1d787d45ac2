"""What ``accrewrite verify`` shows besides its verdict: progress while a side runs, the events of
``--format json``, and the HTML page of ``--report``, rendered in a real headless browser."""

import io
import json
import math
import shutil
import socket
import subprocess
import threading
from html.parser import HTMLParser

import pytest
from engine_scripts import SMALL_TRAINING
from rich.console import Console

from accrewrite.cli import main
from accrewrite.verify import html_report
from accrewrite.verify.report import DIVERGE, MATCH, Ending, Progress
from accrewrite.verify.sides import Side
from accrewrite.verify.verdict import compare

STEPS = 40


def side(name, losses, checksums, target=None, graphs=None):
    records = [{"loss": loss, "checksum": checksum, "change": 1.0, "time": 100.0 + step / 4}
               for step, (loss, checksum) in enumerate(zip(losses, checksums))]
    for record, counts in zip(records, graphs or ()):
        record["graphs"] = counts
    return Side(name, target, records={0: records})


def curve(drift_from=None, drift=0.0, scale=1.0):
    """A falling loss; from step ``drift_from`` on, each step ``drift`` further off."""
    losses = [2.3 * math.exp(-step / 15) + 0.02 * math.sin(step) for step in range(STEPS)]
    return [loss * (1 + (drift * (step - drift_from + 1) if drift_from is not None and step >= drift_from else 0))
            * scale for step, loss in enumerate(losses)]


def ending(second_losses, code=DIVERGE, words="diverge: the loss differs", target=None, graphs=None):
    checksums = [0.01 * step for step in range(STEPS)]
    first = side("original", curve(), checksums)
    second = side(target or "runtime", second_losses, checksums, target, graphs)
    floor = side("original-nudged-1", curve(scale=1 + 1e-6), checksums)
    return Ending(code, words, compare(first, second, (floor,), None), [first, second, floor])


class Page(HTMLParser):
    """A page's elements as (tag, attributes), and its text."""

    def __init__(self, text):
        super().__init__()
        self.elements, self.text = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def curves(self):
        return {attrs["data-series"]: attrs["d"] for tag, attrs in self.elements if attrs.get("class") == "curve"}


def test_the_report_draws_every_sides_loss_the_originals_band_and_the_first_step_beyond():
    page = Page(html_report.page(ending(curve(21, 2e-4), words="diverge: the loss differs by 0.020% at step 22"),
                                 "train.py"))
    curves = page.curves()
    assert set(curves) >= {"original", "runtime", "original-nudged-1", "loss deviation", "loss tolerance",
                           "checksum deviation", "checksum tolerance"}
    assert curves["original"].count("L") == STEPS - 1  # one point per step
    assert [tag for tag, attrs in page.elements if attrs.get("class") == "band"] == ["path"]
    text = " ".join(page.text)
    assert "diverge: the loss differs by 0.020% at step 22" in text
    assert "step 22: loss 0.020% > 0.010%" in text  # the first step beyond its tolerance, marked
    over = [attrs for tag, attrs in page.elements if attrs.get("class") == "over"]
    assert len(over) == STEPS - 21  # the loss deviations beyond, in the table


def test_a_match_marks_its_largest_deviation_and_a_long_table_keeps_its_ends():
    page = Page(html_report.page(ending(curve(scale=1 + 1e-7), MATCH, "match: 40 steps"), "train.py"))
    text = " ".join(page.text)
    assert "largest deviation: step" in text
    rows = [attrs for tag, attrs in page.elements if tag == "tr"]
    assert len(rows) < STEPS and "…" in text


def test_a_non_finite_loss_breaks_its_curve():
    losses = curve()
    losses[10] = math.nan
    path = Page(html_report.page(ending(losses), "train.py")).curves()["runtime"]
    assert path.count("M") == 2 and "nan" not in path


def test_a_torch_xla_side_shows_its_graph_executions_and_compilations_per_step():
    counts = [{"compiles": 2 + (step >= 25), "executions": step + 1, "transfers": step} for step in range(STEPS)]
    page = Page(html_report.page(ending(curve(), target="torch_xla", graphs=counts), "train.py"))
    curves = page.curves()
    assert "M" in curves["graph executions"] and "M" in curves["compilations"]
    text = " ".join(page.text)
    assert "torch_xla: graphs per step after warm-up" in text
    assert "1 compilation after warm-up" in text


def test_a_side_that_could_not_run_still_has_its_curve_and_the_words_of_the_end():
    first = side("original", curve()[:3], [0.0] * 3)
    page = Page(html_report.page(Ending(2, "error: original cannot run: it exited with status 3", None, [first]),
                                 "train.py"))
    assert set(page.curves()) == {"original"}
    assert "original cannot run" in " ".join(page.text)


def test_the_report_names_no_address_and_forbids_every_fetch():
    text = html_report.page(ending(curve(21, 2e-4), target="torch_xla",
                                   graphs=[{"compiles": 2, "executions": step} for step in range(STEPS)]), "train.py")
    page = Page(text)
    assert "://" not in text and "url(" not in text
    assert not [attrs for _, attrs in page.elements if {"src", "href", "srcset", "action"} & set(attrs)]
    policy = next(attrs["content"] for tag, attrs in page.elements if attrs.get("http-equiv") ==
                  "Content-Security-Policy")
    assert policy.startswith("default-src 'none'")


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-headless-shell", "chromium-browser"))), None)


class Proxy:
    """A proxy that answers nothing and counts the connections the browser makes through it."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self):
        self.server.close()


def browse(path, proxy, *options):
    """Render ``path`` headless, every fetch sent to ``proxy``; its DOM after rendering."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
         "--virtual-time-budget=3000", *options, path.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium-headless-shell)")
def test_the_report_renders_in_a_headless_browser_and_fetches_nothing(tmp_path):
    report = tmp_path / "report.html"
    html_report.write(report, ending(curve(21, 2e-4)), "train.py")
    fetching = tmp_path / "fetching.html"  # the proxy's control: a page that does fetch
    fetching.write_text('<img src="http://verify-report.invalid/x.png">'
                        '<script src="https://cdn.invalid/x.js"></script>')
    proxy = Proxy()
    try:
        browse(fetching, proxy, "--dump-dom")
        assert proxy.connections >= 1
        proxy.connections = 0
        dom = Page(browse(report, proxy, "--dump-dom"))
        shot = tmp_path / "report.png"
        browse(report, proxy, f"--screenshot={shot}", "--window-size=800,1600", "--hide-scrollbars")
        assert proxy.connections == 0
    finally:
        proxy.close()
    assert {"original", "runtime", "original-nudged-1", "checksum deviation"} <= set(dom.curves())
    assert [tag for tag, attrs in dom.elements if tag == "svg"] == ["svg", "svg"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # drawn, not blank


def records(folder, steps, rank=0):
    """A process's records of ``steps`` steps, and the start of the next one's, still being written."""
    folder.mkdir(exist_ok=True)
    lines = [{"born": 0.0}] + [{"step": step, "loss": 1.0, "checksum": 0.0, "time": 100.0 + step / 4}
                               for step in range(steps)]
    written = '{"step": 9, "graphs": {"compiles": 1}'
    (folder / f"rank{rank}.1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + written)


def test_progress_on_a_pipe_is_silent_until_a_side_ends_and_json_events_say_the_same(tmp_path):
    shown, events = io.StringIO(), io.StringIO()
    progress = Progress(Console(file=shown, force_terminal=False), 10, events)
    running = Side("original")
    progress.started(running)
    records(tmp_path, 3)
    progress.running(running, tmp_path)
    assert shown.getvalue() == ""  # nothing on a pipe while it runs
    running.records = {0: [{"time": 100.0 + step / 4} for step in range(10)]}
    running.returncode = 0
    progress.finished(running)
    progress.result(Ending(MATCH, "match: 10 steps", None, [running]))
    assert shown.getvalue().startswith("original: 10 steps in ") and shown.getvalue().rstrip().endswith("4 steps/s")
    said = [json.loads(line) for line in events.getvalue().splitlines()]
    assert [event["event"] for event in said] == ["start", "progress", "end", "result"]
    assert said[1] | {"elapsed": 0} == {"event": "progress", "side": "original", "step": 3, "of": 10, "rate": 4.0,
                                        "elapsed": 0}
    assert said[2]["steps"] == 10 and said[2]["exit"] == 0
    assert said[3] == {"event": "result", "exit": 0, "verdict": "match", "message": "match: 10 steps",
                       "sides": ["original"], "steps": []}


def test_progress_on_a_terminal_shows_the_step_the_rate_the_time_and_what_is_left(tmp_path):
    shown = io.StringIO()
    progress = Progress(Console(file=shown, force_terminal=True, width=120), 10)
    running = Side("original")
    progress.started(running)
    records(tmp_path, 3)
    progress.running(running, tmp_path)
    progress.done()
    assert "original: step 3 of 10, 4 steps/s, 0.0 s elapsed, about 1.8 s left" in shown.getvalue()


@pytest.mark.slow
def test_format_json_writes_only_events_on_standard_output_and_report_writes_the_page(tmp_path, monkeypatch,
                                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SMALL_TRAINING)
    code = main(["verify", "train.py", "--format", "json", "--report", "out/report.html"])
    captured = capsys.readouterr()
    assert code == 2 and "--report out/report.html: no folder" in captured.err  # said before anything runs
    assert "original:" not in captured.err
    assert [json.loads(line)["verdict"] for line in captured.out.splitlines()] == ["cannot run"]
    (tmp_path / "out").mkdir()
    code = main(["verify", "train.py", "--format", "json", "--report", "out/report.html"])
    captured = capsys.readouterr()
    events = [json.loads(line) for line in captured.out.splitlines()]  # nothing else on standard output
    assert code == 0, captured.err
    ends = [(event["side"], event["steps"], event["exit"]) for event in events if event["event"] == "end"]
    assert ends == [("original", 5, 0), ("runtime", 5, 0), ("original-nudged-1", 5, 0)]
    result = events[-1]
    assert result["event"] == "result" and result["verdict"] == "match" and result["message"].startswith("match: 5")
    assert [row["step"] for row in result["steps"]] == [1, 2, 3, 4, 5]
    assert "match: 5 steps" in captured.err and "report: out/report.html" in captured.err
    page = Page((tmp_path / "out" / "report.html").read_text())
    assert {"original", "runtime", "original-nudged-1"} <= set(page.curves())
