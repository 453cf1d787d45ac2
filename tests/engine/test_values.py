"""The data-flow analysis of values (``accrewrite.values``): what each expression holds, where it
is. Python numbers must never be taken for tensors: a diagnostic on a loop counter is worse than
none."""

import textwrap

import libcst as cst
import pytest

from accrewrite.analysis import analyze
from accrewrite.values import Kind, bound_names, read_chains, read_names, target_names


def kinds(code: str, *expressions: str) -> list[Kind]:
    """The kind of each expression, at its last occurrence in ``code`` (in the function that
    holds it)."""
    module = cst.parse_module(textwrap.dedent(code))
    facts = analyze(module)
    found: dict[str, tuple] = {}
    skipped: set = set()

    class Finder(cst.CSTVisitor):
        def __init__(self):
            self.scopes = [None]

        def visit_FunctionDef(self, node):
            self.scopes.append(node)

        def leave_FunctionDef(self, node):
            self.scopes.pop()

        def on_visit(self, node):
            if isinstance(node, cst.Attribute):
                skipped.add(node.attr)  # ``self.gpu_id``'s ``gpu_id`` is not the variable
            if isinstance(node, cst.BaseExpression) and node not in skipped:
                text = module.code_for_node(node)
                if text in expressions:
                    found[text] = (node, self.scopes[-1])
            return super().on_visit(node)

    module.visit(Finder())
    missing = [e for e in expressions if e not in found]
    assert not missing, f"not in the code: {missing}"
    return [facts.values(found[e][1]).kind(found[e][0]) for e in expressions]


def test_loop_counters_config_values_and_item_results_are_python_numbers():
    code = """
    import torch
    from torch.utils.data import DataLoader

    eval_interval = 250
    max_iters = 5000
    loader = DataLoader(dataset, batch_size=8)
    iter_num = 0
    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        lossf = loss.item()
        if iter_num % eval_interval == 0 and iter_num > max_iters:
            pass
        iter_num += 1
    """
    assert kinds(code, "step", "x", "loss", "lossf", "iter_num % eval_interval == 0", "iter_num > max_iters") == [
        Kind.INT, Kind.TENSOR, Kind.TENSOR, Kind.FLOAT, Kind.BOOL, Kind.BOOL,
    ]


def test_a_device_loader_gives_what_its_loader_gives():
    # A migrated notebook's loop over its progress bar: the counter stays a number.
    code = """
    import torch_xla.distributed.parallel_loader as pl
    from tqdm.auto import tqdm

    progress_bar = tqdm(enumerate(dataloader), total=len(dataloader))
    for batch, (X, y) in pl.MpDeviceLoader(progress_bar, device):
        loss = loss_fn(model(X), y)
        print(batch + 1, X)
    """
    assert kinds(code, "batch + 1", "X") == [Kind.INT, Kind.TENSOR]


def test_values_from_a_checkpoint_dict_are_not_tensors():
    code = """
    import torch

    checkpoint = torch.load("ckpt.pt", map_location="cpu")
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
    if best_val_loss < 1.0:
        pass
    """
    assert kinds(code, "iter_num", "best_val_loss < 1.0") == [Kind.UNKNOWN, Kind.UNKNOWN]


def test_a_literal_initialiser_takes_the_kind_of_what_accumulates():
    code = """
    import torch

    def train(model, loader):
        total = 0
        running = 0.0
        best = 1e9
        for x in loader:
            loss = model(x)
            total += loss
            running += loss.item()
            best = min(best, loss)
        print(total, running, best)
    """
    assert kinds(code, "total", "running", "best") == [Kind.TENSOR, Kind.FLOAT, Kind.TENSOR]


def test_a_name_holds_what_its_latest_assignment_gave():
    code = """
    import torch

    tokens = enc.encode("Hello")
    first = tokens
    tokens = torch.tensor(tokens, dtype=torch.long)
    second = tokens
    print(first, second)
    """
    assert kinds(code, "first", "second") == [Kind.UNKNOWN, Kind.CPU]


