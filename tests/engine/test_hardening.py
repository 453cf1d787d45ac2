"""Hostile input, run as a hostile user would, in a tree with good files beside each bad one:
every file ends in a correct output or a clear error, and nothing is lost, hangs or crashes the
run."""

import ctypes
import errno
import faulthandler
import json
import os
import signal
import stat
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accrewrite import limits
from accrewrite.engine import migrate_source

ROOT = Path(__file__).resolve().parents[2]
TRAIN = b"import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n"
MIGRATED = b".to(xm.xla_device())"
# Root reads and writes through any permission bit: drop those capabilities for the command.
AS_USER = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def accrewrite(*args, cwd, **kwargs):
    return subprocess.run([*AS_USER, sys.executable, "-m", "accrewrite.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, **kwargs)


def tree(tmp_path, **files):
    for name, data in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path


# -- silent loss ------------------------------------------------------------------------------


def test_output_dir_keeps_apart_files_of_one_name_from_several_inputs(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tree(tmp_path, **{"a/train.py": TRAIN, "b/train.py": TRAIN + b"# b\n"}))
    assert cli("migrate", "a/train.py", "b/train.py", "--output-dir", "out")[0] == 0
    assert cli("migrate", "a", "b", "--output-dir", "out2")[0] == 0
    for out in ("out", "out2"):
        assert sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*.py")) == ["a/train.py", "b/train.py"]
        assert (Path(out) / "b/train.py").read_bytes().endswith(b"# b\n")
        assert not (Path(out) / "a/train.py").read_bytes().endswith(b"# b\n")


def test_an_output_dir_inside_the_inputs_is_not_migrated_again(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tree(tmp_path, **{"src/a.py": TRAIN}))
    for _ in range(2):
        assert cli("migrate", "src", "--output-dir", "src/out")[0] == 0
    assert sorted(p.relative_to("src").as_posix() for p in Path("src").rglob("*.py")) == ["a.py", "out/a.py"]


def test_a_full_disk_under_output_dir_names_the_output(tmp_path, cli, monkeypatch):
    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("accrewrite.runner.write_atomically", full)
    monkeypatch.chdir(tree(tmp_path, **{"src/a.py": TRAIN}))
    code, out, _ = cli("migrate", "src", "--output-dir", "out")
    assert code == 2 and f"cannot write {Path('out/a.py')}: No space left on device" in " ".join(out.split())
    assert (tmp_path / "src/a.py").read_bytes() == TRAIN


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner takes root")
def test_a_rewrite_keeps_the_owner_group_and_mode_or_refuses_to_change_them(tmp_path):
    tree(tmp_path, **{"theirs.py": TRAIN})
    theirs = tmp_path / "theirs.py"
    os.chown(theirs, 1234, 5678)
    theirs.chmod(0o640)
    as_root = [sys.executable, "-m", "accrewrite.cli", "migrate", "theirs.py", "--in-place"]
    assert subprocess.run(as_root, cwd=tmp_path, capture_output=True).returncode == 0
    written = theirs.stat()
    assert MIGRATED in theirs.read_bytes()
    assert (written.st_uid, written.st_gid, stat.S_IMODE(written.st_mode)) == (1234, 5678, 0o640)
    # Without the right to give files away, the file is left as it was, with the reason.
    theirs.write_bytes(TRAIN)
    theirs.chmod(0o666)
    done = subprocess.run(["setpriv", "--bounding-set=-chown", "--", *as_root], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 2 and theirs.read_bytes() == TRAIN
    assert "it belongs to uid 1234 and gid 5678" in " ".join(done.stdout.split())
    assert (theirs.stat().st_uid, theirs.stat().st_gid) == (1234, 5678)


def test_the_summary_counts_a_refused_write_as_an_error_not_as_written(tmp_path, cli):
    tree(tmp_path, **{"ok.py": TRAIN, "locked.py": TRAIN})
    (tmp_path / "locked.py").chmod(0o444)
    code, out, _ = cli("migrate", tmp_path, "--in-place")
    assert code == 2 and "2 (1 written)" in out and "locked.py: error: cannot write" in out
    code, out, _ = cli("migrate", tmp_path / "locked.py", "--in-place", "--format", "json")
    assert json.loads(out)["summary"]["written"] == 0


# -- hangs and orphans ------------------------------------------------------------------------


def test_a_fifo_among_the_files_is_refused_without_blocking(tmp_path):
    tree(tmp_path, **{"a.py": TRAIN, "z.py": TRAIN})
    os.mkfifo(tmp_path / "pipe.py")
    done = accrewrite("migrate", ".", "--in-place", cwd=tmp_path)
    assert done.returncode == 2
    assert "pipe.py: error: not a regular file (a FIFO)" in done.stdout
    assert MIGRATED in (tmp_path / "a.py").read_bytes() and MIGRATED in (tmp_path / "z.py").read_bytes()


def _session(leader: int) -> list[int]:
    """The processes of the session that ``leader`` started."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[3]) == leader and fields[0] != "Z":
            members.append(int(entry.name))
    return members


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_killing_the_parent_kills_its_workers_and_they_write_no_more(tmp_path):
    body = TRAIN + b"".join(b"def f%d(x):\n    return x.cuda() + %d\n" % (i, i) for i in range(600))
    tree(tmp_path, **{f"f{i:03}.py": body for i in range(20)})
    parent = subprocess.Popen([sys.executable, "-m", "accrewrite.cli", "migrate", ".", "--in-place", "--jobs", "2"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_session(parent.pid)) < 3 and time.monotonic() < deadline:  # the parent and two workers
        time.sleep(0.05)
    assert len(_session(parent.pid)) >= 3
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _session(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _session(parent.pid) == []
    written = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.py")}
    time.sleep(1)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.py")} == written
    # A worker killed mid-write leaves a temporary that names it; the next run removes it.
    leftovers = list(tmp_path.glob(".*.tmp"))
    accrewrite("migrate", ".", "--in-place", cwd=tmp_path)
    assert not any(p.exists() for p in leftovers) and not list(tmp_path.glob(".*.tmp"))


def test_leftover_temporaries_of_dead_writers_go_and_live_ones_stay(tmp_path, cli):
    tree(tmp_path, **{"train.py": TRAIN})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    stale = tmp_path / f".train.py.{host}.{dead.stdout.strip()}.9a8b7c6d.tmp"
    live = tmp_path / f".train.py.{host}.{os.getpid()}.1a2b3c4d.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"half")
    assert cli("migrate", tmp_path, "--in-place")[0] == 0
    assert not stale.exists() and live.exists()


# -- one file takes the run down --------------------------------------------------------------


def _crash_or_hang(original):
    def migrate(source, path, options):
        if path.endswith("crash.py"):
            ctypes.string_at(0)  # SIGSEGV, as libcst's native parser on a deep expression
        if path.endswith("hang.py"):
            time.sleep(600)
        return original(source, path, options)

    return migrate


@pytest.fixture
def quiet_crashes():
    """The forked workers inherit pytest's fault handler: without it a crash meant to happen
    prints no stack."""
    enabled = faulthandler.is_enabled()
    faulthandler.disable()
    yield
    if enabled:
        faulthandler.enable(file=sys.__stderr__)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_crashed_or_hung_worker_fails_its_file_only(tmp_path, cli, monkeypatch, jobs, quiet_crashes):
    monkeypatch.setattr("accrewrite.runner.migrate_source", _crash_or_hang(migrate_source))
    tree(tmp_path, **{"a.py": TRAIN, "crash.py": TRAIN, "hang.py": TRAIN, "z.py": TRAIN})
    started = time.monotonic()
    code, out, _ = cli("migrate", tmp_path, "--in-place", "--jobs", jobs, "--timeout", "2")
    assert time.monotonic() - started < 60
    assert code == 2
    assert "crash.py: error: the worker migrating this file crashed (SIGSEGV)" in out
    assert "hang.py: error: the worker migrating this file timed out after 2 s" in out
    assert "4 │ 2 (2 written)" in out
    for name in ("a.py", "z.py"):
        assert MIGRATED in (tmp_path / name).read_bytes()
    for name in ("crash.py", "hang.py"):
        assert (tmp_path / name).read_bytes() == TRAIN


def test_a_file_past_the_size_limit_is_refused_before_parsing():
    source = b"import torch\n" + b"x = torch.zeros(1).cuda()\n" * (limits.MAX_BYTES // 26 + 1)
    started = time.monotonic()
    result = migrate_source(source, "big.py")
    assert time.monotonic() - started < 5
    assert result.error.reason.startswith("file too large") and "split it" in result.error.reason
    assert not result.changed


@pytest.mark.parametrize("terms", [10_000, 100_000])
def test_an_expression_past_the_depth_limit_is_refused_at_once(terms):
    source = b"import torch\ny = " + b" + ".join([b"x"] * terms) + b"\nz = torch.zeros(1).cuda()\n"
    started = time.monotonic()
    result = migrate_source(source, "deep.py")
    assert time.monotonic() - started < 5
    assert result.error.reason.startswith("nested too deeply") and "split" in result.error.reason


DEEP_BUT_VALID = {
    "sum of 1,990 terms": b"y = " + b" + ".join([b"x"] * 1990),
    "200 chained .cuda()": b"z = torch.zeros(1)" + b".cuda()" * 200,
    "and of 1,000 terms": b"y = " + b" and ".join([b"x"] * 1000),
    "attribute chain of 1,000": b"y = x" + b".a" * 1000,
    "99 nested ifs": b"".join(b" " * i + b"if x:\n" for i in range(99)) + b" " * 99 + b"pass",
}


@pytest.mark.parametrize("body", DEEP_BUT_VALID.values(), ids=DEEP_BUT_VALID)
def test_deep_code_python_compiles_is_migrated(body):
    source = b"import torch\n" + body + b"\nw = torch.ones(1).cuda()\n"
    result = migrate_source(source, "deep.py")
    assert result.error is None and result.changed
    compile(result.output, "deep.py", "exec")
    assert migrate_source(result.output, "deep.py").output == result.output
    assert sys.getrecursionlimit() < limits._RECURSION_LIMIT  # put back


# -- valid Python that libcst misreads --------------------------------------------------------

MISREAD = {
    "form feed in an indentation": b"if True:\n\f    x = torch.zeros(1).cuda()\n",
    "form feed before a dedent": b"if x:\n    y = 1\n\fz = torch.zeros(1).cuda()\n",
    "form feed in a nested dedent": b"if x:\n    if y:\n        y = 1\n\f    z = torch.zeros(1).cuda()\n",
    "backslash line before else": b"if x:\n    y = torch.zeros(1).cuda()\n\\\nelse:\n    pass\n",
    "backslash lines inside a statement": b"x = \\\n\\\ntorch.zeros(1).cuda()\n",
    "both, and a string that holds them": (
        b's = """\n\f  kept\n\\\n"""\nif x:\n  \f  y = torch.zeros(1).cuda()\n\\\nelse:\n\f\tpass\n'
    ),
}


@pytest.mark.parametrize("body", MISREAD.values(), ids=MISREAD)
def test_form_feeds_and_backslash_lines_are_read_as_python_reads_them(body):
    source = b"import torch\n" + body
    result = migrate_source(source, "ff.py")
    assert result.error is None and result.changed
    compile(result.output, "ff.py", "exec")
    assert result.output.count(b"\f") == source.count(b"\f")
    assert result.output.count(b"\\\n") == source.count(b"\\\n")
    assert b'"""\n\f  kept\n\\\n"""' in result.output if b"kept" in source else True
    assert migrate_source(result.output, "ff.py").output == result.output


def test_lone_carriage_returns_stay_to_the_last_line():
    source = b"import torch\rif x:\r\f    y = torch.zeros(1).cuda()\r\\\relse:\r    pass\r"
    result = migrate_source(source, "mac.py")
    assert result.error is None and result.changed
    assert result.output.endswith(b"pass\r") and b"\n" not in result.output and b"\r\f    y" in result.output
    assert migrate_source(result.output, "mac.py").output == result.output


@pytest.mark.parametrize("tail", [b"\n \n", b"\n\n\t", b"  \n\n \n\n", b"\r\n \r\n"])
def test_blank_lines_of_spaces_at_the_end_are_kept(tail):
    # libcst drops the empty lines before a last line of spaces, which the round-trip check refuses
    source = b"import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n" + tail
    result = migrate_source(source, "tail.py")
    assert result.error is None and result.changed
    assert result.output.endswith(tail) and b"cuda()" not in result.output
    assert migrate_source(result.output, "tail.py").output == result.output


def test_a_file_python_rejects_is_a_syntax_error_not_a_rewrite():
    source = b"import torch\ny = " + b"(" * 250 + b"1" + b")" * 250 + b"\nz = torch.zeros(1).cuda()\n"
    result = migrate_source(source, "parens.py")
    assert "syntax error" in result.error.reason and "too many nested parentheses" in result.error.reason
    assert result.error.line == 2 and not result.changed


# -- tracebacks -------------------------------------------------------------------------------


def test_symlink_loops_are_files_in_error_and_the_rest_runs(tmp_path):
    tree(tmp_path, **{"good.py": TRAIN})
    os.symlink("l2.py", tmp_path / "l1.py")
    os.symlink("l1.py", tmp_path / "l2.py")
    os.symlink("loopdir", tmp_path / "loopdir")
    done = accrewrite("migrate", "l1.py", ".", "--in-place", cwd=tmp_path)  # config looked up from l1.py
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "l1.py: error: cannot read: Too many levels of symbolic links" in done.stdout
    assert MIGRATED in (tmp_path / "good.py").read_bytes()


def test_an_unreadable_directory_is_reported_and_the_rest_runs(tmp_path):
    tree(tmp_path, **{"good.py": TRAIN, "locked/inner/t.py": TRAIN})
    (tmp_path / "locked").chmod(0o000)
    try:
        done = accrewrite("migrate", ".", "--in-place", cwd=tmp_path)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "locked: error: cannot read the directory: Permission denied" in done.stdout
    assert MIGRATED in (tmp_path / "good.py").read_bytes()


# -- the CLI's contract -----------------------------------------------------------------------


@pytest.mark.parametrize("mode, code", [("--diff", 0), ("--check", 1)])
def test_a_closed_pipe_keeps_the_exit_code(mode, code):
    run = subprocess.Popen([sys.executable, "-m", "accrewrite.cli", "migrate", "examples", mode],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run.stdout.readline()
    run.stdout.close()  # `| head -1`
    assert run.wait(timeout=120) == code, run.stderr.read()


def test_a_missing_path_is_one_error_and_the_others_run(tmp_path, cli):
    tree(tmp_path, **{"good.py": TRAIN})
    code, out, _ = cli("migrate", tmp_path / "missing.py", tmp_path / "good.py", "--in-place")
    assert code == 2 and "missing.py: error: no such file or directory" in out
    assert MIGRATED in (tmp_path / "good.py").read_bytes()


def test_dev_stdin_is_not_rewritten_in_place(tmp_path):
    script = tree(tmp_path, **{"s.py": TRAIN}) / "s.py"
    with open(script, "rb") as stdin:
        done = accrewrite("migrate", "/dev/stdin", "--in-place", cwd=tmp_path, stdin=stdin)
    assert done.returncode == 2 and "cannot rewrite a special file in place" in done.stdout
    assert script.read_bytes() == TRAIN


def test_a_read_only_directory_says_what_to_do(tmp_path):
    tree(tmp_path, **{"ro/t.py": TRAIN})
    (tmp_path / "ro").chmod(0o555)
    try:
        done = accrewrite("migrate", "ro", "--in-place", cwd=tmp_path)
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert done.returncode == 2
    assert f"cannot write in {tmp_path / 'ro'}: Permission denied; make it writable, or write migrated copies elsewhere with --output-dir" in " ".join(done.stdout.split())
    assert (tmp_path / "ro/t.py").read_bytes() == TRAIN


def test_sarif_locations_are_percent_encoded_uris(tmp_path, cli, monkeypatch):
    from urllib.parse import unquote_to_bytes

    names = [b"a b.py", b"p%20.py", b"h#1.py", "café.py".encode(), b"\xff.py"]
    for name in names:
        (tmp_path / os.fsdecode(name)).write_bytes(TRAIN)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("migrate", ".", str(tmp_path / "a b.py"), "--format", "sarif")
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in json.loads(out)["runs"][0]["results"]]
    assert code == 0 and len(uris) == len(names)
    for uri in uris:
        assert all(c.isascii() and (c.isalnum() or c in "-._~/%") for c in uri), uri
    assert sorted(unquote_to_bytes(uri) for uri in uris) == sorted(names)


def _dies_on_odd(task):
    if task % 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return task * 10


def test_the_worker_pool_gives_every_task_a_result_in_order():
    from accrewrite.workers import Lost, map_isolated

    done = []
    results = map_isolated(_dies_on_odd, list(range(7)), 2, None, lambda: done.append(1))
    assert results[0::2] == [0, 20, 40, 60] and len(done) == 7
    assert all(isinstance(r, Lost) and "crashed (SIGKILL)" in r.reason for r in results[1::2])
