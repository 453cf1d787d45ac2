"""The mechanisms that keep a migration fast give what the plain way gives: the unchecked parse
is libcst's parse, the fast print is libcst's print, the remembered children are the children,
the depth walk measures what ``ast.iter_child_nodes`` walks (past the limit, where it matters),
and several workers give each file its own outcome in order."""

import ast
import dataclasses
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import libcst as cst
import pytest

from accrewrite import limits, nodes, parsing, positions, values
from accrewrite.analysis import analyze
from accrewrite.engine import Options, migrate_source
from accrewrite.rule import Rule, RuleContext
from accrewrite.runner import Job, _process_star, run

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("tests/rules/fixtures/*.in.py")) + sorted(ROOT.glob("examples/*/train.py"))
ODD = (
    "# -*- coding: utf-8 -*-\n"
    "@decorator(a)\nclass A(B, metaclass=M):\n    x: int = 1\n    def f(self, /, a, *b, c=2, **d) -> int:\n"
    "        return [i async for i in a] if (a := b) else {k: v for k, v in d.items()}\n"
    "\nwith open(p) as f, open(q) as g: pass\n"
    "try:\n    pass\nexcept* ValueError as e:\n    raise\nfinally:\n    del x[1:2, ::3]\n"
    "match p:\n    case [1, *rest] | {'k': _} if rest:\n        pass\n"
    "lambda *, k=f'{x!r:>{w}}': k\n"
    "s = 'a' 'b'\rt = -~x ** y @ z  # a comment\r\n"
)


def _sources():
    return [path.read_text() for path in SOURCES] + [ODD]


def test_the_unchecked_parse_is_libcsts_parse():
    for source in _sources():
        module = parsing.parse_module(source.encode())
        assert module.deep_equals(cst.parse_module(source)) and module.code == source


def test_the_unchecked_parse_checks_no_node_it_builds_but_those_other_threads_build(monkeypatch):
    libcsts_check = cst.CSTNode.__post_init__
    parse = cst.parse_module
    built = {}

    def build(where):
        try:
            cst.Name("")  # an empty name: libcst's check refuses it
            built[where] = "unchecked"
        except cst.CSTValidationError:
            built[where] = "checked"

    def parsing_while_another_thread_builds(source):
        build("parsing thread")
        other = threading.Thread(target=build, args=("other thread",))
        other.start()
        other.join()
        return parse(source)

    monkeypatch.setattr(cst, "parse_module", parsing_while_another_thread_builds)
    assert parsing.parse_module(b"x = 1\n").code == "x = 1\n"
    assert built == {"parsing thread": "unchecked", "other thread": "checked"}
    assert cst.CSTNode.__post_init__ is libcsts_check
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")


def test_a_libcst_whose_nodes_check_themselves_elsewhere_parses_as_it_does(monkeypatch):
    class Node:  # no ``__post_init__`` of its own
        pass

    monkeypatch.setattr(parsing, "cst", type(cst)("libcst", ""))
    parsing.cst.CSTNode, parsing.cst.parse_module = Node, lambda source: ("parsed", source)
    assert parsing.parse_module(b"x = 1\n") == ("parsed", b"x = 1\n")
    assert "__post_init__" not in Node.__dict__


def _worker_after_a_file(path, answers):
    _process_star((Job(path), Options(), "diff"))
    try:
        cst.Name("")
        checked = False
    except cst.CSTValidationError:
        checked = True
    answers.put((cst.CSTNode.__dict__["__post_init__"] is parsing._post_init, checked))


