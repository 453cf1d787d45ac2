"""Jupyter notebooks: their code cells migrated as one module-level script, and written back
cell by cell.

The script is every code cell's source in order (a device chosen in cell 3 is known in cell 9).
IPython's own syntax is not Python: a magic or shell escape (``%matplotlib inline``, ``!pip
install x``, ``files = !ls``, ``model?``, ``%%time``) becomes ``pass`` in the script, with a
marker naming it, so that a block it sits in stays valid and the analysis reads around it; a
cell whose magic makes its body something else than Python (``%%bash``) is left out, and one
that writes a Python module (``%%writefile train.py``) is that module, migrated as a file of its
own. The migrated script is cut back into cells by matching its lines to the script's: a line a
rule adds goes to the cell of the line before it (imports: the cell they join). The markers are
then put back as the lines they stand for.

Only the sources of the cells that changed are written, each in the spelling the file had (a
list of lines or one string, its indentation, its line ends): outputs, metadata, cell ids and
the rest of the JSON stay byte for byte. nbformat reads the file (a version 3 notebook is read
as version 4, for a preview); it is imported only when a notebook is given.
"""

from __future__ import annotations

import codecs
import functools
import io
import itertools
import json
import logging
import re
import tokenize
import warnings
from dataclasses import dataclass, field

from accrewrite.errors import FileError, MigrationError
from accrewrite.unified_diff import line_opcodes

SUFFIX = ".ipynb"

# Cell magics whose body is Python run by IPython; any other makes the whole cell opaque.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})
_MARKER = "# accrewrite:ipython:"
_MASKED = re.compile(r"^([ \t]*)(?:pass  )?# accrewrite:ipython:(\d+)$")
# An IPython line: a magic or shell escape (``%``, ``!``), one assigned (``x = !ls``), or help.
_IPYTHON = re.compile(
    r"[ \t]*(?:[%!]|[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*[%!][\w!]"
    r"|\?{1,2}[\w.]+[ \t]*$|[\w.]+\?{1,2}[ \t]*$)"
)
_SOURCE_KEY = re.compile(r'"source"\s*:\s*')


def is_notebook(path: str) -> bool:
    return str(path).endswith(SUFFIX)


def python_of(path, data: bytes) -> bytes:
    """The Python a file holds: a notebook's script (nothing, where it cannot be read), else
    the file's bytes."""
    if not is_notebook(path):
        return data
    try:
        return Notebook.read(data).script()
    except MigrationError:
        return b""


@dataclass
class Cell:
    """A code cell: its number among all the notebook's cells (1-based, as Jupyter shows them),
    its source, and its lines in the script (none for an opaque cell)."""

    number: int
    source: str
    script: list[str] = field(default_factory=list)
    # The IPython lines the script's markers stand for, by marker: (indentation, lines).
    ipython: dict[int, tuple[str, list[str]]] = field(default_factory=dict)
    # A ``%%writefile x.py`` cell: the Python module it writes, migrated as a file of its own.
    writes: str | None = None

    def written(self) -> tuple[str, bytes]:
        """A ``%%writefile`` cell's first line, and the module it writes."""
        magic, _, body = self.source.partition("\n")
        return magic + "\n", body.encode()


