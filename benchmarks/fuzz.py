"""Fuzzing the codemod: random and mutated Python through ``migrate_source``, for every target.

    python benchmarks/fuzz.py [--count 200] [--time-budget 600] [--seed 0] [--jobs 2]
                              [--sources grammar,node,mutation] [--save-failures DIR] [FILE ...]

Inputs, ``--count`` of each source (drawing stops when the source's share of ``--time-budget``
is spent):

* ``grammar``, ``node``: modules drawn by hypothesmith (``from_grammar()``, ``from_node()``)
  through hypothesis with ``--seed``. Random code rarely names torch, and the engine leaves a
  file that names neither torch nor CUDA alone, so each module is joined to a snippet of CUDA
  training code (after it, before it, or spliced into a fixture script), its names sometimes
  renamed to a training script's (``model``, ``cuda``, ``loader``...).
* ``mutation``: the fixture scripts (``tests/rules/fixtures/*.in.py``, ``examples/*/train.py``)
  with one to four of the mutations in ``MUTATIONS`` (statements swapped, duplicated, deleted or
  wrapped in a block; comments, form feeds, backslash continuations, semicolons; renames to
  training or unicode names; deep expressions; ``.cuda()`` at expression sites and
  ``torch.cuda`` calls), then the file's newline style and encoding (CRLF, a BOM, a coding
  cookie, no final newline). Input ``i`` depends only on ``--seed`` and ``i``.
* ``FILE ...``: these files instead (a failure saved by ``--save-failures``, to reproduce it).

Each source's inputs are drawn first, then migrated to each target in the codemod's own worker
processes (``accrewrite.workers``, ``--jobs`` of them); a worker that dies is a "crash" and one
that takes more than ``--timeout`` seconds is killed, a "timeout". The defects:

* ``unbound``: the net refused the output, which reads a name unbound where the input bound it
  (``accrewrite.unbound``; a rule's bug);
* ``internal``: any other error whose reason starts with "internal error" (a bug of ours);
* ``exception``: an exception escaped ``migrate_source``;
* ``noncompiling``: the input compiles (CPython's ``compile``) and the output does not;
* ``nonidempotent``: migrating the output again changes it (or fails);
* ``accepted-invalid``: CPython rejects the input and the engine reported no error;
* ``rejected-valid``: CPython compiles the input and the engine refuses it (libcst cannot parse
  it, say), other than for the input limits in ``LIMITS``;
* ``crash``, ``timeout``.

It prints a table of counts per source and target, a histogram of the error reasons (the
user-facing ones and the internal ones) and the failing inputs; exit code 1 when any defect was
found. ``--save-failures DIR`` writes each failing input there byte for byte, with
``failures.txt`` naming the target, the defect and its detail.
"""

from __future__ import annotations

import argparse
import ast
import keyword
import random
import re
import sys
import time
import tokenize
import warnings
from collections import Counter
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

from accrewrite.engine import Options, migrate_source
from accrewrite.unbound import REFUSAL
from accrewrite.workers import Lost, map_isolated

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("runtime", "torch_xla", "torchacc")
SOURCES = ("grammar", "node", "mutation")
DEFECTS = ("unbound", "internal", "exception", "noncompiling", "nonidempotent", "accepted-invalid", "rejected-valid", "crash", "timeout")

# The engine's input limits, and a file written for another target than the one asked for: a
# valid file is refused there, and that is no defect.
LIMITS = ("file too large", "nested too deeply", "the file is written for target")
# The engine leaves a file alone, unparsed, when it says skip-file or names neither torch nor
# CUDA (accrewrite.engine); such a file owes no error for being invalid.
_SCREENED_IN = re.compile(rb"torch|cuda")
_SKIP_FILE = re.compile(rb"#\s*accrewrite:\s*skip-file")


# ---- the checks (in a worker process) ------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status: str  # "changed", "unchanged", "error", "crash" or "timeout"
    defects: tuple[str, ...] = ()
    detail: str = ""
    reason: str = ""  # the error's reason, for the histogram


def compiles(source: bytes) -> bool | None:
    """Whether CPython compiles it (None: CPython itself gave up, e.g. on recursion)."""
    return cpython_verdict(source)[0]