def test_a_worker_keeps_the_stand_in_which_checks_the_nodes_it_does_not_parse(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\nx = torch.zeros(1).cuda()\n")
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    worker = context.Process(target=_worker_after_a_file, args=(path, answers))
    worker.start()
    assert answers.get(timeout=60) == (True, True)
    worker.join()
    assert cst.CSTNode.__dict__["__post_init__"] is not parsing._post_init  # not in this process


def test_the_fast_print_is_libcsts_print():
    for source in _sources():
        module = cst.parse_module(source)
        assert positions.code(module) == module.code == source
        assert positions.code_bytes(module) == module.bytes
        for statement in module.body:
            assert positions.code(module, statement) == module.code_for_node(statement)


def test_starts_from_a_whole_print_are_the_starts_and_the_print_is_the_module():
    for source in _sources():
        module = cst.parse_module(source)
        wanted = []
        nodes.walk(module, lambda node: wanted.append(node) if isinstance(node, (cst.Name, cst.Call)) else None)
        found, printed = positions.starts_and_code(module, wanted)
        assert found == positions.starts(module, wanted)
        assert printed.text == module.code
        found, printed = positions.starts_and_code(module, [])
        assert found == {} and printed.text == module.code


_ENDINGS = ["", "\n", "x = 1", "x = 1\n", "# header\n\nx = 1\ny = 2  # no newline", "x = 1\n\n# footer\n", "if a:\n    b\n"]


def _rewrites(module):
    """Rewrites of ``module`` that keep some of its top-level statements: one dropped, one
    replaced, one added at each end, the body reversed, the header or footer changed."""
    body, new = list(module.body), cst.parse_statement("added = 0\n")
    yield module.with_changes(body=[new, *body, new])
    yield module.with_changes(body=body[::-1])
    for index in range(len(body)):
        yield module.with_changes(body=body[:index] + body[index + 1:])
        yield module.with_changes(body=body[:index] + [new] + body[index + 1:])
    yield module.with_changes(header=[cst.EmptyLine(comment=cst.Comment("# new"))], body=[*body, new])
    yield module.with_changes(footer=[], body=[new, *body])


def test_a_rewrite_prints_as_libcst_prints_it_with_the_kept_statements_printed_once():
    for source in _sources() + _ENDINGS + [ending.replace("\n", "\r\n") for ending in _ENDINGS]:
        module = cst.parse_module(source)
        _, printed = positions.starts_and_code(module, [])
        for rewrite in _rewrites(module):
            assert positions.code_reusing(rewrite, printed) == rewrite.bytes
    module = cst.parse_module(ODD)
    _, printed = positions.starts_and_code(module, [])
    rewrite = module.with_changes(body=module.body[1:])
    assert _printed_nodes(rewrite, printed) == set()


def _printed_nodes(rewrite, printed):
    """The nodes that ``code_reusing`` prints (rather than takes from ``printed``); the print is
    libcst's."""
    done, codegen, expected = set(), cst.CSTNode._codegen, rewrite.bytes

    def recording(node, state, **kwargs):
        if type(node) is not positions._Kept:
            done.add(node)
        codegen(node, state, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cst.CSTNode, "_codegen", recording)
        assert positions.code_reusing(rewrite, printed) == expected
    return done


NESTED = (
    "class A:\n    def f(self):\n        if a:\n            x = 1\n        elif b:  # b\n            y = 2\n"
    "        else:\n            z = 3\n        for i in r:\n            s += i\n        else:\n            pass\n"
    "        try:\n            t()\n        except E as e:\n            u()\n        finally:\n            v()\n"
    "        return s\n\n\n# footer\n"
)


def _nested_change(wrap):
    """A rewrite inside the blocks: ``y = 2`` becomes ``y = 3`` and ``u()`` goes, a new line comes
    before ``return``; with ``wrap`` the ``for`` loop moves into a new ``with`` block, and the
    ``elif`` takes the place of its ``if`` (printed as ``if`` there)."""

    def change(original, updated):
        code = cst.Module([]).code_for_node(original).strip()
        if type(original) is cst.Integer and code == "2":
            return updated.with_changes(value="3")
        if type(original) is cst.SimpleStatementLine and code == "u()":
            return cst.RemoveFromParent()
        if type(original) is cst.SimpleStatementLine and code == "return s":
            return cst.FlattenSentinel([cst.parse_statement("s = -s\n"), updated])
        if type(original) is cst.For and wrap:
            return cst.With(items=[cst.WithItem(cst.Name("c"))], body=cst.IndentedBlock([original]))
        if type(original) is cst.If and type(original.orelse) is cst.If and wrap:
            return updated.orelse
        return updated

    return change


def _rewritten(node, change):
    """``node`` with ``change(original, updated)`` applied to each node under it, rebuilding only
    what changes, as the rules' walk does."""
    replaced = {}
    for child in nodes.children(node):
        new = _rewritten(child, change)
        if new is not child:
            replaced[child] = new
    return change(node, node._visit_and_replace_children(nodes.Replacing(replaced)) if replaced else node)


@pytest.mark.parametrize("wrap", [False, True])
def test_a_rewrite_inside_blocks_prints_as_libcst_prints_it_taking_the_kept_statements_from_the_first_print(wrap):
    with nodes.remembering_children():
        module = cst.parse_module(NESTED)
        _, printed = positions.starts_and_code(module, [])
        rewrite = _rewritten(module, _nested_change(wrap))
        done = _printed_nodes(rewrite, printed)
        kept = [node for node in _statements(module) if node in _statements(rewrite)]
    assert "t()" in [module.code_for_node(node).strip() for node in kept]
    assert ("    if b:  # b\n" in rewrite.code) == wrap
    loop = next(node for node in kept if isinstance(node, cst.For))
    moved = _statements(loop) if wrap else []  # another indentation: printed anew
    assert not done & set(kept) - set(moved)
    assert set(moved) <= done


def _statements(tree):
    found = []
    nodes.walk(tree, lambda node: found.append(node) if type(node) in nodes.STATEMENT_TYPES else None)
    return found


def _plain_children(node):
    """The child nodes in ``node``'s fields, in the order the class declares its fields."""
    found = []
    for field in node.__dataclass_fields__:
        if field in nodes._SKIPPED_FIELDS or field.startswith("whitespace"):
            continue
        value = getattr(node, field)
        if type(value) in nodes.NODE_TYPES:
            found.append(value)
        elif type(value) in (tuple, list):
            found += [item for item in value if type(item) in nodes.NODE_TYPES]
    return found


def test_children_are_each_nodes_fields_in_source_order_and_are_remembered_only_while_asked():
    nodes._child_getters.clear()  # the order is read from the first of a kind: one without a format spec
    nodes.walk(cst.parse_module("f'{a}'\n"), lambda node: None)
    module = cst.parse_module(ODD)
    position = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True).resolve(cst.metadata.PositionProvider)
    every = []
    nodes.walk(module, every.append)
    assert len(every) > 100
    reordered = 0
    for node in every:
        found, declared = nodes.children(node), _plain_children(node)
        assert sorted(map(id, found)) == sorted(map(id, declared))
        spans = [(position[child].start.line, position[child].start.column,
                  position[child].end.line, position[child].end.column) for child in found]
        assert spans == sorted(spans)
        reordered += found != declared
        assert nodes.children(node) is not nodes.children(node)  # nothing kept outside
    assert reordered  # a decorator's call comes before the body it decorates, unlike in the fields
    with nodes.remembering_children():
        first = [nodes.children(node) for node in every]
        with nodes.remembering_children():  # an inner use shares the outer's memory
            assert all(nodes.children(node) is kept for node, kept in zip(every, first) if kept)
        assert all(nodes.children(node) is kept for node, kept in zip(every, first) if kept)
        names = [node for node in every if type(node) is cst.Name]
        assert names and not any(id(name) in nodes._memo for name in names)  # a leaf: nothing to remember
    assert nodes._memo is None
    assert all(nodes.children(node) is not kept for node, kept in zip(every, first))