def test_branches_meet_after_an_if():
    code = """
    import torch

    def f(flag):
        if flag:
            value = torch.zeros(1)
        else:
            value = 0.5
        return value
    """
    assert kinds(code, "value") == [Kind.UNKNOWN]


def test_argparse_options_have_their_declared_types():
    code = """
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", default=None, type=int)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--arch", default="resnet18")
    args = parser.parse_args()
    print(args.gpu, args.lr, args.dry_run, args.arch)
    """
    assert kinds(code, "args.gpu", "args.lr", "args.dry_run", "args.arch") == [
        Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.STR,
    ]


def test_trainer_attributes_and_parameters_from_callers():
    code = """
    import os
    import torch
    from torch.utils.data import DataLoader

    class Trainer:
        def __init__(self, model, train_data: DataLoader, gpu_id):
            self.gpu_id = gpu_id
            self.local_rank = int(os.environ["LOCAL_RANK"])
            self.train_data = train_data
            self.model = model.to(gpu_id)

        def _run_epoch(self, epoch):
            for source, targets in self.train_data:
                source = source.to(self.gpu_id)
                print(self.local_rank, epoch, source)

    def main(device):
        trainer = Trainer(torch.nn.Linear(2, 2), DataLoader([]), device)

    device = 0
    main(device)
    """
    assert kinds(code, "self.train_data", "source", "self.gpu_id", "self.local_rank", "gpu_id") == [
        Kind.LOADER, Kind.TENSOR, Kind.INT, Kind.INT, Kind.INT,
    ]


def test_functions_of_the_file_return_what_their_returns_give():
    code = """
    import math
    import torch

    def get_batch(split):
        ix = torch.randint(100, (4,))
        x = torch.stack([data[i:i + 8] for i in ix])
        return x, x

    def get_lr(it):
        if it < 100:
            return 6e-4 * it / 100
        return 6e-5 + 0.5 * (1.0 + math.cos(math.pi * it))

    X, Y = get_batch("train")
    lr = get_lr(3)
    print(X, Y, lr)
    """
    assert kinds(code, "X", "Y", "lr") == [Kind.TENSOR, Kind.TENSOR, Kind.FLOAT]


def test_model_methods_other_than_forward_and_classes_given_tensors_are_not_tensors():
    code = """
    import torch

    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters())
    mfu = model.estimate_mfu(12, 0.1)
    logits = model(idx)
    ema = ModelEMA(model)
    muon = Muon([p for p in model.parameters()], lr=0.02)
    print(mfu, logits, ema, muon)
    """
    assert kinds(code, "mfu", "logits", "ema", "muon") == [Kind.UNKNOWN, Kind.TENSOR, Kind.UNKNOWN, Kind.UNKNOWN]


def test_loops_over_names_items_and_wrapped_enumerations():
    code = """
    import torch
    from tqdm import tqdm

    def train(model, train_loader):
        for name, p in model.named_parameters():
            print(name, p)
        pbar = enumerate(train_loader)
        pbar = tqdm(pbar, total=10)
        for i, (imgs, targets) in pbar:
            ni = i + 10
        n = sum(p.numel() for p in model.parameters())
        print(ni, n)
    """
    assert kinds(code, "name", "p", "i", "imgs", "ni", "n") == [
        Kind.STR, Kind.TENSOR, Kind.INT, Kind.TENSOR, Kind.INT, Kind.INT,
    ]


@pytest.mark.parametrize("test, kind", [
    ("loss > best", Kind.MASK),
    ("loss.item() > 10", Kind.BOOL),
    ("torch.isnan(loss)", Kind.TENSOR),
    ("(x != 0).any()", Kind.TENSOR),
    ("step % 10 == 0", Kind.BOOL),
])
def test_tests_on_tensors_and_on_numbers(test, kind):
    code = f"""
    import torch

    for step, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y)
        if {test}:
            pass
    """
    assert kinds(code, test) == [kind]


