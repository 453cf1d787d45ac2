"""Entry points of installed packages (rule packs, targets). Reading them reads every installed
distribution's metadata, tens of milliseconds: it is done once per process, whatever the groups
asked for."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints


@functools.cache
def _installed() -> EntryPoints:
    from importlib import metadata  # tens of milliseconds to import: only a run that reads entry points pays

    return metadata.entry_points()


def entry_points(group: str) -> EntryPoints:
    return _installed().select(group=group)
