"""What ``accrewrite verify`` installs in every Python process of a side, beside the probe, so
that the side never writes the user's files. ``hooks/sitecustomize.py`` loads it by its path; it
acts wherever ``ACCREWRITE_VERIFY_FOLDERS`` is set.

A side's view (``workspace``) holds a link to each of the user's files, which the side reads
where it is. A write that would follow such a link, or that names a path in the user's tree
(written out in full, or reached through a link of the project's), is redirected first: the path
becomes the side's own in its view, and a link there becomes a copy of the file it points to (an
empty file where the write truncates it), so the write lands in the side's space (copy-on-write).
A rename, a delete or a new folder takes the view's path, where it moves or removes a link.

Redirected: ``open`` and ``io.open`` (so pathlib, numpy's ``save``/``savez``, PIL's ``Image.save``
and ``shutil``'s copies), ``os.open``, ``os.truncate``, ``os.chmod``, ``os.utime``, ``os.rename``,
``os.replace``, ``os.remove``, ``os.unlink``, ``os.rmdir``, ``os.mkdir`` (so ``os.makedirs``),
``os.symlink``, ``os.link``, ``shutil.rmtree`` and ``torch.save``, which writes from C++
(numpy's ``tofile`` opens its file with ``io.open``). A path relative to a folder's descriptor
(``dir_fd``) is left as it is: ``shutil.rmtree`` walks the view's folders so. A write from C
code (an extension's own files, through ``fopen``) or from a process without Python is not
redirected: verify finds it after the side by the sizes and times of the user's files
(``Workspace.written``) and says so.

``ACCREWRITE_VERIFY_FOLDERS`` names a JSON file: ``{"workspace": W, "folders": {REAL: VIEW}}``,
each of the user's folders (its real path) and the side's folder for it. Nothing under W is the
user's. It imports only the standard library, so that it runs in any interpreter.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import sys

FOLDERS = "ACCREWRITE_VERIFY_FOLDERS"
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_workspace = ""
_folders: dict[str, str] = {}  # the real path of a folder of the user's -> the side's folder for it


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _mapped(real: str) -> str | None:
    """The side's path for the real path ``real`` in the user's tree; None where it is not there."""
    if _inside(real, _workspace):
        return None
    folder, names = real, []
    while folder not in _folders:
        parent, name = os.path.split(folder)
        if parent == folder:
            return None
        names.append(name)
        folder = parent
    return os.path.join(_folders[folder], *reversed(names))


def _as_path(path) -> str | None:
    """``path`` as an absolute str; None for a descriptor, which is written as it is."""
    if isinstance(path, int):
        return None
    return os.path.abspath(os.fsdecode(os.fspath(path)))


def entry(path, dir_fd=None):
    """The path to rename, remove or make in place of ``path``: the view's where it names an
    entry of the user's tree (its folder's links followed, not its own)."""
    absolute = _as_path(path) if dir_fd is None else None
    if absolute is None:
        return path
    folder, name = os.path.split(absolute)
    redirected = _mapped(os.path.join(os.path.realpath(folder), name))
    if redirected is None:
        return path
    os.makedirs(os.path.dirname(redirected), exist_ok=True)
    return redirected


def written(path, keep: bool, dir_fd=None):
    """The path to write in place of ``path``, made the side's own first: the view's where
    ``path`` reaches the user's tree, a link there replaced by a copy of its file (an empty
    file where ``keep`` is false: the write truncates it)."""
    absolute = _as_path(path) if dir_fd is None else None
    if absolute is None:
        return path
    redirected = None
    if os.path.islink(absolute):  # the write would follow it: the link becomes the side's file
        folder, name = os.path.split(absolute)
        real_folder = os.path.realpath(folder)
        redirected = absolute if _inside(real_folder, _workspace) else _mapped(os.path.join(real_folder, name))
    redirected = redirected or _mapped(os.path.realpath(absolute))
    if redirected is None:
        return path
    _own(redirected, os.path.realpath(absolute), keep)
    return redirected


def _own(path: str, source: str, keep: bool) -> None:
    """Make ``path`` a file of the side's, with the content of ``source`` where ``keep``."""
    if os.path.lexists(path) and not os.path.islink(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if _inside(source, _workspace) or not os.path.isfile(source):
        return  # a link of the side's own to its own file, or a new file
    if os.path.lexists(path):
        os.unlink(path)
    if keep:
        shutil.copy2(source, path)
    else:
        _builtin_open(path, "wb").close()
        shutil.copymode(source, path)


_builtin_open = builtins.open


def _open(file, mode="r", *args, **kwargs):
    if not isinstance(mode, str) or not any(letter in mode for letter in "wax+"):
        return _builtin_open(file, mode, *args, **kwargs)
    if "x" in mode:  # made only where nothing is there: the view's path, nothing to copy
        return _builtin_open(entry(file), mode, *args, **kwargs)
    return _builtin_open(written(file, keep="w" not in mode), mode, *args, **kwargs)


def _wrap_os(name: str, redirect, leading=("path",)) -> None:
    """``os.NAME`` with its paths redirected; its ``leading`` parameters, where named by keyword,
    passed by position."""
    original = getattr(os, name)

    def wrapper(*args, **kwargs):
        for parameter in leading[len(args):]:
            if parameter not in kwargs:
                break
            args = (*args, kwargs.pop(parameter))
        return original(*redirect(args, kwargs), **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = original.__doc__
    setattr(os, name, wrapper)


def _os_open(args, kwargs):
    if len(args) < 2:  # no flags: os.open says what is wrong
        return args
    flags = args[1]
    if not flags & _WRITES:
        return args
    if flags & os.O_EXCL:  # made only where nothing is there (tempfile's files)
        return (entry(args[0], kwargs.get("dir_fd")), *args[1:])
    return (written(args[0], not flags & os.O_TRUNC, kwargs.get("dir_fd")), *args[1:])


def _followed(args, kwargs):
    """``truncate``, ``chmod``, ``utime``: they follow a link unless told not to."""
    if not args:
        return args
    if not kwargs.get("follow_symlinks", True):
        return (entry(args[0], kwargs.get("dir_fd")), *args[1:])
    return (written(args[0], True, kwargs.get("dir_fd")), *args[1:])


def _entries(count: int, fd_names=("dir_fd",)):
    def redirect(args, kwargs):
        fds = [kwargs.get(name) for name in fd_names] + [None] * count
        return (*(entry(path, fd) for path, fd in zip(args[:count], fds)), *args[count:])
    return redirect


def _rmtree(path, *args, **kwargs):
    return _shutil_rmtree(entry(path) if kwargs.get("dir_fd") is None else path, *args, **kwargs)


_shutil_rmtree = shutil.rmtree


def _save_through(torch) -> None:
    """``torch.save`` to a path: made the side's own, as the C++ writer opens it by its name."""
    save = torch.save

    def saved(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)):
            f = written(f, keep=False)
        return save(obj, f, *args, **kwargs)

    saved.__doc__ = save.__doc__
    torch.save = torch.serialization.save = saved


def start() -> None:
    """Install the redirection, where verify gave the side its folders."""
    global _workspace, _folders
    if not os.environ.get(FOLDERS):
        return
    with _builtin_open(os.environ[FOLDERS]) as given:
        found = json.load(given)
    _workspace, _folders = os.path.realpath(found["workspace"]), found["folders"]
    builtins.open = io.open = _open
    _wrap_os("open", _os_open, ("path", "flags"))
    for name in ("truncate", "chmod", "utime"):
        _wrap_os(name, _followed)
    for name in ("remove", "unlink", "rmdir", "mkdir"):
        _wrap_os(name, _entries(1))
    for name in ("rename", "replace"):
        _wrap_os(name, _entries(2, ("src_dir_fd", "dst_dir_fd")), ("src", "dst"))
    for name in ("symlink", "link"):  # the link made is redirected, not what it points to
        _wrap_os(name, lambda args, kwargs: (*args[:1], *_entries(1)(args[1:], kwargs)), ("src", "dst"))
    shutil.rmtree = _rmtree
    if "torch" in sys.modules:  # the probe imported it
        _save_through(sys.modules["torch"])
