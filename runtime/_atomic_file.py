"""Replace a file so that a concurrent reader sees the old file or the new one, never a mix.

``write_atomically(path, write)`` calls ``write(file)`` on a temporary in ``path``'s directory,
fsyncs it and renames it over ``path``. A temporary is named ``.<name>.<host>.<pid>.<random>.tmp``
so that the next write of the same path can tell a temporary left by a process that was killed
while writing (its pid is gone) from one still being written, and remove the first. Only this
machine's temporaries are judged: on a shared filesystem a pid means nothing elsewhere.
"""

import contextlib
import os
import re
import secrets
import socket
import stat


def write_atomically(path, write) -> None:
    path = os.path.realpath(path)  # write through a symlink, keep the link
    directory, name = os.path.split(path)
    prefix = f".{name}.{socket.gethostname()}."
    _remove_orphans(directory, prefix)
    temporary = os.path.join(directory, f"{prefix}{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # 0o666 as a plain open() would give (the umask applies)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its mode
                os.fchmod(handle.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _remove_orphans(directory: str, prefix: str) -> None:
    """Remove the temporaries starting with ``prefix`` whose writing process no longer exists."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.[0-9a-f]+\.tmp")
    for entry in os.listdir(directory):
        match = pattern.fullmatch(entry)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):  # another writer removed it first
            os.unlink(os.path.join(directory, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