def test_descendants_are_the_nodes_walk_enters_each_before_those_under_it_and_stop_at_a_pruned_type():
    module = cst.parse_module(ODD)
    every = []
    nodes.walk(module, every.append)
    found = list(nodes.descendants(module))
    assert sorted(map(id, found)) == sorted(map(id, every[1:]))
    reached = {id(child) for child in nodes.children(module)}
    for node in found:  # each node comes after the node it is under
        assert id(node) in reached
        reached.update(id(child) for child in nodes.children(node))
    function = next(node for node in every if type(node) is cst.FunctionDef)
    pruned = list(nodes.descendants(module, frozenset({cst.FunctionDef})))
    assert function in pruned and not any(nodes.holds(function, node) for node in pruned if node is not function)


def test_rebuilt_rewrites_as_a_libcst_transformer_does_and_keeps_what_it_leaves_unchanged():
    def leave(original_node, updated_node):
        if type(updated_node) is cst.Name and updated_node.value == "x":
            return updated_node.with_changes(value="X")
        if type(updated_node) is cst.BinaryOperation:
            return updated_node.left  # its left side as rewritten: the rewrite goes bottom up
        return updated_node

    class Transformer(cst.CSTTransformer):
        def on_visit(self, node):
            return type(node) is not cst.FunctionDef

        def on_leave(self, original_node, updated_node):
            return leave(original_node, updated_node)

    module = cst.parse_module(ODD)
    rebuilt = nodes.rebuilt(module, leave, lambda node: type(node) is not cst.FunctionDef)
    assert rebuilt.code == module.visit(Transformer()).code != module.code
    assert "t = -~X  # a comment" in rebuilt.code
    kept = [new for old, new in zip(module.body, rebuilt.body) if new is old]
    assert [type(statement) for statement in kept] == [cst.With, cst.Match, cst.SimpleStatementLine]
    function = next(node for node in nodes.descendants(module) if type(node) is cst.FunctionDef)
    assert nodes.holds(rebuilt, function)  # not entered: the very node


