"""Why a file could not be migrated: the error every stage reports in, one per file."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FileError:
    """Why a file could not be migrated, with the line (1-based; 0 when unknown) and, in a
    notebook, the cell that line counts in (0 elsewhere)."""

    reason: str
    line: int = 0
    col: int = 0
    cell: int = 0


class MigrationError(Exception):
    def __init__(self, error: FileError):
        super().__init__(error.reason)
        self.error = error