def test_host_tensors_are_told_from_device_tensors():
    code = """
    import torch

    @torch.no_grad()
    def estimate_loss():
        out = {}
        losses = torch.zeros(10)
        for k in range(10):
            X, Y = get_batch()
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out["val"] = losses.mean()
        return out

    x = torch.stack([torch.from_numpy(data[i:i + 8]) for i in ix])
    moved = x.pin_memory().to(device, non_blocking=True)
    half = x.to(torch.float16)
    ones = torch.ones(3, device=device)
    losses = estimate_loss()
    print(x, moved, half, ones, losses["val"])
    """
    assert kinds(code, "x", "moved", "half", "ones", 'losses["val"]') == [
        Kind.CPU, Kind.TENSOR, Kind.CPU, Kind.TENSOR, Kind.PYTHON,
    ]



def test_a_parameter_that_the_function_concatenates_is_a_tensor():
    code = """
    import torch

    class GPT(torch.nn.Module):
        def generate(self, idx, steps, names):
            for _ in range(steps):
                idx_cond = idx[:, -8:]
                idx_next = torch.multinomial(self(idx_cond).softmax(-1)[:, -1], 1)
                idx = torch.cat((idx, idx_next), dim=1)
            return idx, names

    def crop(seq, block_size):
        return seq[-block_size:]
    """
    assert kinds(code, "idx_cond", "names", "seq") == [Kind.TENSOR, Kind.UNKNOWN, Kind.UNKNOWN]


def test_a_function_computed_while_its_caller_was_first_read_gives_its_return_there():
    # gat's shape: train_iter is read first; test() asks its callers what they pass, which walks
    # train_iter while test()'s return is unknown. The floats test() returns are not tensors.
    code = """
    import torch

    def train_iter(model, optimizer, x, y):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        loss_val, acc_val = test(model, x, y)
        print(loss_val, acc_val)

    def test(model, x, y):
        with torch.no_grad():
            out = model(x)
            loss = criterion(out, y)
            acc = (out.argmax(1) == y).float().mean()
        return loss.item(), acc.item()

    features = torch.randn(100, 16).cuda()
    labels = torch.randint(0, 4, (100,)).cuda()
    for epoch in range(100):
        train_iter(model, optimizer, features, labels)
    loss_test, acc_test = test(model, features, labels)
    print(loss_test)
    """
    assert kinds(code, "print(loss_val, acc_val)", "loss_val", "acc_val", "loss_test") == [
        Kind.NONE, Kind.FLOAT, Kind.FLOAT, Kind.FLOAT,
    ]


def test_a_tensor_or_none_is_read_as_a_tensor():
    code = """
    import torch

    for step, (x, y) in enumerate(loader):
        out = model(x)
        if mixup is None:
            acc = (out.argmax(-1) == y).float().mean()
        else:
            acc = None
        best = None if step == 0 else out.max()
        ready = acc is not None
        print(acc, best, ready)
    """
    assert kinds(code, "acc", "best", "ready") == [Kind.TENSOR, Kind.TENSOR, Kind.BOOL]


def test_containers_given_tensors_hold_tensors():
    code = """
    import torch

    def accuracy(output, target):
        res = []
        res.append((output.argmax(-1) == target).float().mean())
        return res

    model = torch.nn.Linear(16, 4)
    for x, y in loader:
        out = model(x)
        values = []
        values.append(out.sum().item())
        acc1 = accuracy(out, y)
        weights = model.state_dict()
        copies = [w.cpu() for w in weights.values()]
        print(values, acc1, acc1[0], weights, copies)
    """
    assert kinds(code, "values", "acc1", "acc1[0]", "weights", "w") == [
        Kind.PYTHON, Kind.HOLDER, Kind.TENSOR, Kind.HOLDER, Kind.TENSOR,
    ]


def test_the_truth_value_of_a_container_of_tensors_is_its_length():
    module = cst.parse_module(textwrap.dedent("""
    import torch

    saved = {}
    for x in loader:
        out = model(x)
        if not saved:
            saved["first"] = out[:1].clone()
        if not out.isfinite().all():
            break
    """))
    facts = analyze(module)
    loop = module.body[-1]
    tests = [statement.test for statement in loop.body.body[1:]]
    values = facts.values(None)
    assert [values.sync(test) for test in tests] == [None, "a tensor's truth value"]