@pytest.mark.parametrize("literal", [
    "'cuda'", '"cuda:0"', "u'x'", "U'x'", r"r'a\nb'", r"R'a\'b'", r"'a\nb'", r"'\x41'", "'''a\r\nb'''",
    "r'''a\r\nb'''", '"""a\nb"""', "''", r"'\N{DIGIT ONE}'", "b'x'", "rb'x'", "'a' 'b'", "'a' u'b'",
])
def test_a_strings_value_is_what_python_reads(literal):
    node = cst.parse_module(f"x = {literal}\n").body[0].body[0].value
    # Python reads a carriage return and line feed inside a literal as a line feed.
    expected = ast.literal_eval(literal.replace("\r\n", "\n"))
    assert nodes.string_value(node) == (expected if isinstance(expected, str) else None)


def test_a_files_trees_and_analysis_are_freed_without_the_cycle_collector():
    """Workers pause the cycle collector while a file migrates: what a migration leaves in
    reference cycles waits for the collector to walk it, syntax trees included."""
    sources = [path.read_bytes() for path in SOURCES]
    gc.collect()
    gc.disable()
    try:
        for options in (Options(), Options(target="torchacc", guard="ACC_ON")):
            for source in sources:
                migrate_source(source, "train.py", options)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o) for o in gc.garbage if type(o).__module__.startswith(("libcst", "accrewrite", "pyflakes", "ast"))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, sorted({kind.__qualname__ for kind in left})


def _deep_threads():
    return [thread for thread in threading.enumerate() if thread.name == limits._THREAD_NAME]


