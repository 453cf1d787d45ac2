"""The analysis pass: names resolve through imports, training-script facts are found."""

import libcst as cst
import pytest

from accrewrite import analysis
from accrewrite.analysis import analyze
from accrewrite.facts import Triggers
from accrewrite.nodes import walk


def facts_of(code: str):
    module = cst.parse_module(code)
    return module, analyze(module)


def expression(module, text):
    """The first node in ``module`` whose code is ``text``."""
    found = []

    class Finder(cst.CSTVisitor):
        def on_visit(self, node):
            if not found and isinstance(node, cst.BaseExpression) and module.code_for_node(node) == text:
                found.append(node)
            return not found

    module.visit(Finder())
    return found[0]


def test_names_resolve_through_aliases_and_from_imports():
    module, facts = facts_of(
        "import torch.optim as optim\nfrom torch.optim import AdamW as W\nimport torch.nn as nn\n"
        "import torch.distributed\nfrom torch import cuda\n"
        "a = optim.Adam\nb = W\nc = nn.LayerNorm\nd = torch.distributed.init_process_group\ne = cuda.manual_seed\n"
        "f = unknown.thing\n"
    )
    resolved = {text: facts.file.qualname(expression(module, text)) for text in
                ("optim.Adam", "W", "nn.LayerNorm", "torch.distributed.init_process_group", "cuda.manual_seed",
                 "unknown.thing")}
    assert resolved == {
        "optim.Adam": "torch.optim.Adam",
        "W": "torch.optim.AdamW",
        "nn.LayerNorm": "torch.nn.LayerNorm",
        "torch.distributed.init_process_group": "torch.distributed.init_process_group",
        "cuda.manual_seed": "torch.cuda.manual_seed",
        "unknown.thing": None,
    }


TRAINING = '''
import torch
from torch.utils.data import DataLoader
from torch.cuda.amp import GradScaler
from torch.nn.parallel import DistributedDataParallel as DDP

device = torch.device("cuda")
train_loader = DataLoader(dataset, batch_size=8)
net = Net()
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
scaler = GradScaler()
ddp = DDP(net)

def train_step(batch):
    loss = ddp(batch).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)

for epoch in range(3):
    for batch in train_loader:
        train_step(batch)

for batch in eval_loader:
    print(batch)
'''


LATE_IMPORT = "def build():\n    return torch.cuda.amp.GradScaler()\nimport torch\n"


@pytest.mark.parametrize("source, first", [
    ('"""A script."""\nimport torch\nfrom torch import nn as tnn\n' + LATE_IMPORT.replace("import torch\n", ""), False),
    (LATE_IMPORT, True),
    ("x = 1; import torch\n" + LATE_IMPORT.replace("import torch\n", ""), True),
    ("import torch  # import what the script needs\n" + LATE_IMPORT.replace("import torch\n", ""), True),
    ("import torch  # the imports, as importlib reads them\n" + LATE_IMPORT.replace("import torch\n", ""), False),
    ("torch.manual_seed(0)\nimport torch\n", True),  # an expression, not a docstring, above it
])
def test_the_imports_are_noted_first_unless_every_one_opens_the_file(monkeypatch, source, first):
    noted = []
    monkeypatch.setattr(analysis, "_import_statements", lambda module: noted.append(1) or [])
    facts = analyze(cst.parse_module(source), text=source)
    assert bool(noted) == first
    assert facts.file.imports["torch"] == "torch"


def test_training_facts():
    module, facts = facts_of(TRAINING)
    assert [device.name for device in facts.devices] == ["device"]
    assert facts.file.loaders == {"train_loader"}
    assert set(facts.optimizers) == {"optimizer"}  # the scheduler is not an optimizer
    assert facts.scalers == {"scaler"}
    assert facts.file.models == {"net", "ddp"}
    loops = {module.code_for_node(loop.node.iter) for loop in facts.loops}
    assert loops == {"train_loader", "range(3)"}  # the eval loop trains nothing