def test_formatting_with_percent_gives_a_string():
    code = """
    for x in loader:
        loss = model(x).sum()
        line = "loss %f" % loss
        row = "%d: %f" % (step, loss)
        print(line, row)
    """
    assert kinds(code, "line", "row") == [Kind.STR, Kind.STR]


def test_a_helper_returning_its_argument_read_on_the_host_syncs_where_called():
    module = cst.parse_module(textwrap.dedent("""
    import torch

    def to_python_float(t):
        return t.float().item()

    def scaled(t, factor):
        return t * factor

    for x in loader:
        loss = model(x).sum()
        value = to_python_float(loss)
        steps = to_python_float(3)
        other = scaled(loss, 2)
    """))
    facts = analyze(module)
    assert facts.file.returned_reads == {"to_python_float": frozenset({"t"})}
    loop = module.body[-1]
    calls = [line.body[0].value for line in loop.body.body[1:]]
    values = facts.values(None)
    assert [values.sync(call) for call in calls] == ["to_python_float() returns it read on the host", None, None]


def test_the_names_an_expression_reads_binds_and_assigns():
    def expression(code):
        return cst.parse_expression(code)

    call = expression("opt.step(model.module.parameters(), lr=lr, fn=lambda g: g * scale)")
    assert read_names(call) == {"opt", "model", "lr", "g", "scale"}
    assert read_chains(call) == {"opt", "opt.step", "model", "model.module", "model.module.parameters", "lr", "g",
                                 "scale"}
    assert read_chains(expression("f().grad + x[0].grad")) == {"f", "x"}
    assert target_names(expression("(a, [b, *c]), d.e, f[0]")) == {"a", "b", "c"}
    assert bound_names(expression("[x + y for x, (y, *z) in pairs if (lambda u, v=1: u)(x)]")) == {"x", "y", "z", "u", "v"}


def test_what_reads_a_batchs_values_and_what_must_be_on_the_host():
    module = cst.parse_module(textwrap.dedent("""
    import numpy as np
    import torch

    for step, (x, labels) in enumerate(loader):
        n = labels.size(0) + len(labels) + x.shape[0] + labels.sum().item() + step
        moved = labels.to(device)
        cast = labels.to(torch.float16)
        picked = labels[torch.randperm(n)]
        out = torch.zeros(n, 3)
        out[np.arange(n), labels] = 1
        joined = torch.cat([x, out], dim=1)
        out[0] = labels[:3]
        shown = labels.numpy()
        counts = np.bincount(labels)
        logits = model(x)
    """))
    facts = analyze(module)
    values = facts.values(None)
    loop = module.body[-1]
    statements = [line.body[0] for line in loop.body.body]
    batch = {"x", "labels", "step"}
    reads = [values.tensor_read(statement.value, batch) for statement in statements if type(statement) is cst.Assign]
    assert reads == [None, None, "labels", "labels", None, None, "x", "labels", "labels", "labels", "x"]
    carried = [values.carries(statement.value, batch) for statement in statements[:4] + statements[-1:]]
    assert carried == [False, False, True, True, False]  # a model's output is not the batch's
    uses = [values.host_use(node, batch) for node in (
        statements[5].targets[0].target, statements[6].value, statements[7], statements[8].value,
        statements[9].value, statements[3].value)]
    assert uses == [
        ("labels", "indexes a tensor made on the host with it"), ("x", "computes with it and a tensor made on the host"),
        ("labels", "puts it into a tensor made on the host"), ("labels", "reads it with .numpy()"),
        ("labels", "passes it to numpy.bincount()"), None,  # indexing the batch with a host permutation works
    ]