def test_deep_calls_share_one_thread_which_ends_when_idle_and_raise_where_called(monkeypatch):
    monkeypatch.setattr(limits, "_IDLE_SECONDS", 0.2)
    idents = {limits.on_deep_stack(threading.get_ident)() for _ in range(20)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert limits.on_deep_stack(sys.getrecursionlimit)() >= limits._RECURSION_LIMIT > sys.getrecursionlimit()
    with pytest.raises(ZeroDivisionError):
        limits.on_deep_stack(lambda: 1 / 0)()
    assert limits.on_deep_stack(threading.get_ident)() in idents  # an error does not end it
    assert limits.on_deep_stack(limits.on_deep_stack(lambda: 5))() == 5  # a call from the thread runs there
    deadline = time.monotonic() + 5
    while _deep_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _deep_threads()
    assert limits.on_deep_stack(lambda: 7)() == 7  # a new one starts


def test_a_deep_call_keeps_nothing_of_its_arguments_or_error_once_returned():
    """Neither the thread, waiting for the next call, nor a raised error's traceback through the
    two frames holds the last call's arguments (a file's trees) in a cycle."""
    class Tree:
        pass

    def fails(tree):
        raise ValueError(tree)

    limits.on_deep_stack(lambda: None)()
    gc.collect()
    gc.disable()
    try:
        limits.on_deep_stack(len)([Tree()])
        with pytest.raises(ValueError):
            limits.on_deep_stack(fails)(Tree())
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [kind for kind in map(type, gc.garbage) if kind is Tree or kind is ValueError]
        trees = [o for o in gc.get_objects() if type(o) is Tree]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left and not trees


def test_a_child_forked_while_the_deep_thread_runs_starts_its_own():
    limits.on_deep_stack(lambda: None)()
    assert _deep_threads()
    child = os.fork()
    if child == 0:  # the thread is not copied into the child: a call must not wait for it
        os._exit(0 if limits.on_deep_stack(lambda: 41)() + 1 == 42 else 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the child waited for a thread it does not have")
    assert os.waitstatus_to_exitcode(status) == 0


def _reference_depth(tree):
    deepest, where = 0, 0
    stack = [(tree, 1, 0)]
    while stack:
        node, depth, line = stack.pop()
        line = getattr(node, "lineno", line)
        if depth > deepest:
            deepest, where = depth, line
        stack.extend((child, depth + 1, line) for child in ast.iter_child_nodes(node))
    return deepest, where


@pytest.mark.parametrize("extra", [
    "", "x = a" + ".b" * 1200 + "\n", "x = a" + ".b" * 2100 + "\n", "y = " + "-" * 2100 + "1\n",
    "z = (" + " +\n".join(["q"] * 2100) + ")\n", "w = f'{" + "-" * 2100 + "1}'\n",
])
def test_the_depth_walk_measures_what_the_ast_nests_past_the_limit(extra):
    for source in _sources():
        tree = ast.parse(source + extra)
        found, wanted = limits._depth(tree), _reference_depth(tree)
        assert found == wanted if wanted[0] > limits.MAX_DEPTH else found[0] <= limits.MAX_DEPTH


NESTING = ["-" * 150 + "x", "not " * 150 + "x", "x" + ".b" * 150, "f" + "()" * 150, "x" + "[0]" * 150,
           "[*" * 150 + "x" + "]" * 150, "lambda:" * 150 + "x", "x if y else " * 150 + "x", "x**" * 150 + "x",
           "f(a=" * 150 + "x" + ")" * 150, "{**" * 150 + "x" + "}" * 150, "f(*" * 150 + "x" + ")" * 150,
           "[x for x in " * 150 + "y" + "]" * 150, "{x:" * 150 + "y" + "}" * 150, "f'{x!r:>{w}}'"]


@pytest.mark.parametrize("expression", NESTING)
def test_a_node_on_one_line_nests_within_the_bound_the_depth_walk_skips_by(expression):
    def nesting(node):
        return 1 + max((nesting(child) for child in ast.iter_child_nodes(node)), default=0)

    for node in ast.walk(ast.parse(f"y = {expression}\n")):
        if getattr(node, "end_lineno", None) == getattr(node, "lineno", 0):
            span = node.end_col_offset - node.col_offset
            assert nesting(node) <= limits._LEVELS_PER_BYTE * span + limits._LEAF_LEVELS


@pytest.mark.parametrize("options", ["", "parser.add_argument('--device', default='cuda')\n"])
def test_a_file_is_searched_for_its_options_only_where_its_text_spells_add_argument(monkeypatch, options):
    source = options + "args = parser.parse_args()\ndevice = args.device\nx.to(device)\n"
    searched = []
    walk = nodes.walk
    monkeypatch.setattr(values.options, "walk", lambda *a: searched.append(1) or walk(*a))
    facts = analyze(cst.parse_module(source), text=source)
    assert bool(searched) == bool(options)
    assert facts.options.string_defaults() == ({"device": "cuda"} if options else {})
    assert [binding.name for binding in facts.devices] == (["device"] if options else [])


CALLS = (
    "import argparse\n@register(f(1))\ndef train(a=default(), *, b=g()) -> h():\n"
    "    def inner(x=k()):\n        return [m(i) for i in n()] + (lambda: o())()\n"
    "    class Local:\n        size = p()\n        def method(self):\n            return self.q(r())\n"
    "    args, rest = parser.parse_known_args()\n    return inner(s(t(u())))\n"
    "opt = argparse.ArgumentParser().parse_args()\nfor batch in loader():\n    train(batch)\n"
)


@pytest.mark.parametrize("source", [CALLS, *_sources()], ids=lambda source: str(len(source)))
def test_the_options_read_from_the_recorded_calls_are_those_a_walk_of_their_own_finds(source):
    module = cst.parse_module(source)
    facts = analyze(module)
    scanned = values.CommandLineOptions.scanned(module, None)
    recorded = facts.options
    assert [id(call) for call in recorded.calls] == [id(call) for call in scanned.calls]
    assert list(recorded._parses) == list(scanned._parses)
    assert recorded.string_defaults() == scanned.string_defaults()


def test_the_file_facts_are_read_only_once_the_walk_has_ended():
    facts = analyze(cst.parse_module(CALLS))
    train = next(scope for _, scope in facts.file.calls if scope is not None)
    assert [call.func.value for call, _, _ in facts.file_values.calls_of(train)] == ["train"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.file.imports = {}
    with pytest.raises(TypeError):
        facts.file.imports["argparse"] = "os"


def test_several_workers_give_each_file_its_outcome_in_the_order_given(tmp_path):
    # Sizes out of order: the workers take the largest first, the outcomes still follow the jobs.
    jobs = []
    for index, lines in enumerate([1, 40, 3, 200, 2, 90]):
        path = tmp_path / f"s{index}.py"
        path.write_text("import torch\n" + "x = torch.ones(2).cuda()\n" * lines)
        jobs.append((Job(path), Options()))
    jobs.append((Job(tmp_path / "missing.py"), Options()))
    one, two = run(jobs, "diff", workers=1), run(jobs, "diff", workers=2)
    assert [o.path for o in two] == [str(job.path) for job, _ in jobs]
    assert [(o.path, o.diff, o.error, len(o.fixes)) for o in one] == [(o.path, o.diff, o.error, len(o.fixes)) for o in two]
    assert two[3].diff.count("\n+x = ") == 200 and two[-1].error is not None


def test_a_code_that_no_noqa_names_is_not_suppressed_without_placing_any_node(monkeypatch):
    # Placing nodes prints the whole file with positions: only a code some "# noqa:" names pays it.
    placed = []
    monkeypatch.setattr(RuleContext, "position", lambda self, node: placed.append(node))
    source = b"import os  # noqa: E402, F401\nimport torch\nmodel = model.cuda()\n"
    assert migrate_source(source).fixes and not placed
    migrate_source(source.replace(b"E402", b"ACC002"))
    assert placed  # a noqa that names ACC002 is looked up where it stands


class _SeesCuda(Rule):
    code, name, summary = "XYZ910", "sees-cuda", "records the calls it is given"
    triggers = frozenset({"cuda"})
    seen: list = []

    def leave_Call(self, original_node, updated_node):
        self.seen.append(self.ctx.code(original_node))
        return updated_node


class _SeesSave(_SeesCuda):
    code, name = "XYZ911", "sees-save"
    triggers = frozenset({"save"})
    seen: list = []


def test_a_rule_is_called_only_in_statements_that_mention_its_trigger_words(rule_pack):
    rule_pack("acc_seeing_pack", _SeesCuda, _SeesSave)
    _SeesCuda.seen, _SeesSave.seen = [], []  # a class's own list: an earlier run's calls are not this run's
    source = (
        b"import torch\n"
        b"x = torch.ones(2).cuda()\n"
        b"torch.save(x, 'x.pt')\n"
        b"def f():\n    y = g(1)\n    return torch.save(y, p)\n"
        b"print(len(x))\n"  # neither word: walked for neither rule
    )
    result = migrate_source(source, "seen.py", Options(select=("XYZ910", "XYZ911")))
    assert result.error is None
    assert _SeesCuda.seen == ["torch.ones(2)", "torch.ones(2).cuda()"]
    # not in the statement that mentions only cuda, which the other rule walks
    assert _SeesSave.seen == ["torch.save(x, 'x.pt')", "torch.save(y, p)"]


def _distribution(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.mark.parametrize("declared", [True, False])
def test_entry_points_are_what_importlib_metadata_reads_and_read_only_where_a_package_declares_ours(
        tmp_path, monkeypatch, declared):
    import importlib.metadata

    from accrewrite import plugins

    _distribution(tmp_path, "other", "[console_scripts]\nother = other:main\n")
    if declared:
        _distribution(tmp_path, "acc_pack", "[accrewrite.targets]\npack = acc_pack\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._installed.cache_clear()
    if not declared:  # no package names a group of ours: none's entry points are parsed
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda: pytest.fail("parsed every package's entry points"))
    try:
        found = [(point.name, point.value) for point in plugins.entry_points("accrewrite.targets")]
        assert found == ([("pack", "acc_pack")] if declared else [])
        assert plugins.entry_points("accrewrite.rules") == ()
    finally:
        plugins._installed.cache_clear()


@pytest.mark.parametrize("entry", ["packages.zip", "pack-1.0.egg"])
def test_a_zip_or_an_egg_on_the_path_has_importlib_metadata_read_the_entry_points(tmp_path, monkeypatch, entry):
    from accrewrite import plugins

    assert not plugins._declared()
    if entry.endswith(".zip"):
        (tmp_path / entry).write_bytes(b"")
    else:
        (tmp_path / entry / "EGG-INFO").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path / entry))
    assert plugins._declared()