@dataclass
class Notebook:
    text: str  # the file's JSON
    cells: list[Cell]  # its code cells
    sources: list[str]  # every cell's source, markdown too, as nbformat reads it
    bom: bytes = b""  # a UTF-8 byte order mark the file starts with, written back

    @classmethod
    def read(cls, data: bytes) -> Notebook:
        """The notebook in ``data``, or a MigrationError that says what is wrong with it."""
        bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
        try:
            text = data[len(bom):].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MigrationError(FileError(f"cannot decode the notebook as UTF-8: byte {data[exc.start]:#04x} "
                                           "is invalid; Jupyter writes notebooks in UTF-8")) from None
        cells = _cells(text)
        notebook = cls(text, [], [source for _, source in cells], bom)
        markers = itertools.count()
        for number, (kind, source) in enumerate(cells, start=1):
            if kind == "code":
                notebook.cells.append(_masked(number, source, markers))
        return notebook

    def script(self) -> bytes:
        """The code cells as one script, IPython lines masked."""
        return "".join(line for cell in self.cells for line in cell.script).encode()

    def migrated(self, output: bytes) -> bytes:
        """The notebook's bytes once its script is migrated to ``output``."""
        return self.with_sources(self.migrated_sources(output))

    def runnable(self) -> tuple[bytes, list[str]]:
        """The code cells as a script Python runs, as Jupyter would run them in order, and the
        IPython lines it skips (each left as ``pass`` and a comment saying what it was)."""
        lines, skipped = [], []
        for cell in self.cells:
            for line in cell.script:
                match = _MASKED.match(line.rstrip("\n"))
                if match is None:
                    lines.append(line)
                    continue
                _, taken = cell.ipython[int(match.group(2))]
                if line.lstrip().startswith("pass"):
                    skipped.append(taken[0].strip())
                    lines.append(f"{match.group(1)}pass  # IPython, not run: {taken[0].strip()}\n")
        if re.search(r"\bdisplay\(", "".join(lines)):  # Jupyter's built-in
            lines[:0] = ["try:  # Jupyter's built-in display()\n", "    from IPython.display import display\n",
                         "except ImportError:\n", "    display = print\n"]
        return "".join(lines).encode(), skipped

    def position(self, line: int) -> tuple[int, int]:
        """(cell number, line in the cell) of a line of the script (1-based); (0, 0) for none."""
        if line < 1:
            return 0, 0
        for cell in self.cells:
            if line <= len(cell.script):
                return cell.number, line
            line -= len(cell.script)
        return 0, 0

    def migrated_sources(self, output: bytes) -> dict[int, str]:
        """The new source of each cell the migrated script ``output`` changes, by cell number."""
        before = [line for cell in self.cells for line in cell.script]
        owner = [index for index, cell in enumerate(self.cells) for _ in cell.script]
        after = output.decode().splitlines(keepends=True)
        # Lines inserted before the script's first line of Python (only installs and magics come
        # before it) join that line's cell, where the notebook's own imports are; others, the
        # cell of the line before them.
        python = next((index for index, line in enumerate(before)
                       if line.strip() and not _MASKED.match(line.rstrip("\n"))), len(before) - 1)
        pieces: list[list[str]] = [[] for _ in self.cells]
        for tag, i1, i2, j1, j2 in line_opcodes(before, after):
            for offset, line in enumerate(after[j1:j2]):
                if tag == "insert":
                    index = owner[python] if i1 <= python else owner[i1 - 1]
                else:
                    index = owner[min(i1 + offset, i2 - 1)]
                pieces[index].append(line)
        changed = {}
        for cell, lines in zip(self.cells, pieces):
            if lines != cell.script:
                source = _unmasked(cell, _opening_first(cell, lines))
                if source != cell.source:
                    changed[cell.number] = source
        return changed

    def with_sources(self, changed: dict[int, str]) -> bytes:
        """The file's bytes with the sources of the cells in ``changed`` replaced, each spelled
        as the file spells it, and nothing else touched."""
        text, pieces, at = self.text, [], 0
        for number in sorted(changed):
            start, end = self._spans[number - 1]
            pieces += [text[at:start], _spelled(changed[number], text, start, end, _ascii_only(text))]
            at = end
        pieces.append(text[at:])
        return self.bom + "".join(pieces).encode()

    @functools.cached_property
    def _spans(self) -> list[tuple[int, int]]:
        return _source_spans(self.text, self.sources)

    def file_line(self, number: int, line: int) -> int:
        """The line of the file where line ``line`` of cell ``number`` is written (a source
        written as a list of lines puts one on each), for the formats that point into the
        file."""
        try:
            start, end = self._spans[number - 1]
        except MigrationError:
            return 1
        first = self.text.count("\n", 0, start) + 1
        listed = self.text[start:end].count("\n") > 0
        return first + line if listed else first


def _cells(text: str) -> list[tuple[str, str]]:
    """(cell type, source) of every cell, as nbformat reads the notebook."""
    import nbformat

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("traitlets").disabled = True  # nbformat logs a schema it finds invalid
            try:
                notebook = nbformat.reads(text, as_version=4)
            finally:
                logging.getLogger("traitlets").disabled = False
    except nbformat.reader.NotJSONError:
        raise MigrationError(FileError(_not_json(text))) from None
    except Exception as exc:  # noqa: BLE001 - nbformat raises what its validator or converter meets
        raise MigrationError(FileError(f"not a notebook nbformat can read ({_first_line(exc)}); "
                                       "open and save it in Jupyter, or fix its JSON")) from None
    cells = []
    for number, cell in enumerate(notebook.get("cells", []), start=1):
        source = cell.get("source") if isinstance(cell, dict) else None
        if not isinstance(source, str):
            raise MigrationError(FileError(f"cell {number} has no source text; open and save it in Jupyter"))
        cells.append((cell.get("cell_type", ""), source))
    return cells