def test_where_every_path_bound_a_name_last():
    """``bindings_at``: the statements whose binding of a name the paths to a statement come
    through last (none where a path binds it nowhere); ``bindings_after``: the same past a
    compound statement, where its paths meet."""
    module = cst.parse_module(textwrap.dedent("""
    def main(args, cuda):
        device = "cpu"
        if args.resume:
            loc = "cuda:0"
        if cuda:
            device = "cuda"
        try:
            rank = int(args.rank)
        except ValueError:
            raise
        for x in loader:
            out = x
            del out
        with open(args.log) as log:
            log.write(device)
        if rank:
            return loc
    """))
    main = module.body[0]
    values = analyze(module).values(main)
    first, resume, choice, attempt, loop, logging, last = main.body.body
    assert values.bindings_at("device", resume) == {first}
    assert values.bindings_at("loc", choice) == frozenset()  # the run may skip the resume branch
    assert values.bindings_after("device", choice) == {first, choice.body.body[0]}
    assert values.bindings_after("rank", attempt) == {attempt.body.body[0]}  # the handler raises
    assert values.bindings_after("x", loop) == frozenset()  # the loader may be empty
    assert values.bindings_at("out", loop.body.body[1]) == {loop.body.body[0]}
    assert values.bindings_after("out", loop) == frozenset()  # ``del``
    assert values.bindings_after("log", logging) == {logging}
    assert values.bindings_at("loc", last) == frozenset()
    assert values.bindings_at("args", last) == {main}  # a parameter


def test_the_reads_a_binding_reaches():
    """``reads_reached``: the reads of a name that may see one binding's value (through it, or
    through no binding known), not an assignment's target nor an attribute of the same name;
    None where a function or lambda reads the name."""
    module = cst.parse_module(textwrap.dedent("""
    def main(loader, log):
        score = 0.0
        for x in loader:
            print(score)
            score = x.mean().item()
            log.score = score
            if x.ndim:
                score = 1.0
            print(score)
        return score
    """))
    main = module.body[0]
    values = analyze(module).values(main)
    first, loop, returned = main.body.body
    before, inside, stored, branch, after = loop.body.body
    in_loop = values.reads_reached("score", inside)
    assert [values.statement_of(read) for read in in_loop] == [
        before.body[0], stored.body[0], after.body[0], returned.body[0]]
    # (the loop's own binding comes before its second print on every path)
    assert [values.statement_of(read) for read in values.reads_reached("score", first)] == [
        before.body[0], returned.body[0]]
    callback = cst.parse_module("def main(loader):\n    for x in loader:\n        s = x.item()\n        f = lambda: s\n")
    line = callback.body[0].body.body[0].body.body[0]
    assert analyze(callback).values(callback.body[0]).reads_reached("s", line) is None
    shared = cst.parse_module("def main(loader):\n    global s\n    for x in loader:\n        s = x.item()\n")
    line = shared.body[0].body.body[1].body.body[0]
    assert analyze(shared).values(shared.body[0]).reads_reached("s", line) is None


def test_a_module_built_and_never_moved_stays_on_the_host():
    code = textwrap.dedent("""
        import torch

        def look(model):
            return model.weight.shape

        def place(model, device):
            model.to(device)

        on_host = torch.nn.Linear(2, 2)
        to_cpu = torch.nn.Linear(2, 2)
        to_cpu.to("cpu")
        looked_at = torch.nn.Linear(2, 2)
        look(looked_at)
        moved = torch.nn.Linear(2, 2).to("cuda")
        built_there = torch.nn.Linear(2, 2, device="cuda")
        placed = torch.nn.Linear(2, 2)
        place(placed, "cuda")
        aliased = torch.nn.Linear(2, 2)
        other = aliased
        other.cuda()
        wrapped = torch.nn.Linear(2, 2)
        parallel = torch.nn.DataParallel(wrapped).cuda()
    """)
    module = cst.parse_module(code)
    facts = analyze(module)
    kept = facts.values(None).file.kept_on_host
    assert [kept(name) for name in ("on_host", "to_cpu", "looked_at")] == [True, True, True]
    assert not any(kept(name) for name in ("moved", "built_there", "placed", "aliased", "wrapped", "unbound"))
