"""What ``accrewrite verify`` lets a side touch, and how a side's processes end: the user's tree
is never written, whatever the script writes or deletes, and SIGTERM, SIGHUP or SIGINT to verify
end every process of the side, those that left its session included."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from accrewrite.cli import main
from accrewrite.verify import overlay, workspace

WRITER = """\
import os, shutil
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
scale = float(open("data/scale.txt").read()) + float(open("../../common/offset.txt").read())
torch.manual_seed(0)
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = (model(torch.ones(8, 4).to(device)) * scale).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
with open("log.txt", "a") as log:  # an existing file, appended to
    log.write("trained\\n")
open("config.txt", "w").write("overwritten")
open("checkpoints/last.txt", "w").write("into an empty folder")
os.remove("delete_me.txt")
open("../sibling/notes.txt", "w").write("overwritten")
os.remove("../sibling/gone.txt")
shutil.rmtree("../sibling/folder")
open("data/new.txt", "w").write("into the linked data folder")
open("data/scale.txt", "w").write("9")
torch.save(model.state_dict(), "ckpt.pt")  # over the 9 MB checkpoint: torch writes it from C++
with open("big.bin", "r+b") as big:
    big.write(b"scribbled")
"""


def tree(top: Path) -> dict[str, str]:
    """Every file and link under top (but the temporary folder), by path: its content's hash, or
    where the link points."""
    found = {}
    for directory, subdirs, files in os.walk(top):
        subdirs[:] = [name for name in subdirs if Path(directory, name) != top / "temp"]
        for name in subdirs + files:
            path = Path(directory) / name
            key = str(path.relative_to(top))
            if path.is_symlink():
                found[key] = "-> " + os.readlink(path)
            elif path.is_file():
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[key] = "dir"
    return found


def workspaces(temp: Path) -> list[Path]:
    return list(temp.glob("accrewrite-verify-*"))


@pytest.fixture
def user_tree(tmp_path, monkeypatch):
    """A repository whose experiment folder writes everywhere a script can: its folder, a sibling,
    a large checkpoint, a data folder linked from outside the repository."""
    repo = tmp_path / "repo"
    exp = repo / "projects" / "exp"
    exp.mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "common").mkdir()
    (repo / "common" / "offset.txt").write_text("0.25")
    (exp / "train.py").write_text(WRITER)
    (exp / "log.txt").write_text("before\n")
    (exp / "config.txt").write_text("lr=0.1")
    (exp / "delete_me.txt").write_text("keep me")
    (exp / "checkpoints").mkdir()
    (exp / "ckpt.pt").write_bytes(os.urandom(9 * 2**20))
    (exp / "big.bin").write_bytes(os.urandom(12 * 2**20))
    sibling = repo / "projects" / "sibling"
    (sibling / "folder").mkdir(parents=True)
    (sibling / "notes.txt").write_text("notes")
    (sibling / "gone.txt").write_text("still here")
    (sibling / "folder" / "inside.txt").write_text("inside")
    store = tmp_path / "datastore"
    store.mkdir()
    (store / "scale.txt").write_text("0.5")
    (exp / "data").symlink_to(store)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(exp)
    return tmp_path


@pytest.mark.slow
def test_the_users_tree_is_byte_for_byte_what_it_was(user_tree, capsys):
    before = tree(user_tree)
    assert main(["verify", "train.py"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "match: 3 steps" in out and "both ran to the script's end" in out
    assert tree(user_tree) == before
    assert not workspaces(user_tree / "temp")  # the workspace is gone too


READER = """\
import torch

scale = float(open("data/scale.txt").read()) + len(open("big.bin", "rb").read()) / 2**30
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = (model(torch.ones(8, 4)) * scale).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def bytes_written(workspace: Path) -> int:
    """The size of the workspace's files but the sides' records and logs (links count nothing)."""
    return sum(path.stat().st_size for path in workspace.rglob("*")
               if path.is_file() and not path.is_symlink() and "records" not in path.parts and path.suffix != ".log")


@pytest.mark.slow
def test_nothing_a_side_only_reads_is_copied(user_tree, capsys):
    Path("reader.py").write_text(READER)
    assert main(["verify", "reader.py", "--keep"]) == 0, capsys.readouterr()
    assert "read where they are" in capsys.readouterr().err
    workspace, = workspaces(user_tree / "temp")
    assert bytes_written(workspace) < 2**20  # the Python files, for each side; not the 21 MB it read
    view = workspace / "original" / "project" / "projects" / "exp"
    assert os.readlink(view / "big.bin") == str(Path.cwd() / "big.bin")


