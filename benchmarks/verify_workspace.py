"""``accrewrite verify`` on a project with a large data folder: how soon its first side starts and
how much it writes outside its records.

    python benchmarks/verify_workspace.py [--gib 20] [--files 20] [--linked]

The project is a training script beside ``data/``: ``--files`` sparse files (``truncate``) of
``--gib`` GiB in all, in the project or, with ``--linked``, in a folder beside it that
``data`` links to (``data -> ../elsewhere/data``). The script reads the first MiB of each file,
then makes ``--steps`` optimizer steps. verify runs it with ``--steps 2 --keep`` (an original,
its runtime migration, a nudged rerun); then:

* first side: seconds from verify's start to the launch of its first side (when verify wrote the
  side's redirection, just before it starts the side's process), verify's own start and the
  preflight (each interpreter asked to import torch and what its side needs) included;
* the workspace's part of it: the project surveyed and the first side's view made, timed apart
  in this process;
* first line: seconds from verify's start to the first line the script prints, its
  interpreter's start (torch imported by the probe) included;
* written: the bytes the kept workspace holds on disk (its files' blocks, links and folders
  included), the sides' records and logs left out;
* whole: verify's seconds to its end.

The user's tree is hashed (each file's size, time and first MiB) before and after, and must be
the same.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accrewrite.verify.workspace import Workspace

SCRIPT = """\
import time
print("started", time.time(), flush=True)
import pathlib
import torch

head = sum(len(path.open("rb").read(2**20)) for path in sorted(pathlib.Path("data").iterdir()))
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(8, 4) * head / 2**30).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def make_project(top: Path, gib: int, files: int, linked: bool) -> Path:
    project = top / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    data = top / "elsewhere" / "data" if linked else project / "data"
    data.mkdir(parents=True)
    for index in range(files):
        with open(data / f"shard{index:05d}.bin", "wb") as shard:
            shard.write(b"x" * 4096)
            shard.truncate(gib * 2**30 // files)
    if linked:
        (project / "data").symlink_to(data)
    return project


def fingerprint(top: Path) -> str:
    digest = hashlib.sha256()
    for directory, subdirs, files in sorted(os.walk(top, followlinks=True)):
        subdirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            found = path.stat()
            digest.update(f"{path} {found.st_size} {found.st_mtime_ns}".encode())
            digest.update(path.open("rb").read(2**20))
    return digest.hexdigest()


def on_disk(workspace: Path) -> int:
    """Bytes of blocks the workspace's entries hold, records and logs left out."""
    total = 0
    for directory, subdirs, files in os.walk(workspace):
        subdirs[:] = [name for name in subdirs if not (directory == str(workspace) and name == "records")]
        for name in subdirs + files:
            path = Path(directory, name)
            if path.suffix != ".log":
                total += path.lstat().st_blocks * 512
    return total


def workspace_seconds(project: Path, temp: Path) -> float:
    """Seconds to survey the project and make the first side's view, as verify does."""
    root = Path(tempfile.mkdtemp(dir=temp))
    started = time.perf_counter()
    workspace = Workspace(root, project, project / "train.py", project)
    workspace.survey()
    workspace.view("original", None, [])
    workspace.redirection("original")
    return time.perf_counter() - started


def run(gib: int, files: int, linked: bool) -> dict:
    with tempfile.TemporaryDirectory() as top:
        top = Path(top)
        project = make_project(top, gib, files, linked)
        temp = top / "temp"
        temp.mkdir()
        before = fingerprint(project)
        started = time.time()
        done = subprocess.run([sys.executable, "-m", "accrewrite", "verify", "train.py", "--target", "runtime",
                               "--steps", "2", "--keep"], cwd=project, env={**os.environ, "TMPDIR": str(temp)},
                              capture_output=True, text=True)
        whole = time.time() - started
        workspace, = temp.glob("accrewrite-verify-*")
        line = next(line for line in (workspace / "original.log").read_text().splitlines()
                    if line.startswith("started"))
        if fingerprint(project) != before:
            raise SystemExit("the user's tree changed")
        launched = (workspace / "original.folders.json").stat().st_mtime  # written just before the side starts
        return {"returncode": done.returncode, "first side": launched - started,
                "workspace": workspace_seconds(project, temp), "first line": float(line.split()[1]) - started,
                "written": on_disk(workspace), "whole": whole, "workspace line": done.stderr.splitlines()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=20)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--linked", action="store_true")
    args = parser.parse_args()
    result = run(args.gib, args.files, args.linked)
    print(f"{args.gib} GiB in {args.files} files, {'linked' if args.linked else 'in the project'}: "
          f"verify exit {result['returncode']}; first side launched after {result['first side']:.2f} s "
          f"(survey and view {result['workspace']:.3f} s), its first line after {result['first line']:.2f} s; "
          f"{result['written'] / 2**20:.2f} MiB written outside the records; {result['whole']:.1f} s in all")
    print(result["workspace line"])


if __name__ == "__main__":
    main()
