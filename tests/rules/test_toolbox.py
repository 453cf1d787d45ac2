"""Rules share accrewrite.toolbox and the engine's public names: no rule imports another rule's
module or a private name, so each rule's module holds that rule alone."""

import ast
import re
from pathlib import Path

import libcst as cst

import accrewrite.rules
from accrewrite.analysis import analyze
from accrewrite.toolbox import with_commas, without_items, wrapped_models, wraps_model

RULE_MODULE = re.compile(r"(^|\.)acc\d{3}_\w+$")


def _imports(path: Path):
    """(line, module, names) of each import in ``path``, relative imports made absolute."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = f"accrewrite.rules.{module}" if module else "accrewrite.rules"
            yield node.lineno, module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def _violations(path: Path) -> list[str]:
    wrong = []
    for line, module, names in _imports(path):
        if RULE_MODULE.search(module) or any(RULE_MODULE.search(f"{module}.{name}") for name in names):
            wrong.append(f"{path.name}:{line} imports a rule module ({module})")
        private = [name for name in names if name.startswith("_")]
        if module.startswith("accrewrite") and private:
            wrong.append(f"{path.name}:{line} imports {', '.join(private)} from {module}")
    return wrong


def test_rules_import_no_rule_and_no_private_name():
    paths = sorted(Path(accrewrite.rules.__path__[0]).glob("*.py"))
    assert len(paths) > 30
    assert [wrong for path in paths for wrong in _violations(path)] == []


def test_the_check_sees_what_it_forbids(tmp_path):
    source = tmp_path / "acc999_x.py"
    source.write_text(
        "from accrewrite.rules.acc002_device_placement import DevicePlacement\n"
        "from .acc005_ddp_unwrap import DdpUnwrap\n"
        "from accrewrite.rules import acc007_amp\n"
        "import accrewrite.rules.acc008_syncfree_optimizer\n"
        "from accrewrite.analysis import _Analyzer\n"
        "from accrewrite.rules._training_code import LoopDiagnostic\n"
    )
    assert [wrong.split(" ", 1)[0] for wrong in _violations(source)] == [f"acc999_x.py:{n}" for n in range(1, 6)]


def test_with_commas_separates_all_but_the_last():
    code = cst.Module([]).code_for_node
    call = cst.parse_expression("f(a, b=1)")
    args = with_commas([*call.args, cst.Arg(cst.Integer("2"), keyword=cst.Name("c"))])
    assert code(call.with_changes(args=args)) == "f(a, b=1, c = 2)"
    call = cst.parse_expression("g(x=1, y=2,)")
    assert code(call.with_changes(args=with_commas(list(call.args[:1])))) == "g(x=1)"


def test_wrapped_models_follow_the_imports():
    module = cst.parse_module(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "import torch\n"
        "model = DDP(model) if ddp else model\n"
        "self.net = torch.nn.DataParallel(net)\n"
        "other = DDPish(model)\n"
        "if ddp:\n    first = DDP(first); second = DDP(second, device_ids=[0])\n"
        "class Trainer:\n    def __init__(self):\n        try:\n            self.body = DDP(body)\n"
        "        except Exception:\n            pass\n"
        "run(lambda: DDP(model))\n"
    )
    facts = analyze(module)
    assert wrapped_models(facts, module) == {"model", "self.net", "first", "second", "self.body"}
    assert wraps_model(facts, module.body[3].body[0].value)
    assert not wraps_model(facts, module.body[4].body[0].value)


def test_without_items_keeps_the_blocks_comments_where_no_item_is_left():
    code = cst.Module([]).code_for_node
    statement = cst.parse_module(
        "setup()\n# before\nwith a(), b() as c:  # on its line\n    first()\n    last()\n    # closing\n"
    ).body[1]
    assert code(without_items(statement, [True, False])) == (
        "# before\nwith b() as c:  # on its line\n    first()\n    last()\n    # closing\n")
    flattened = cst.Module(list(without_items(statement, [True, True]).nodes))
    assert flattened.code == "# before\n# on its line\nfirst()\n# closing\nlast()\n"
    suite = cst.parse_module("with a(): run()\n").body[0]
    assert cst.Module(list(without_items(suite, [True]).nodes)).code == "run()\n"
