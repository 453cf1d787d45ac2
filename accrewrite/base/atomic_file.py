"""Replace a file so that a concurrent reader sees the old file or the new one, never a mix.

``write_atomically(path, write)`` calls ``write(file)`` on a temporary in ``path``'s directory,
fsyncs it and renames it over ``path``. The codemod's in-place writes and the runtime's
``xm.save`` both go through it (this module imports neither libcst nor torch).

The file keeps its owner, group and mode. A rename gives the path a new file: another hard link
to the old one keeps the old content.

A temporary is named ``.<name>.<host>.<pid>.<random>.tmp``, so that a later writer can tell a
temporary left by a process killed while writing (its pid is gone) from one still being written,
and remove the first (``remove_orphans``). Only this machine's temporaries are judged: on a shared
filesystem a pid means nothing elsewhere.
"""

import contextlib
import errno
import os
import re
import secrets
import socket
import stat

_HOST = socket.gethostname()


def write_atomically(path, write, mode: int | None = None, sweep: bool = True) -> None:
    """Replace ``path`` by what ``write(file)`` writes. The file gets ``mode``, else the mode of
    the file it replaces, else what a plain ``open()`` would give. ``sweep`` first removes the
    orphaned temporaries of ``path`` (a writer of many files in one directory calls
    ``remove_orphans`` once instead)."""
    path = os.path.realpath(path)  # write through a symlink, keep the link
    directory, name = os.path.split(path)
    if sweep:
        remove_orphans(directory, name)
    temporary = os.path.join(directory, f".{name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(descriptor, "wb") as handle:
            try:
                replaced = os.stat(path)
            except FileNotFoundError:
                replaced = None
            if replaced is not None:
                _keep_owner(handle.fileno(), replaced)
            if mode is None and replaced is not None:
                mode = stat.S_IMODE(replaced.st_mode)
            if mode is not None:
                os.fchmod(handle.fileno(), mode)  # after the chown, which clears set-id bits
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _keep_owner(descriptor: int, replaced: os.stat_result) -> None:
    """Give the new file the owner and group of the one it replaces (root may; an owner may
    keep a group it is in). Where that is not allowed the write stops: the file would pass to
    another owner."""
    written = os.fstat(descriptor)
    if (written.st_uid, written.st_gid) == (replaced.st_uid, replaced.st_gid):
        return
    try:
        os.fchown(descriptor, replaced.st_uid, replaced.st_gid)
    except PermissionError:
        raise PermissionError(
            errno.EPERM, f"it belongs to uid {replaced.st_uid} and gid {replaced.st_gid}, which a file written by "
            f"uid {written.st_uid} cannot keep; run as its owner (or root)") from None


def is_temporary(filename: str) -> bool:
    """Whether ``filename`` (a base name) is a temporary of ``write_atomically``."""
    return _pattern(r".+").fullmatch(filename) is not None


def remove_orphans(directory, name: str | None = None) -> None:
    """Remove the temporaries in ``directory`` (of ``name`` only, when given) whose writing
    process no longer exists."""
    pattern = _pattern(re.escape(name) if name else r".+")
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):  # another writer removed it first
            os.unlink(os.path.join(directory, entry))


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"\.{name}\.{re.escape(_HOST)}\.(\d+)\.[0-9a-f]+\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True
