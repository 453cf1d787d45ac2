"""The kernel's overlay filesystem over the user's folders, for a side's processes, where the
system permits it: each side runs in a user and mount namespace of its own (``unshare``) in which
each of the user's top folders (the project, and each folder its links lead to outside it) is
covered by an overlay whose lower layer is the folder itself and whose upper layer is the side's.
Then any write there, from C code or from a process without Python too, lands in the side's
layer, and the user's folder is never written. Many containers forbid a user namespace or an
overlay mounted in one: that is tried once, and verify then relies on the redirection in the
side's processes alone (``redirect``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

_CHECK_TIMEOUT = 10  # seconds
_UNSHARE = ("unshare", "--user", "--map-current-user", "--mount", "--")
_UNSAFE = ",:\\"  # characters mount's lowerdir/upperdir options cannot hold


def permitted(scratch: Path) -> bool:
    """Whether this system mounts an overlay in a user namespace: tried in ``scratch``, then
    removed."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    layers = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    try:
        for folder in layers.values():
            folder.mkdir(parents=True)
        (layers["lower"] / "file").write_text("lower")
        done = subprocess.run(command([(layers["lower"], scratch)], ["sh", "-c", "echo upper > file"],
                                      at=layers["merged"]),
                              cwd="/", capture_output=True, timeout=_CHECK_TIMEOUT)
        return (done.returncode == 0 and (layers["lower"] / "file").read_text() == "lower"
                and (scratch / "upper" / "file").read_text() == "upper\n")
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def tops(folders: list[str]) -> list[str]:
    """The folders of ``folders`` (real paths) that no other of them holds."""
    found = set(folders)
    return sorted(folder for folder in found
                  if not any(parent in found for parent in map(str, Path(folder).parents)))


def mountable(folder: str) -> bool:
    return not any(character in folder for character in _UNSAFE)


def command(mounts: list[tuple[Path, Path]], argv: list[str], at: Path | None = None) -> list[str]:
    """``argv`` run with each (folder, layers) of ``mounts`` covered by an overlay whose upper
    layer is in ``layers`` (its ``upper`` and ``work`` folders, made here); at ``at`` instead of
    over the folder where given (the check)."""
    lines = ["set -e"]
    for folder, layers in mounts:
        upper, work = layers / "upper", layers / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={folder},upperdir={upper},workdir={work}"
        lines.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(at or folder))}")
    if at is not None:
        lines.append(f"cd {shlex.quote(str(at))}")
    lines.append('exec "$@"')
    return [*_UNSHARE, "sh", "-c", "\n".join(lines), "sh", *argv]
