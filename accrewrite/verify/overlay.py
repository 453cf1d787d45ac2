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
_CHECK = ".accrewrite-verify-overlay-check"  # the file the check makes in each overlay


def permitted(scratch: Path, folders: list[str]) -> bool:
    """Whether this system mounts an overlay of each of ``folders`` in a user namespace: tried
    in ``scratch``, mounted there, a file made in each (it must land in the upper layer), then
    removed."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    mounts = [(Path(folder), scratch / str(index), scratch / str(index) / "merged")
              for index, folder in enumerate(folders)]
    try:
        for _, _, merged in mounts:
            merged.mkdir(parents=True)
        made = " && ".join(f"echo upper > {shlex.quote(str(merged / _CHECK))}" for _, _, merged in mounts)
        done = subprocess.run(command(mounts, ["sh", "-c", made]), cwd="/", capture_output=True,
                              timeout=_CHECK_TIMEOUT)
        return done.returncode == 0 and all((layers / "upper" / _CHECK).is_file() and not (folder / _CHECK).exists()
                                            for folder, layers, _ in mounts)
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


def command(mounts: list[tuple[Path, Path, Path]], argv: list[str]) -> list[str]:
    """``argv`` run where each (folder, layers, place) of ``mounts`` has an overlay of the folder
    mounted at the place, its upper layer in ``layers`` (``upper`` and ``work``, made here)."""
    lines = ["set -e"]
    for folder, layers, place in mounts:
        upper, work = layers / "upper", layers / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={folder},upperdir={upper},workdir={work}"
        lines.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(place))}")
    lines.append('exec "$@"')
    return [*_UNSHARE, "sh", "-c", "\n".join(lines), "sh", *argv]