def test_imports_below_their_use_resolve_too():
    """A function defined above the file's imports (or a script that imports at its end) uses
    what they import: its scaler, loader and optimizer are found as where the imports come
    first (the order a migration's added imports give a second run)."""
    module, facts = facts_of(
        "def build(model, data):\n"
        "    scaler = torch.cuda.amp.GradScaler()\n"
        "    loader = DataLoader(data)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    return scaler, loader, optimizer\n"
        "if __name__ == '__main__':\n"
        "    import torch\n"
        "    from torch.utils.data import DataLoader\n"
    )
    assert facts.scalers == {"scaler"} and facts.file.loaders == {"loader"} and set(facts.optimizers) == {"optimizer"}
    assert facts.uses_grad_scaler


def test_direct_training_loop_and_methods():
    module, facts = facts_of(
        "import torch\nclass Trainer:\n"
        "    def run(self):\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "        while True:\n"
        "            self.model(x).sum().backward()\n"
        "            self.optimizer.step()\n"
    )
    (loop,) = facts.loops
    assert loop.calls_backward and loop.calls_step and isinstance(loop.node, cst.While)
    assert loop.scope.name.value == "run"
    assert "self.model" in facts.file.models and "self.optimizer" in facts.optimizers


class _Cuda:
    triggers, trigger_nodes = frozenset({"cuda"}), ()


class _Slices:
    triggers, trigger_nodes = frozenset(), (cst.Slice,)


class _Everything:
    triggers, trigger_nodes = None, ()


def test_each_statement_concerns_the_rules_whose_trigger_words_it_or_a_statement_in_it_mentions():
    module = cst.parse_module(
        "import torch\nx = 1\ndef f():\n    y = 2\n    z = y[1:]\n    return y.cuda()\n"
        "from torch import cuda as c\nc.synchronize()\n"
    )
    facts = analyze(module, Triggers.of((_Cuda, _Slices)))
    concerned = {module.code_for_node(node).strip().splitlines()[0]: facts.concerned(node) for node in facts.hot}
    # bit 0: _Cuda (the alias ``c`` stands for its word), bit 1: _Slices (a node type, not a word)
    assert concerned == {"def f():": 0b11, "z = y[1:]": 0b10, "return y.cuda()": 0b01,
                         "from torch import cuda as c": 0b01, "c.synchronize()": 0b01}
    assert facts.concerned(module.body[1]) == 0  # x = 1: walked for no rule
    everything = analyze(module, Triggers.of((_Cuda, _Everything)))
    assert everything.concerned(module.body[1]) == 0b10 and everything.concerned(module.body[2]) == 0b11
    assert analyze(module).concerned(module.body[1]) == -1  # no triggers: every rule everywhere


def test_a_training_loop_concerns_every_rule_also_when_its_step_is_in_a_function_it_calls():
    module = cst.parse_module(
        "def train(model, opt):\n    model(1).backward()\n    opt.step()\n"
        "for epoch in range(3):\n    train(model, opt)\n"
    )
    facts = analyze(module, Triggers.of((_Cuda, _Slices)))
    assert [loop.node for loop in facts.loops] == [module.body[1]]
    assert facts.concerned(module.body[1]) == 0b11


def test_inert_subtrees_hold_no_walked_node_type():
    module = cst.parse_module("x = f(a, b.c, [1, g(2)])\n")
    facts = analyze(module, walked=frozenset({"SimpleStatementLine", "Call"}))
    every = []
    walk(module, every.append)
    inert = {module.code_for_node(node) for node in every if id(node) in facts.inert}
    # the names, the attribute and the literal 1 hold no call; the list holds g(2)
    assert {"x", "f", "a", "b.c", "1", "2"} <= inert
    assert not inert & {"f(a, b.c, [1, g(2)])", "[1, g(2)]", "g(2)", "x = f(a, b.c, [1, g(2)])\n"}


def test_a_rule_visiting_punctuation_turns_inert_subtrees_off():
    from accrewrite.rules.acc001_rng_seed import RngSeed
    from accrewrite.transform import walked_types

    class CommaRule(RngSeed):
        def visit_Comma(self, node):
            pass

    assert walked_types((RngSeed,)) is not None
    assert walked_types((RngSeed, CommaRule)) is None