@pytest.mark.slow
def test_a_file_a_side_writes_is_copied_into_its_view_first(user_tree, capsys):
    assert main(["verify", "train.py", "--keep"]) == 0, capsys.readouterr()
    workspace, = workspaces(user_tree / "temp")
    # big.bin is written in place (r+b), so each of the 3 to 5 sides copies its 12 MB; ckpt.pt is truncated
    assert 3 * 12 * 2**20 <= bytes_written(workspace) < 6 * 12 * 2**20
    exp = workspace / "runtime" / "project" / "projects" / "exp"
    assert not (exp / "big.bin").is_symlink() and (exp / "big.bin").read_bytes()[:9] == b"scribbled"
    assert (exp / "data" / "scale.txt").read_text() == "9" and (exp / "log.txt").read_text() == "before\ntrained\n"


WRITERS = """\
import os, pathlib, shutil, tempfile
import numpy, torch

here = os.getcwd()
data = os.path.realpath("data")  # the linked folder, by its own path
open("log.txt", "a").write("appended")
with open("big.bin", "r+b") as big:
    big.write(b"scribbled")
open("config.txt", "w+").write("w+")
fd = os.open("delete_me.txt", os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"os.open")
os.close(fd)
os.truncate("ckpt.pt", 10)
os.chmod("config.txt", 0o600)
os.utime("log.txt", (0, 0))
os.replace("config.txt", "renamed.txt")
os.rename("../sibling/notes.txt", "../sibling/moved.txt")
os.remove("../sibling/gone.txt")
os.unlink(os.path.join(data, "scale.txt"))
open(os.path.join(data, "written.txt"), "w").write("by its full path")
os.makedirs(os.path.join(data, "new", "folder"))
torch.save({"w": torch.ones(2)}, os.path.join(here, "ckpt.pt"))
numpy.save("big.bin", numpy.zeros(3))  # a file's name: numpy writes it with open()
numpy.savez(pathlib.Path(data) / "arrays.npz", a=numpy.ones(2))
numpy.arange(3).tofile(os.path.join(data, "raw.bin"))
shutil.copy("delete_me.txt", "log.txt")
shutil.copy2("log.txt", os.path.join(data, "copied.txt"))
shutil.move("delete_me.txt", "../sibling/folder/inside.txt")
shutil.rmtree(os.path.realpath("../sibling/folder"))
pathlib.Path("checkpoints/note.txt").write_text("pathlib")
pathlib.Path("touched.txt").touch()
pathlib.Path("renamed.txt").unlink()
with tempfile.NamedTemporaryFile(dir=data) as temporary:  # os.open(O_CREAT | O_EXCL) in the linked folder
    temporary.write(b"temporary")
open(os.path.join(data, "exclusive.txt"), "x").write("made")
assert open("log.txt").read() == "os.open" and not os.path.exists("config.txt")
assert open(os.path.join(data, "written.txt")).read() == "by its full path"
assert torch.load("ckpt.pt")["w"].sum() == 2 and not os.path.exists("../sibling/folder")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.ones(8, 4)).pow(2).mean()
loss.backward()
optimizer.step()
"""


@pytest.fixture
def no_overlay(monkeypatch):
    """A system that forbids an overlay in a user namespace: the sides' processes redirect alone."""
    monkeypatch.setattr(overlay, "permitted", lambda scratch, folders: False)


@pytest.mark.slow
def test_every_way_a_script_writes_is_redirected_into_its_view(user_tree, no_overlay, capsys):
    Path("writers.py").write_text(WRITERS)
    before = tree(user_tree)
    assert main(["verify", "writers.py"]) == 0, capsys.readouterr()
    assert "wrote your files" not in capsys.readouterr().err
    assert tree(user_tree) == before


UNREDIRECTED = """\
import subprocess
import torch

subprocess.run(["sh", "-c", "printf scribbled | dd of=big.bin conv=notrunc status=none"], check=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(8, 4)).sum().backward()
optimizer.step()
"""


@pytest.mark.slow
def test_a_write_verify_cannot_redirect_is_named(user_tree, no_overlay, capsys):
    Path("shell.py").write_text(UNREDIRECTED)
    main(["verify", "shell.py", "--steps", "1"])
    err = capsys.readouterr().err
    assert "and an overlay" not in err
    assert f"original wrote your files: {Path.cwd() / 'big.bin'}; a write from C code" in err


@pytest.mark.slow
@pytest.mark.skipif(not overlay.permitted(Path(tempfile.mkdtemp()) / "check", [tempfile.gettempdir()]),
                    reason="this system forbids an overlay mounted in a user namespace")
def test_an_overlay_takes_the_writes_of_a_process_without_python(user_tree, capsys):
    Path("shell.py").write_text(UNREDIRECTED.replace("of=big.bin", "of=data/scale.txt"))
    before = tree(user_tree)
    assert main(["verify", "shell.py", "--steps", "1", "--keep"]) == 0, capsys.readouterr()
    err = capsys.readouterr().err
    assert "and an overlay of your folders" in err and "wrote your files" not in err
    assert tree(user_tree) == before
    workspace, = workspaces(user_tree / "temp")
    layers = sorted((workspace / "original.layers").glob("*/upper"))
    assert len(layers) == 2  # the repository, and the data folder its link leads to outside it
    written, = (layer / "scale.txt" for layer in layers if (layer / "scale.txt").exists())
    assert written.read_text() == "scribbled"