def _not_json(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not a notebook: its JSON is invalid at line {exc.lineno}, column {exc.colno} ({exc.msg})"
    return "not a notebook: its JSON is not an object with cells"


def _first_line(exc: Exception) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line if len(line) <= 100 else line[:97] + "..."


def _masked(number: int, source: str, markers) -> Cell:
    """A code cell with its script lines: IPython lines masked, an opaque cell left out."""
    cell = Cell(number, source)
    lines = source.splitlines(keepends=True)
    if not lines:
        return cell
    magic = lines[0].strip()[2:].split() if lines[0].lstrip().startswith("%%") else []
    if magic and magic[0] not in _PYTHON_CELL_MAGICS:
        if magic[0] == "writefile" and len(magic) == 2 and magic[1].endswith(".py"):  # not -a: a whole module
            cell.writes = magic[1]
        return cell
    rows = [line.rstrip("\r\n") for line in lines]
    continuing = None  # tokenized only where a line looks like IPython's: most cells have none
    index = 0
    while index < len(rows):
        row = rows[index]
        ipython = _IPYTHON.match(row)
        if ipython and continuing is None:
            continuing = _continuation_rows(source)
        if ipython and index + 1 not in continuing:
            marker = next(markers)
            taken = [row]
            while taken[-1].endswith("\\") and index + len(taken) < len(rows):  # continued on the next line
                taken.append(rows[index + len(taken)])
            indent = row[:len(row) - len(row.lstrip())]
            cell.ipython[marker] = (indent, taken)
            cell.script.append(f"{indent}pass  {_MARKER}{marker}\n")
            cell.script += [f"{_MARKER}{marker}\n"] * (len(taken) - 1)  # comments fit any indentation
            index += len(taken)
        else:
            cell.script.append(row + "\n")
            index += 1
    return cell


def _continuation_rows(source: str) -> set[int]:
    """The lines (1-based) that continue a statement (inside brackets or a string, after a
    backslash): there a leading ``%`` or ``!`` is Python."""
    rows: set[int] = set()
    open_statement, row = False, 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if open_statement and token.start[0] > row:
                rows.add(token.start[0])
            rows.update(range(token.start[0] + 1, token.end[0] + 1))
            row = token.end[0]
            if token.type == tokenize.NEWLINE:
                open_statement = False
            elif token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                open_statement = True
    except (tokenize.TokenError, SyntaxError):  # IPython's syntax may end the tokens early
        pass
    return rows


def _opening_first(cell: Cell, lines: list[str]) -> list[str]:
    """The IPython lines that open a cell stay at its top: a cell magic must be its first line,
    and a ``!pip install`` runs before the imports a rule adds."""
    opening = list(itertools.takewhile(_MASKED.match, cell.script))
    if lines[:len(opening)] == opening:
        return lines
    kept = set(opening)
    return [line for line in lines if line in kept] + [line for line in lines if line not in kept]


def _unmasked(cell: Cell, lines: list[str]) -> str:
    """The cell's new source from its migrated script lines: each marker's first line becomes
    the IPython lines it stands for (indented as the migration left it), its other lines go."""
    out, seen = [], set()
    for line in lines:
        match = _MASKED.match(line.rstrip("\r\n"))
        if match is None:
            out.append(line)
            continue
        marker = int(match.group(2))
        if line.lstrip().startswith("#"):
            continue  # a continuation line: its marker's first line brings it back
        indent, taken = cell.ipython[marker]
        shift = match.group(1)
        out.append(shift + taken[0][len(indent):] + "\n")
        out += [row + "\n" for row in taken[1:]]
        seen.add(marker)
    if seen != set(cell.ipython):
        raise MigrationError(FileError(
            f"internal error: the migration dropped an IPython line of cell {cell.number}; "
            "the notebook was left unchanged; please report it with the notebook"))
    source = "".join(out)
    return source if cell.source.endswith("\n") else source.removesuffix("\n")


def _source_spans(text: str, sources: list[str]) -> list[tuple[int, int]]:
    """Where each cell's source value is written in the file: (start, end) offsets."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    for number, source in enumerate(sources, start=1):
        for match in _SOURCE_KEY.finditer(text, at):
            try:
                value, end = decoder.raw_decode(text, match.end())
            except json.JSONDecodeError:
                continue
            if (value if isinstance(value, str) else "".join(value) if isinstance(value, list) else None) == source:
                spans.append((match.end(), end))
                at = end
                break
        else:
            raise MigrationError(FileError(
                f"cannot find cell {number}'s source in the file (a version 3 notebook?); open and save it "
                "in a current Jupyter, which writes version 4, then migrate it"))
    return spans


def _ascii_only(text: str) -> bool:
    """Whether the file escapes non-ASCII characters (``\\u00e9``) rather than writing them."""
    return text.isascii() and re.search(r"\\u(?:00[89a-fA-F]|0[1-9a-fA-F]|[1-9a-fA-F])", text) is not None


def _spelled(source: str, text: str, start: int, end: int, ascii_only: bool) -> str:
    """``source`` as JSON in place of the value at ``text[start:end]``, spelled as that value
    is: one string, or a list of lines laid out as the file lays out its lists."""
    old = text[start:end]
    if old.startswith('"'):
        return json.dumps(source, ensure_ascii=ascii_only)
    lines = [json.dumps(line, ensure_ascii=ascii_only) for line in source.splitlines(keepends=True)]
    if not lines:
        return "[]"
    layout = re.match(r"\[(\r?\n)([ \t]*)", old)
    if layout is not None:
        newline, indent = layout.groups()
        closing = re.search(r"([ \t]*)\]$", old).group(1)
    else:  # an empty source: laid out as nbformat writes, under the line of its key
        line_start = text.rfind("\n", 0, start) + 1
        closing = re.match(r"[ \t]*", text[line_start:]).group(0)
        unit = re.search(r"\n([ \t]+)\S", text)
        if unit is None:
            return "[" + ", ".join(lines) + "]"
        newline = "\r\n" if "\r\n" in text else "\n"
        indent = closing + unit.group(1)
    return "[" + newline + ("," + newline).join(indent + line for line in lines) + newline + closing + "]"
