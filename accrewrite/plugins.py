"""Entry points of installed packages (rule packs, targets). Reading them reads every installed
distribution's metadata, tens of milliseconds: it is done once per process, whatever the groups
asked for, and only where some distribution's entry points name one of accrewrite's groups."""

from __future__ import annotations

import functools
import os
import sys
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints

# What every group accrewrite reads starts with, as a section of entry_points.txt.
_GROUPS = b"[accrewrite."


@functools.cache
def _installed() -> EntryPoints | tuple:
    if not _declared():
        return ()
    from importlib import metadata  # tens of milliseconds to import: only a run that reads entry points pays

    return metadata.entry_points()


def entry_points(group: str) -> EntryPoints | tuple:
    installed = _installed()
    return installed.select(group=group) if installed else ()


def _declared() -> bool:
    """Whether a distribution on the path may declare one of accrewrite's entry points: each
    metadata folder's entry_points.txt searched for the groups' prefix, a fraction of parsing
    them all. Where importlib.metadata would look elsewhere (a zip or an egg on the path,
    another finder of distributions), it is asked."""
    if any(hasattr(finder, "find_distributions") for finder in sys.meta_path if finder is not PathFinder):
        return True
    for entry in sys.path:
        if entry.lower().endswith(".egg"):  # an egg's metadata is its EGG-INFO folder
            return True
        try:
            with os.scandir(entry or ".") as children:
                if any(_declares(child) for child in children):
                    return True
        except NotADirectoryError:  # a zip archive
            return True
        except OSError:  # gone, or not readable: importlib.metadata skips it too
            continue
    return False


def _declares(child: os.DirEntry) -> bool:
    name = child.name.lower()
    if name.endswith(".egg"):  # its metadata is inside it, where importlib.metadata reads it
        return True
    if not name.endswith((".dist-info", ".egg-info")):
        return False
    try:
        with open(os.path.join(child.path, "entry_points.txt"), "rb") as handle:
            return _GROUPS in handle.read()
    except OSError:  # no entry points (or a lone PKG-INFO file of an old egg-info)
        return False