def test_the_overlaid_folders_are_the_top_ones_and_each_is_tried(tmp_path):
    assert overlay.tops(["/repo", "/repo/data", "/store", "/repository"]) == ["/repo", "/repository", "/store"]
    assert not overlay.permitted(tmp_path / "check", [str(tmp_path / "no such folder")])
    assert not (tmp_path / "check").exists()


@pytest.mark.slow
def test_a_temporary_folder_inside_the_project_is_not_copied_into_itself(user_tree, monkeypatch, capsys):
    inside = Path.cwd() / "tmp"
    inside.mkdir()
    monkeypatch.setenv("TMPDIR", str(inside))
    assert main(["verify", "train.py", "--steps", "1"]) == 0, capsys.readouterr()


SMALL_FILES = """\
import os, pathlib
import torch

total = sum(float(path.read_text()) for path in sorted(pathlib.Path("data/shards").iterdir()))
open("data/shards/" + "n" * 300, "w")  # a name too long: the original fails as it does for you
"""


@pytest.mark.slow
def test_a_dataset_of_small_files_is_linked_and_a_name_too_long_fails_as_it_does_for_the_user(user_tree, capsys):
    shards = user_tree / "datastore" / "shards"
    shards.mkdir()
    for index in range(2000):
        (shards / f"{index:04d}.txt").write_text("0.5")
    Path("small.py").write_text(SMALL_FILES)
    before = tree(user_tree)
    assert main(["verify", "small.py", "--keep"]) == 2
    err = capsys.readouterr().err
    assert "2012 files" in err and "File name too long" in err and "wrote your files" not in err
    assert tree(user_tree) == before
    workspace, = workspaces(user_tree / "temp")
    in_view = workspace / "original" / "project" / "projects" / "exp" / "data" / "shards"
    assert all(path.is_symlink() for path in in_view.iterdir())


def test_a_view_that_cannot_be_made_is_an_error_with_the_folder(user_tree, monkeypatch, capsys):
    def full(self, name, target, errors):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root / name))

    monkeypatch.setattr(workspace.Workspace, "view", full)
    assert main(["verify", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "verify could not go on in" in err and "No space left on device" in err and "original:" not in err


def test_root_must_hold_the_working_directory(user_tree, capsys):
    assert main(["verify", "train.py", "--root", str(user_tree / "datastore")]) == 2
    assert "does not hold the working directory" in capsys.readouterr().err


SPAWNER = """\
import os, subprocess, time
import torch

children = [subprocess.Popen(["sleep", "1000"]), subprocess.Popen(["sleep", "1001"], start_new_session=True)]
with open(os.environ["PIDS"], "w") as pids:
    pids.write(" ".join(str(pid) for pid in [os.getpid(), *(child.pid for child in children)]))
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    loss = model(torch.ones(4, 2)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to see which processes live")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), pytest.param(signal.SIGHUP, 129, marks=pytest.mark.slow),
                                          pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_a_signal_to_verify_ends_every_process_of_the_side_and_the_workspace(tmp_path, signum, code):
    project = tmp_path / "project"
    project.mkdir()
    (project / "spawner.py").write_text(SPAWNER)
    temp = tmp_path / "temp"
    temp.mkdir()
    pids = tmp_path / "pids"
    env = {**os.environ, "TMPDIR": str(temp), "PIDS": str(pids)}
    # Default dispositions: a test run started in the background ignores SIGINT, which its children inherit.
    verify = subprocess.Popen([sys.executable, "-m", "accrewrite.cli", "verify", "spawner.py"], cwd=project,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    started = [int(pid) for pid in pids.read_text().split()]
    assert all(_alive(pid) for pid in started)
    verify.send_signal(signum)
    out, err = verify.communicate(timeout=60)
    assert verify.returncode == code, err
    assert f"stopped by {signal.Signals(signum).name}" in err or signum == signal.SIGINT
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in started)  # the script, its child, and the one in its own session
    assert not workspaces(temp)


@pytest.mark.slow
def test_a_file_outside_the_copied_project_is_named_with_the_fix(tmp_path, monkeypatch, capsys):
    # No repository: the working directory is the project, and ../data is outside it.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scale.txt").write_text("0.5")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "train.py").write_text("import torch\nscale = float(open('../data/scale.txt').read())\n")
    monkeypatch.chdir(tmp_path / "exp")
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["verify", "train.py"]) == 2
    assert "name a folder that holds it with --root" in capsys.readouterr().err