def cpython_verdict(source: bytes) -> tuple[bool | None, str]:
    try:
        compile(source, "<fuzz>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return False, f"{exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # null bytes, before 3.12
        return False, str(exc)
    except (RecursionError, MemoryError) as exc:
        return None, type(exc).__name__
    return True, ""


def check(source: bytes, target: str) -> Outcome:
    options = Options(target=target)
    try:
        result = migrate_source(source, "fuzz.py", options)
    except BaseException as exc:  # noqa: BLE001 - what escapes is the finding
        return Outcome("error", ("exception",), f"{type(exc).__name__}: {exc}"[:300])
    valid, why = cpython_verdict(source)
    if result.error is not None:
        reason = result.error.reason
        if reason.startswith(REFUSAL):
            return Outcome("error", ("unbound",), reason[:300], reason)
        if reason.startswith("internal error"):
            return Outcome("error", ("internal",), reason[:300], reason)
        if valid and not reason.startswith(LIMITS):
            return Outcome("error", ("rejected-valid",), reason[:300], reason)
        return Outcome("error", reason=reason)
    if valid is False and _SCREENED_IN.search(source) and not _SKIP_FILE.search(source):
        return Outcome("changed" if result.changed else "unchanged", ("accepted-invalid",), f"CPython rejects it: {why}")
    if not result.changed:
        return Outcome("unchanged")
    defects, details = [], []
    output_valid, output_why = cpython_verdict(result.output)
    if valid and output_valid is False:
        defects.append("noncompiling")
        details.append(f"the output does not compile: {output_why}")
    try:
        again = migrate_source(result.output, "fuzz.py", options)
    except BaseException as exc:  # noqa: BLE001
        again_detail = f"the second run raised {type(exc).__name__}: {exc}"
    else:
        again_detail = "" if again.output == result.output and again.error is None else (
            f"the second run failed: {again.error.reason}" if again.error else "the second run changed it again")
    if again_detail:
        defects.append("nonidempotent")
        details.append(again_detail[:300])
    return Outcome("changed", tuple(defects), "; ".join(details))


def _check(task: tuple[bytes, str]) -> Outcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings of the inputs
        return check(*task)


@dataclass
class Input:
    source: str  # "grammar", "node", "mutation" or "file"
    label: str  # reproduces it: "mutation 17 (seed 0): examples/mnist/train.py + swap, crlf"
    data: bytes
    name: str  # a file name for --save-failures


# ---- mutations of the fixture scripts ------------------------------------------------------

FIXTURES = sorted(ROOT.glob("tests/rules/fixtures/*.in.py")) + sorted(ROOT.glob("examples/*/train.py"))
NAMES = ["model", "device", "cuda", "torch", "loader", "optimizer", "scaler", "loss", "xm", "dist", "nn", "rank"]
UNICODE_NAMES = ["módulo", "данные", "模型", "λ_1", "Δt", "ﬁle", "ｍｏｄｅｌ"]  # the last two are NFKC spellings
COMMENTS = ["# a comment", "# noqa: ACC002", "# type: ignore", "# fmt: off", "#", "# ünïcödé ☃", "# coding: latin-1",
            "# TODO(x): .cuda() here"]
CUDA_STATEMENTS = ["torch.cuda.synchronize()", "torch.cuda.manual_seed(0)", "torch.cuda.set_device(0)",
                   "device = torch.device('cuda')", "torch.cuda.empty_cache()", "torch.backends.cudnn.benchmark = True",
                   "x = torch.zeros(2, device='cuda')", "model = model.cuda()", "model.to('cuda:0')",
                   "scaler = torch.cuda.amp.GradScaler()", "torch.manual_seed(1)", "print(torch.cuda.is_available())"]
CUDA_CALLS = ["{}.cuda()", "{}.to('cuda')", "{}.to(device='cuda:0')", "{}.cuda(non_blocking=True)",
              "{}.to(torch.device('cuda'))", "{}.to(device)"]
WRAPPERS = [  # (header, footer, levels of indentation); {i} the block's indentation, {u} one level
    ("{i}if True:\n", "", 1), ("{i}if False:\n{i}{u}pass\n{i}else:\n", "", 1), ("{i}for _ in range(1):\n", "", 1),
    ("{i}while True:\n", "{i}{u}break\n", 1), ("{i}with torch.no_grad():\n", "", 1),
    ("{i}with torch.cuda.amp.autocast() as _ctx:\n", "", 1), ("{i}try:\n", "{i}except Exception:\n{i}{u}raise\n", 1),
    ("{i}try:\n", "{i}finally:\n{i}{u}pass\n", 1), ("{i}try:\n", "{i}except* ValueError:\n{i}{u}pass\n", 1),
    ("{i}def _wrapped(self, *args, **kwargs):\n", "", 1), ("{i}async def _wrapped():\n", "", 1),
    ("{i}class _Wrapped:\n", "", 1), ("{i}match 0:\n{i}{u}case _:\n", "", 2)]
DEEP = {  # n -> a deep expression
    "sum": lambda n: " + ".join(f"x{k % 5}" for k in range(n)),
    "cuda-chain": lambda n: "torch.zeros(1)" + ".cuda()" * n,
    "to-chain": lambda n: "x" + ".to('cuda')" * n,
    "attributes": lambda n: "model" + ".module" * n,
    "and": lambda n: " and ".join(["flag"] * n),
    "parens": lambda n: "(" * n + "1" + ")" * n,
    "calls": lambda n: "f(" * n + ")" * n,
    "lists": lambda n: "[" * n + "]" * n,
    "subscripts": lambda n: "x" + "[0]" * n,
    "conditional": lambda n: " if c else ".join(["a"] * n),
    "power": lambda n: " ** ".join(["2"] * n),
    "unary": lambda n: "-" * n + "1",
    "lambda": lambda n: "lambda: " * n + "0",
}
DEPTHS = [2, 10, 50, 150, 199, 200, 500, 1000]


@dataclass
class Statement:
    """A statement that has its lines to itself (1-based, inclusive), with its indentation."""

    node: ast.stmt
    start: int
    end: int
    indent: str


class Source:
    """A source's lines and, where it parses, its blocks of statements (None where a statement
    shares a line with another)."""

    def __init__(self, text: str):
        self.lines = re.split(r"(?<=\n)", text)
        self.blocks: list[list[Statement | None]] = []
        try:
            self.tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            self.tree = None
            return
        for node in ast.walk(self.tree):
            for name in ("body", "orelse", "finalbody"):
                body = getattr(node, name, None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                    self.blocks.append([self._owned(statement) for statement in body])

    def _owned(self, node: ast.stmt) -> Statement | None:
        start = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", [])])
        first, last = self.lines[start - 1], self.lines[node.end_lineno - 1]
        indent = first[: len(first) - len(first.lstrip(" \t"))]
        rest = last.encode()[node.end_col_offset :].decode(errors="replace").strip()
        if first.lstrip().startswith("elif"):  # an elif's If
            return None
        if start != node.lineno and not first.lstrip().startswith("@") or start == node.lineno and len(indent.encode()) != node.col_offset:
            return None  # something else begins its first line
        if rest and not rest.startswith("#"):
            return None
        return Statement(node, start, node.end_lineno, indent)

    def text(self) -> str:
        return "".join(self.lines)

    def statements(self, simple: bool = False) -> list[Statement]:
        return [s for block in self.blocks for s in block if s and not (simple and hasattr(s.node, "body"))]

    def unit(self) -> str:
        return "\t" if any(line.startswith("\t") for line in self.lines) else "    "


def _swap(src: Source, rng: random.Random) -> str | None:
    pairs = [(a, b) for block in src.blocks for a, b in zip(block, block[1:]) if a and b]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    lines = src.lines
    lines[a.start - 1 : b.end] = lines[b.start - 1 : b.end] + lines[a.end : b.start - 1] + lines[a.start - 1 : a.end]
    return src.text()


def _duplicate(src: Source, rng: random.Random) -> str | None:
    if not (statements := src.statements()):
        return None
    s = rng.choice(statements)
    src.lines[s.end : s.end] = src.lines[s.start - 1 : s.end]
    return src.text()


def _delete(src: Source, rng: random.Random) -> str | None:
    choices = [(s, len(block)) for block in src.blocks for s in block if s]
    if not choices:
        return None
    s, siblings = rng.choice(choices)
    src.lines[s.start - 1 : s.end] = [] if siblings > 1 else [s.indent + "pass\n"]
    return src.text()


def _wrap(src: Source, rng: random.Random) -> str | None:
    runs = [block[i : i + n] for block in src.blocks for i in range(len(block)) for n in (1, 2, 3)
            if i + n <= len(block) and all(block[i : i + n])]
    if not runs:
        return None
    run = rng.choice(runs)
    header, footer, levels = rng.choice(WRAPPERS)
    indent, unit = run[0].indent, src.unit()
    body = [unit * levels + line if line.strip() else line for line in src.lines[run[0].start - 1 : run[-1].end]]
    src.lines[run[0].start - 1 : run[-1].end] = [header.format(i=indent, u=unit), *body, footer.format(i=indent, u=unit)]
    return src.text()


def _insert_before(src: Source, rng: random.Random, make) -> str | None:
    if not (statements := src.statements()):
        return None
    s = rng.choice(statements)
    src.lines.insert(s.start - 1, make(s.indent))
    return src.text()


def _comment(src: Source, rng: random.Random) -> str | None:
    if rng.random() < 0.5:
        return _insert_before(src, rng, lambda indent: f"{indent}{rng.choice(COMMENTS)}\n")
    if not (statements := src.statements()):
        return None
    s = rng.choice(statements)
    src.lines[s.end - 1] = src.lines[s.end - 1].rstrip("\n") + "  " + rng.choice(COMMENTS) + "\n"
    return src.text()


def _form_feed(src: Source, rng: random.Random) -> str | None:
    if not (statements := src.statements()):
        return None
    s = rng.choice(statements)
    place = rng.randrange(3)
    if place == 0:  # before the indentation
        src.lines[s.start - 1] = "\f" + src.lines[s.start - 1]
    elif place == 1:  # a line of its own
        src.lines.insert(s.start - 1, "\f\n")
    else:  # in a comment line's indentation
        src.lines.insert(s.start - 1, f"{s.indent}\f# page\n")
    return src.text()


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []


_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _backslash(src: Source, rng: random.Random) -> str | None:
    tokens = _tokens(src.text())
    gaps = [b.start for a, b in zip(tokens, tokens[1:])
            if a.end[0] == b.start[0] and a.type not in _LAYOUT and b.type not in _LAYOUT
            and not tokenize.tok_name[a.type].startswith(("FSTRING", "TSTRING"))
            and not tokenize.tok_name[b.type].startswith(("FSTRING", "TSTRING"))]
    if not gaps:
        return None
    row, col = rng.choice(gaps)
    line = src.lines[row - 1]
    src.lines[row - 1] = line[:col] + "\\\n" + rng.choice(["", " ", "        ", "\t"]) + line[col:]
    return src.text()


def _semicolon(src: Source, rng: random.Random) -> str | None:
    simple = [s for s in src.statements(simple=True) if s.start == s.end]
    if not simple:
        return None
    s = rng.choice(simple)
    line = src.lines[s.start - 1]
    following = [t for t in simple if t.start == s.end + 1 and t.indent == s.indent]
    if following and "#" not in line and rng.random() < 0.5:  # join the next statement to this line
        src.lines[s.start - 1 : s.start + 1] = [line.rstrip("\n") + "; " + src.lines[s.start].lstrip(" \t")]
    else:  # "; pass" after it
        end = len(line.encode()[: s.node.end_col_offset].decode())
        src.lines[s.start - 1] = line[:end] + rng.choice(["; pass", ";", " ; x = 1"]) + line[end:]
    return src.text()


def _fullwidth(name: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in name)


def rename(text: str, rng: random.Random, pool: list[str]) -> str | None:
    """One name renamed throughout (as a token: attributes and keywords too)."""
    tokens = [t for t in _tokens(text) if t.type == tokenize.NAME and not keyword.iskeyword(t.string)
              and not keyword.issoftkeyword(t.string)]
    if not tokens:
        return None
    old = rng.choice(tokens).string
    new = rng.choice([name for name in pool + [_fullwidth(old)] if name != old])
    lines = re.split(r"(?<=\n)", text)
    for t in reversed(tokens):
        if t.string == old:
            (row, col), (_, end) = t.start, t.end
            lines[row - 1] = lines[row - 1][:col] + new + lines[row - 1][end:]
    return "".join(lines)


def _rename(src: Source, rng: random.Random) -> str | None:
    return rename(src.text(), rng, NAMES + UNICODE_NAMES)


def _deep(src: Source, rng: random.Random) -> str | None:
    n = rng.choice(DEPTHS)
    if rng.random() < 0.2:  # nested blocks (CPython allows 100 levels of indentation)
        n = rng.choice([5, 20, 98, 99, 100, 150])
        unit = src.unit()
        return _insert_before(src, rng, lambda indent: "".join(f"{indent}{unit * k}if c:\n" for k in range(n)) + f"{indent}{unit * n}pass\n")
    kind = rng.choice(sorted(DEEP))
    return _insert_before(src, rng, lambda indent: f"{indent}_deep = {DEEP[kind](n)}\n")


def _cuda_statement(src: Source, rng: random.Random) -> str | None:
    return _insert_before(src, rng, lambda indent: f"{indent}{rng.choice(CUDA_STATEMENTS)}\n")


def _cuda_call(src: Source, rng: random.Random) -> str | None:
    """``.cuda()`` or ``.to("cuda")`` on a one-line expression read somewhere (not in an f-string
    or a pattern, where a call cannot stand, nor on a function called)."""
    if src.tree is None:
        return None
    excluded = {id(n) for top in ast.walk(src.tree) if isinstance(top, (ast.JoinedStr, ast.pattern)) for n in ast.walk(top)}
    excluded |= {id(n.func) for n in ast.walk(src.tree) if isinstance(n, ast.Call)}  # no x.cuda.cuda()()
    sites = [n for n in ast.walk(src.tree) if isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
             and not isinstance(getattr(n, "ctx", None), (ast.Store, ast.Del)) and n.lineno == n.end_lineno
             and id(n) not in excluded]
    if not sites:
        return None
    node = rng.choice(sites)
    line = src.lines[node.lineno - 1].encode()
    start, end = node.col_offset, node.end_col_offset
    expression = line[start:end].decode()
    src.lines[node.lineno - 1] = (line[:start].decode() + rng.choice(CUDA_CALLS).format(expression) + line[end:].decode())
    return src.text()


def _tabs(src: Source, rng: random.Random) -> str | None:
    widths = [len(s.indent) for s in src.statements() if s.indent.strip(" ") == "" and s.indent]
    width = min(widths, default=4) if rng.random() < 0.9 else rng.choice([2, 4, 8])  # else mixed, maybe a TabError
    return "".join(re.sub(rf"^((?: {{{width}}})+)", lambda m: "\t" * (len(m[1]) // width), line) for line in src.lines)


MUTATIONS = {"swap": _swap, "duplicate": _duplicate, "delete": _delete, "wrap": _wrap, "comment": _comment,
             "form-feed": _form_feed, "backslash": _backslash, "semicolon": _semicolon, "rename": _rename,
             "deep": _deep, "cuda-statement": _cuda_statement, "cuda-call": _cuda_call, "tabs": _tabs}


def encode(text: str, rng: random.Random, applied: list[str]) -> bytes:
    """The text as a file: its newline style and encoding, now and then unusual."""
    if rng.random() < 0.05:
        text = text.rstrip("\n")
        applied.append("no-final-newline")
    if rng.random() < 0.15:
        text = text.replace("\n", "\r\n")
        applied.append("crlf")
    elif rng.random() < 0.02:
        text = text.replace("\n", "\r")
        applied.append("cr")
    newline = "\r\n" if "\r\n" in text else "\r" if "\r" in text else "\n"
    roll = rng.random()
    if roll < 0.08:
        applied.append("bom")
        return b"\xef\xbb\xbf" + text.encode(errors="surrogatepass")
    if roll < 0.16:
        encoding = rng.choice(["latin-1", "utf-8", "cp1252", "ascii"])
        cookie = rng.choice([f"# -*- coding: {encoding} -*-", f"# vim: set fileencoding={encoding} :"]) + newline
        if rng.random() < 0.3:
            cookie = "#!/usr/bin/env python" + newline + cookie
        applied.append(f"cookie {encoding}")
        try:
            return (cookie + text).encode(encoding)
        except UnicodeEncodeError:  # a cookie that lies: the engine must say it cannot decode
            return (cookie + text).encode(errors="surrogatepass")
    return text.encode(errors="surrogatepass")


def mutation(seed: int, index: int) -> Input:
    rng = random.Random(f"{seed}:mutation:{index}")
    path = rng.choice(FIXTURES)
    text, applied = path.read_text(), []
    for name in rng.sample(sorted(MUTATIONS), rng.randint(1, 4)):
        mutated = MUTATIONS[name](Source(text), rng)
        if mutated is not None:
            text = mutated
            applied.append(name)
    data = encode(text, rng, applied)
    label = f"mutation {index} (seed {seed}): {path.relative_to(ROOT)} + {', '.join(applied) or 'nothing'}"
    return Input("mutation", label, data, f"s{seed}-mutation-{index}.py")


# ---- modules drawn by hypothesmith ---------------------------------------------------------

TORCH_SNIPPETS = [
    "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n",
    "import torch\ntorch.cuda.manual_seed(0)\ndevice = torch.device('cuda')\nx = torch.zeros(1).to(device)\n",
    "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader([1])\nfor batch in loader:\n"
    "    batch = batch.cuda()\n    loss = model(batch)\n    loss.backward()\n    optimizer.step()\n",
    "import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"
    "scaler.scale(y).backward()\nscaler.step(optimizer)\nscaler.update()\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    "model = torch.nn.parallel.DistributedDataParallel(model.cuda())\n",
]


def drawn(source: str, seed: int, index: int, module: str) -> Input:
    """A drawn module joined to CUDA training code, so that the rules see it."""
    rng = random.Random(f"{seed}:{source}:{index}")
    if rng.random() < 0.5:
        module = rename(module, rng, NAMES) or module
    module = module if module.endswith(("\n", "\r")) else module + "\n"
    snippet, how = rng.choice(TORCH_SNIPPETS), rng.choice(["after", "before", "spliced"])
    if "__future__" in module or how == "after":  # a future import must stay first
        how, text = "after", module + snippet
    elif how == "before":
        text = snippet + module
    else:
        path = rng.choice(FIXTURES)
        host = Source(path.read_text())
        line = rng.choice([s.start for s in host.blocks[0] if s]) if host.blocks else len(host.lines)
        host.lines.insert(line - 1, module)
        text, how = host.text(), f"spliced into {path.relative_to(ROOT)} at line {line}"
    label = f"{source} {index} (seed {seed}), {how}"
    return Input(source, label, text.encode(errors="surrogatepass"), f"s{seed}-{source}-{index}.py")


class _Enough(BaseException):
    """Stops hypothesis's drawing (a BaseException, so hypothesis does not report a failure)."""


def draw(source: str, seed: int, count: int, deadline: float, take) -> None:
    """Up to ``count`` distinct modules from hypothesmith, each handed to ``take`` as drawn."""
    import hypothesmith
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    strategy = hypothesmith.from_grammar() if source == "grammar" else hypothesmith.from_node()
    seen: set[str] = set()

    @seeded(seed)
    @settings(max_examples=count * 20, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(module: str) -> None:
        if len(seen) >= count or time.monotonic() > deadline:
            raise _Enough
        if module not in seen:
            seen.add(module)
            take(drawn(source, seed, len(seen) - 1, module))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hypothesmith compiles what it draws
            one()
    except _Enough:
        pass


# ---- running and reporting -----------------------------------------------------------------


@dataclass
class Failure:
    item: Input
    target: str
    outcome: Outcome


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)  # (source, target, column) -> n
    reasons: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)

    def add(self, item: Input, target: str, outcome: Outcome) -> None:
        self.counts[item.source, target, "tried"] += 1
        self.counts[item.source, target, outcome.status] += 1
        for defect in outcome.defects:
            self.counts[item.source, target, defect] += 1
        if outcome.reason:
            self.reasons[reason_kind(outcome.reason)] += 1
        if outcome.defects:
            self.failures.append(Failure(item, target, outcome))

    def defects(self) -> int:
        return len(self.failures)


def reason_kind(reason: str) -> str:
    """An error reason's words up to its first ';', without the particulars (names, numbers)."""
    kind = reason.split(";")[0]
    kind = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", kind)
    kind = re.sub(r"\d+", "N", kind)
    return kind if len(kind) <= 100 else kind[:97] + "..."


def run(feeds, targets, jobs: int, timeout: float) -> Tally:
    """Check every input that ``feeds`` (pairs of a source and a function that hands its inputs
    to a callback) make, on every target, in the codemod's own worker processes: one that
    crashes or overruns ``timeout`` is counted, and replaced."""
    tally = Tally()
    for target in targets:  # everything imported once, before the workers fork
        migrate_source(b"import torch\nx = torch.zeros(1).cuda()\n", "warm.py", Options(target=target))
    for source, feed in feeds:
        started, items = time.monotonic(), []
        feed(items.append)
        tasks = [(item, target) for item in items for target in targets]
        results = map_isolated(_check, [(item.data, target) for item, target in tasks], jobs, timeout)
        for (item, target), result in zip(tasks, results):
            if isinstance(result, Lost):
                kind = "timeout" if "timed out" in result.reason else "crash"
                result = Outcome(kind, (kind,), result.reason)
            tally.add(item, target, result)
        print(f"{source}: {len(items)} inputs in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return tally


def feeds(sources, count: int, seed: int, budget: float, files):
    """For each source, a function that hands its inputs to a callback, within the source's share
    of the time budget (time a source leaves goes to the next)."""
    start = time.monotonic()
    if files:
        return [("file", lambda take: [take(Input("file", str(path), Path(path).read_bytes(), Path(path).name))
                                       for path in files])]
    result = []
    for position, source in enumerate(sources):
        deadline = start + budget * (position + 1) / len(sources)
        if source == "mutation":
            def feed(take, deadline=deadline):
                for index in range(count):
                    if time.monotonic() > deadline:
                        break
                    take(mutation(seed, index))
        else:
            def feed(take, source=source, deadline=deadline):
                draw(source, seed, count, deadline, take)
        result.append((source, feed))
    return result


def print_report(tally: Tally, targets, elapsed: float) -> None:
    columns = ["tried", "changed", "unchanged", "error", *DEFECTS]
    header = ["source", "target", *columns]
    rows = [header]
    for source in [*SOURCES, "file"]:
        for target in targets:
            if tally.counts[source, target, "tried"]:
                rows.append([source, target, *(str(tally.counts[source, target, c]) for c in columns)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print(f"\n{elapsed:.0f} s")
    if tally.reasons:
        print("\nerror reasons:")
        for kind, n in tally.reasons.most_common():
            print(f"  {n:6d}  {kind}")
    if tally.failures:
        print(f"\n{tally.defects()} defects (input and target):")
        targets_of: dict = {}  # one line for the targets an input fails alike
        for failure in tally.failures:
            o = failure.outcome
            targets_of.setdefault((failure.item.label, o.defects, o.detail), []).append(failure.target)
        for (label, defects, detail), failing in targets_of.items():
            print(f"  {'/'.join(defects)} [{', '.join(failing)}] {label}: {detail[:160]}")


def save_failures(tally: Tally, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for failure in tally.failures:
        (directory / failure.item.name).write_bytes(failure.item.data)
        o = failure.outcome
        index.append(f"{failure.item.name}\t{failure.target}\t{'/'.join(o.defects)}\t{failure.item.label}\t{o.detail}\n")
    (directory / "failures.txt").write_text("".join(index))
    print(f"\nfailing inputs written to {directory} (failures.txt names each one's target and defect); "
          f"rerun one with: python benchmarks/fuzz.py {directory}/FILE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="check these files instead of generated inputs")
    parser.add_argument("--count", type=int, default=200, help="inputs per source (default 200)")
    parser.add_argument("--time-budget", type=float, default=600, help="seconds for drawing, all sources together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", default=",".join(SOURCES), help="of " + ",".join(SOURCES))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per input and target")
    parser.add_argument("--save-failures", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    sources, targets = args.sources.split(","), args.targets.split(",")
    if unknown := set(sources) - set(SOURCES) or set(targets) - set(TARGETS):
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    start = time.monotonic()
    tally = run(feeds(sources, args.count, args.seed, args.time_budget, args.files), targets, args.jobs, args.timeout)
    print_report(tally, targets, time.monotonic() - start)
    if args.save_failures and tally.failures:
        save_failures(tally, args.save_failures)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