SCOPES = '''\
import os.path, numpy as np
from torch import nn as tnn
total = 0
(head, *rest), last = pair
if (found := search()):
    with open(p) as handle:
        pass


@register(d := 1)
def train(model, *args, lr=(default := 2), **kwargs):
    global total
    step: int = 0
    step += 1
    for batch, target in loader:
        loss = model(batch)
    try:
        pass
    except ValueError as error:
        pass
    squares = [k for k in range(3) if (inner := k)]
    scale = lambda v: (w := v)

    def helper():
        nonlocal step
        step = 2
        return helper

    class Local:
        attribute = 1

        def method(self):
            local = 3
    return total


class Trainer(tnn.Module):
    size = 1

    def fit(self): pass

    class Inner:
        def deep(self):
            pass


def outer():
    def middle():
        def inner():
            pass
'''


def test_the_walk_notes_each_bodys_local_names_and_the_files_functions_and_classes():
    module = cst.parse_module(SCOPES)
    facts = analyze(module)
    functions = {function.name.value: function for function in facts.file.definitions.functions}
    local = {name: facts.file.local_names[function.body] for name, function in functions.items()}
    assert facts.file.local_names[module] == {
        "os", "np", "tnn", "total", "head", "rest", "last", "found", "handle", "train", "Trainer", "outer",
    }
    assert local["train"] == {"step", "batch", "target", "loss", "error", "squares", "scale", "helper", "Local"}
    assert local["helper"] == set() and local["method"] == {"local"} and local["fit"] == set()
    assert local["outer"] == {"middle"} and local["middle"] == {"inner"}
    definitions = facts.file.definitions
    assert list(definitions.defined) == ["train", "Trainer", "outer"]
    assert definitions.classes == {"Trainer": definitions.defined["Trainer"]}
    trainer = definitions.defined["Trainer"]
    inner = next(node for node in definitions.methods if node.name.value == "Inner")
    assert list(definitions.methods[trainer]) == ["fit"] and list(definitions.methods[inner]) == ["deep"]
    assert definitions.nested == {
        (functions["train"], "helper"): functions["helper"], (functions["outer"], "middle"): functions["middle"],
        (functions["middle"], "inner"): functions["inner"],
    }
    train = definitions.functions[functions["train"]]
    assert (train.owner, train.parent, train.params) == (None, None, ("model",))  # the positional ones
    method = definitions.functions[functions["method"]]
    assert (method.owner.name.value, method.parent, method.params) == ("Local", None, ("self",))


_REDUCES = {
    "over the parameters": "for p in model.parameters():\n    dist.all_reduce(p.grad)\n",
    "a helper's .grad.data": "def average(model):\n    for p in model.parameters():\n"
                             "        dist.all_reduce(p.grad.data)\n",
    "a flat buffer": "grads = [p.grad for p in model.parameters()]\nflat = torch.cat([g.view(-1) for g in grads])\n"
                     "dist.all_reduce(flat)\n",
    "a helper given them": "def sync(tensors):\n    for t in tensors:\n        dist.all_reduce(t)\n"
                           "sync([p.grad for p in model.parameters()])\n",
    "a helper for other modules": "def all_reduce_grads(grads):\n    for g in grads:\n        dist.all_reduce(g)\n",
}
_REDUCES_NOT = {
    "a gather's backward": "class FullGatherLayer(torch.autograd.Function):\n    @staticmethod\n"
                           "    def backward(ctx, *grads):\n        all_gradients = torch.stack(grads)\n"
                           "        dist.all_reduce(all_gradients)\n        return all_gradients[dist.get_rank()]\n",
    "a gradient norm": "grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                       "dist.all_reduce(grad_norm)\n",
    "a norm of gradients": "gnorm = torch.stack([p.grad.norm() for p in params]).norm()\ndist.all_reduce(gnorm)\n",
    "the loss": "dist.all_reduce(loss)\n",
    "a helper given the loss": "def average(grad_like):\n    dist.all_reduce(grad_like)\naverage(loss)\n",
}


@pytest.mark.parametrize("code", list(_REDUCES.values()), ids=list(_REDUCES))
def test_a_script_reduces_gradients_where_it_all_reduces_its_parameters_gradients(code):
    assert facts_of("import torch\nimport torch.distributed as dist\n" + code)[1].reduces_gradients


@pytest.mark.parametrize("code", list(_REDUCES_NOT.values()), ids=list(_REDUCES_NOT))
def test_an_all_reduce_of_anything_else_named_grad_is_no_gradient_reduction(code):
    assert not facts_of("import torch\nimport torch.distributed as dist\n" + code)[1].reduces_gradients
