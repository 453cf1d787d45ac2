"""Entry points of installed packages (rule packs, targets). Reading them reads every installed
distribution's metadata, tens of milliseconds: it is done once per process, whatever the groups
asked for."""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def _installed() -> metadata.EntryPoints:
    return metadata.entry_points()


def entry_points(group: str) -> metadata.EntryPoints:
    return _installed().select(group=group)
