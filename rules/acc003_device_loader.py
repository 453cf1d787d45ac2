import libcst as cst

from accrewrite.nodes import call_arg, descendants, dotted, rebuilt
from accrewrite.positions import starts
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.rules._generation import grown_sequence
from accrewrite.rules._loader_feeds import Plan, Planner, bind_comprehension, root
from accrewrite.toolbox import with_commas

_DTYPE_PREFIX = "torch."  # .to(torch.float16) converts, it does not move


class DeviceLoader(Rule):
    """Feed training and evaluation loops from a device loader, and stop moving each batch.

    TorchAcc's migration guide, step 2: `loader = pl.MpDeviceLoader(loader, device)`. The device loader copies
    the next batches to the device in the background while the current step runs, so the
    per-batch `x = x.to(device)` / `.cuda()` in the loop is removed (as are dict and tuple
    forms such as `batch = {k: v.to(device) for k, v in batch.items()}`). What a move does
    besides moving stays: `x.to(device, torch.float16)` becomes `x.to(torch.float16)`, and
    timm's cast to the model's dtype, `x.to(device=device, dtype=model_dtype)`, becomes
    `x.to(dtype=model_dtype)`; a `memory_format=` or `copy=True` stays too, while
    `non_blocking` goes (no transfer is left to overlap), and `tuple(t.to(device) for t in
    batch)` still makes a tuple of the DataLoader's list. A move whose arguments cannot be told
    (`x.to(device, **options)`) stays whole: moving a batch already on the device costs nothing.

    Which loops: those whose batches reach the device. A loop that moves a batch value
    (`x.to(device)`, `.cuda()`) is fed, and so is one that trains or calls a model in a file
    that places something on a device (DataParallel moved its inputs itself), unless each model
    it calls is one the file builds and never moves (a course's first model, trained on the
    CPU before the next is placed: `.to("cpu")` keeps it there): its batches stay on the host. A loop that only
    looks at a batch (`for x, y in loader: print(x.shape); break`, a plot) keeps the loader,
    and a tensor the loop makes itself (`z = torch.randn(n, d).to(device)`) keeps its move.
    So does a loop that works on a batch element on the host before it moves it, which it
    could not do on the device: fills a tensor made on the host with it (StarGAN's one-hot
    labels, `out[np.arange(n), labels.long()] = 1` after `out = torch.zeros(n, d)`), computes
    with one, reads it with `.numpy()` or a numpy, PIL or OpenCV call, or passes it to a
    function of the file that does one of these. Each element (the loop target's names,
    what `next(it)` gives, what is read from them: `batch["x"]`, `labels[perm]`) is followed
    through the loop until it is moved; its size, shape or `len()`, indexing it with a
    permutation made on the host, and any use after its move work on the device. Such a
    loop keeps its loader and its moves, and the finding names the use: move that work after
    the move, onto the device or into the dataset, and migrate again.
    A file that trains models of its own (or tensors it made, updated by hand) and places
    nothing on a device trains on the host (seeding the device's generators or emptying its
    cache places nothing): it is left as it is, and its first training loop says so (batches
    on the device beside a model on the host would fail, as would the target's collectives on
    host tensors).

    Where the wrap goes: a `DataLoader` is rebound to the device loader at one point, after
    the loader and a device variable exist (after the device's statement when the device is
    chosen later in the loader's block, as in the guide's example), before every loop it feeds
    and after every loop
    that keeps the loader. The target's device loader then answers `len()`, `.dataset` and
    `.sampler.set_epoch()` like the loader it wraps. Where no such point exists, or the
    target's device loader does not stand in for the loader (torch_xla's has no `.dataset` or
    `.sampler`), each fed loop's iterable is wrapped instead (`for x, y in
    pl.MpDeviceLoader(loader, device)`), naming a device variable that every path there has
    chosen, else the target's device call, and the loader keeps its name and attributes. A loop over a
    function's parameter is fed by its callers when every call passes a rebound loader, and
    wrapped itself otherwise.

    A step loop that no device loader feeds (nanoGPT's `get_batch()` loop) ends each
    iteration with the target's `xm.mark_step()`: the device loader is what otherwise marks
    step boundaries, where step closures run and, on XLA, each step's graph is executed.
    """

    code = "ACC003"
    name = "device-loader"
    summary = "DataLoaders feeding the device -> the target's device loader; per-batch .to(device) removed; other step loops mark steps"
    concepts = ("device_loader",)
    # Training loops are always walked (the analysis marks them), so step loops need no word.
    triggers = frozenset({"DataLoader", "cuda", "device", "to", "iter", "cat", "concat"})
    examples = (
        Example(
            before="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            device = torch.device("cuda")
            model = Net().to(device)
            for epoch in range(10):
                for step, (x, y) in enumerate(loader):
                    x, y = x.to(device), y.to(device)
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    optimizer.step()
                print(len(loader.dataset))
            """,
            after="""
            import torch
            from torch.utils.data import DataLoader
            import accrewrite.runtime.parallel_loader as pl

            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            device = torch.device("cuda")
            loader = pl.MpDeviceLoader(loader, device)
            model = Net().to(device)
            for epoch in range(10):
                for step, (x, y) in enumerate(loader):
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    optimizer.step()
                print(len(loader.dataset))
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def train(model, train_loader, device):
                for batch in train_loader:
                    batch = {k: v.to(device) for k, v in batch.items()}
                    inputs = batch["input_ids"].cuda(non_blocking=True)
                    model(inputs, **batch).loss.backward()
                    optimizer.step()
            """,
            after="""
            import torch
            import torch_xla.distributed.parallel_loader as pl

            def train(model, train_loader, device):
                for batch in pl.MpDeviceLoader(train_loader, device):
                    inputs = batch["input_ids"]
                    model(inputs, **batch).loss.backward()
                    optimizer.step()
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def train(model, loader, optimizer, device, model_dtype):
                for input, target in loader:
                    input, target = input.to(device=device, dtype=model_dtype), target.to(device=device)
                    loss = criterion(model(input), target)
                    loss.backward()
                    optimizer.step()

            def evaluate(model, loader, device):
                for batch in loader:
                    batch = {k: v.to(device, torch.float16, non_blocking=True) for k, v in batch.items()}
                    print(model(**batch).loss)
            """,
            after="""
            import torch
            import torch_xla.distributed.parallel_loader as pl

            def train(model, loader, optimizer, device, model_dtype):
                for input, target in pl.MpDeviceLoader(loader, device):
                    input = input.to(dtype=model_dtype)
                    loss = criterion(model(input), target)
                    loss.backward()
                    optimizer.step()

            def evaluate(model, loader, device):
                for batch in pl.MpDeviceLoader(loader, device):
                    batch = {k: v.to(torch.float16) for k, v in batch.items()}
                    print(model(**batch).loss)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=32)
            for images, labels in loader:
                print(images.shape)
                break

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for images, labels in loader:
                images = images.to(device)
                noise = torch.randn(32, 8).to(device)
                loss = criterion(D(images), D(G(noise)))
                loss.backward()
                optimizer.step()
            """,
            after="""
            import torch
            from torch.utils.data import DataLoader
            import torch_xla.distributed.parallel_loader as pl

            loader = DataLoader(dataset, batch_size=32)
            for images, labels in loader:
                print(images.shape)
                break

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for images, labels in pl.MpDeviceLoader(loader, device):
                noise = torch.randn(32, 8).to(device)
                loss = criterion(D(images), D(G(noise)))
                loss.backward()
                optimizer.step()
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import numpy as np
            import torch

            def train(model, loader, optimizer, device):
                for images, labels in loader:
                    onehot = torch.zeros(labels.size(0), 10)
                    onehot[np.arange(labels.size(0)), labels] = 1
                    images, onehot = images.to(device), onehot.to(device)
                    loss = (model(images) - onehot).pow(2).mean()
                    loss.backward()
                    optimizer.step()
            """,
            after="""
            import numpy as np
            import torch
            import torch_xla

            def train(model, loader, optimizer, device):
                for images, labels in loader:
                    onehot = torch.zeros(labels.size(0), 10)
                    onehot[np.arange(labels.size(0)), labels] = 1
                    images, onehot = images.to(device), onehot.to(device)
                    loss = (model(images) - onehot).pow(2).mean()
                    loss.backward()
                    optimizer.step()
                    torch_xla.sync()
            """,
            diagnostics=("ACC003:7",),
        ),
        Example(
            before="""
            import torch

            model = torch.nn.Linear(20, 3)
            torch.cuda.manual_seed_all(0)
            for epoch in range(2):
                for inputs, labels in train_loader:
                    loss = criterion(model(inputs), labels)
                    loss.backward()
                    optimizer.step()
            """,
            diagnostics=("ACC003:5",),
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(dataset, batch_size=32)
            model_0 = torch.nn.Linear(4, 2)
            model_0.to("cpu")  # the first model trains on the CPU
            for X, y in loader:
                loss = loss_fn(model_0(X), y)
                loss.backward()
                optimizer_0.step()

            device = torch.device("cuda")
            model_1 = torch.nn.Linear(4, 2).to(device)
            for X, y in loader:
                loss = loss_fn(model_1(X), y)
                loss.backward()
                optimizer_1.step()
            """,
            after="""
            import torch
            from torch.utils.data import DataLoader
            import torch_xla.distributed.parallel_loader as pl

            loader = DataLoader(dataset, batch_size=32)
            model_0 = torch.nn.Linear(4, 2)
            model_0.to("cpu")  # the first model trains on the CPU
            for X, y in loader:
                loss = loss_fn(model_0(X), y)
                loss.backward()
                optimizer_0.step()

            device = torch.device("cuda")
            model_1 = torch.nn.Linear(4, 2).to(device)
            for X, y in pl.MpDeviceLoader(loader, device):
                loss = loss_fn(model_1(X), y)
                loss.backward()
                optimizer_1.step()
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch.nn.functional as F

            W = torch.randn((12, 27), requires_grad=True)
            for i in range(100):
                loss = F.cross_entropy(X @ W, Y)
                W.grad = None
                loss.backward()
                W.data += -0.1 * W.grad
            """,
            diagnostics=("ACC003:5",),
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self._planned: Plan | None = None
        # Fed loops being walked, innermost last.
        self._open: list[cst.For] = []
        # One-line loops that end each step with the mark on their line, and why.
        self._suite_marks: dict[cst.CSTNode, str] = {}

    def applies(self) -> bool:
        return bool(self.ctx.facts.file.loaders or self.ctx.facts.loops or self.ctx.target.has("lazy_execution"))

    @property
    def _plan(self) -> Plan:
        """Which loops the device loader feeds and where it goes (``rules/_loader_feeds.py``),
        planned when the walk first asks."""
        if self._planned is None:
            rebind = self.ctx.concept("device_loader").rebind
            self._planned = Planner(self.ctx.facts, self._is_move, rebind).build()
            self._report_host_uses(self._planned)
        return self._planned

    def _report_host_uses(self, plan: Plan) -> None:
        """The loops (and ``iter()`` calls) left unwrapped because a batch element is used on the
        host before it is moved: one finding per use and loader (an iterator made again where
        it runs out reads the same loader)."""
        left = {(used.at, loader): used for used, loader in plan.left.values()}
        if not left:
            return
        lines = starts(self.ctx.module, [used.use for used in left.values()])
        for (at, loader), used in left.items():
            self.ctx.diagnose(
                at, f"`{used.name}` is used on the host (line {lines[used.use][0]}) before it is moved; "
                f"`{loader}` left unwrapped",
                f"`{excerpt(self.ctx.code(used.use), 60)}` {used.how}. The target's device loader would deliver "
                "every element of the batch on the device, where this host-side work fails, so the loop keeps "
                f"reading `{loader}` and moving each batch itself. To read it from the device loader, do this work "
                "after the move, on the device (`torch.zeros(n, d, device=device)`) or in the dataset, then "
                "migrate again.",
            )

    def _device(self, device: str | None) -> str:
        return device or self.ctx.code(self.ctx.expr("device"))

    # Rebinding at the assignment ------------------------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # On the way down: another rule may replace this statement on the way up.
        for loader, device in self._plan.rebinds.get(node, ()):
            wrapped = self.ctx.expr("device_loader", loader=loader, device=self._device(device))
            line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.parse_expression(loader))], wrapped)])
            self.ctx.insert_after(node, [line])
            self.ctx.fix(node, f"{loader} is wrapped in the target's device loader")

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self._open and self._is_inside_fed_loop():
            return self._drop_batch_moves(original_node, updated_node)
        return updated_node

    # Loops ----------------------------------------------------------------------------------

    def visit_While(self, node: cst.While) -> None:
        self._refuse_on_host(node)
        self._mark_steps(node)

    def _refuse_on_host(self, node) -> None:
        if node is self._plan.on_host:
            self.ctx.refuse(
                node, "nothing in this file is placed on a device: it trains on the host; file left as it is",
                "No model or tensor is moved to a device, so the script trains on the CPU, and so would its "
                "migration, with loaders, collectives and optimizers of the target's that expect the device "
                "(batches on the device beside a model on the host fail). To train on the target's device, "
                "place the model and its inputs (`model.to(device)`, `x.to(device)`) and migrate again.",
            )

    def visit_For(self, node: cst.For) -> None:
        plan = self._plan
        if node in plan.fed:
            self._open.append(node)
            return
        self._refuse_on_host(node)
        self._mark_steps(node)

    def _mark_steps(self, node) -> None:
        """A step loop that no device loader feeds ends each step itself: the device loader
        is what marks step boundaries (where step closures run and, on XLA, the step's graph
        is cut and executed), so without one the loop calls the target's mark_step. So does a
        generation loop on a lazy device (a model called on a sequence that grows each
        iteration, ``idx = torch.cat((idx, idx_next), dim=1)``), whose graph would otherwise
        grow with every token."""
        loop = self.ctx.loop if self.ctx.loop is not None and self.ctx.loop.node is node else None
        generates = loop is None and self.ctx.target.has("lazy_execution") and self._generates(node)
        if not generates and (loop is None or not loop.calls_step or loop.encloses_step_loop):
            return
        body = node.body.body
        marks = self.ctx.statements("mark_step")
        spelled = {self.ctx.code(mark).strip() for mark in marks}
        if not body or any(mark in self.ctx.code(statement) for statement in body for mark in spelled):
            return  # marked already (guarded or not)
        why = ("each generated token ends the device's graph (it would grow with every token)" if generates
               else "the step loop marks each step's end (no device loader does it)")
        if type(node.body) is cst.SimpleStatementSuite:  # ``for ...: a; b`` ends with the mark on its line
            self._suite_marks[node] = why
        else:
            self.ctx.insert_after(body[-1], marks)
            self.ctx.fix(node, why)

    def _generates(self, node) -> bool:
        return grown_sequence(self.ctx.facts, node, self.ctx.facts.values(self.ctx.scope)) is not None

    def leave_Call(self, original_node, updated_node):
        """``it = iter(loader)`` whose ``next(it)`` feeds a training loop reads from the device
        loader where the loader is not rebound; a one-off ``next(iter(loader))`` keeps reading
        the loader."""
        wrap = self._plan.wraps.get(original_node)
        if wrap is None:
            return updated_node
        loader, device = wrap
        wrapped = self.ctx.expr("device_loader", loader=loader, device=self._device(device))
        self.ctx.fix(original_node, f"iter({loader}) reads from the target's device loader")
        return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=wrapped)])

    def leave_While(self, original_node, updated_node):
        return self._end_suite(original_node, updated_node)

    def _end_suite(self, original_node, updated_node):
        why = self._suite_marks.pop(original_node, None)
        if why is None:
            return updated_node
        marks = [small for line in self.ctx.statements("mark_step") for small in line.body]  # its imports go with this fix
        self.ctx.fix(original_node, why)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*updated_node.body.body, *marks]))

    def leave_For(self, original_node, updated_node):
        if self._open and self._open[-1] is original_node:
            self._open.pop()
        updated_node = self._end_suite(original_node, updated_node)
        wrap = self._plan.wraps.get(original_node)
        if wrap is None:
            return updated_node
        loader, device = wrap
        wrapped = self.ctx.expr("device_loader", loader=loader, device=self._device(device))
        self.ctx.fix(original_node, f"the loop over {loader} reads from the target's device loader")
        return updated_node.with_changes(iter=_replaced(updated_node.iter, loader, wrapped))

    # Per-batch moves --------------------------------------------------------------------------

    def leave_If(self, original_node, updated_node):
        """``if torch.cuda.is_available(): images = images.cuda()`` whose moves are gone goes
        too, and so does an ``else:`` branch that only moved the batch."""
        if not (self._open and self._is_inside_fed_loop()):
            return updated_node
        if original_node.orelse is None and _emptied(original_node.body, updated_node.body):
            self.ctx.fix(original_node, "removed a branch that only moved the batch: the device loader moves batches")
            return cst.RemoveFromParent()
        if isinstance(original_node.orelse, cst.Else) and _emptied(original_node.orelse.body, updated_node.orelse.body):
            self.ctx.fix(original_node, "removed a branch that only moved the batch: the device loader moves batches")
            return updated_node.with_changes(orelse=None)
        return updated_node

    def _is_inside_fed_loop(self) -> bool:
        """Whether the walk is in a fed loop's own body (not in a function defined there)."""
        loop = self._open[-1]
        opened = self.ctx.open_statements
        return loop in opened and not any(isinstance(s, cst.FunctionDef) for s in opened[opened.index(loop):])

    def _drop_batch_moves(self, original_node, updated_node):
        if len(updated_node.body) != 1:
            return updated_node
        statement = updated_node.body[0]
        batch = self._plan.batch_at.get(original_node, frozenset())
        if isinstance(statement, cst.Expr) and self._is_move(statement.value, batch):
            self.ctx.fix(original_node, "removed a per-batch move: the device loader moves batches")
            return cst.RemoveFromParent()
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1 or not _calls_a_move(statement.value):
            return updated_node
        strip = _StripMoves(self, batch)
        stripped = strip.stripped(statement.value)
        if stripped.deep_equals(statement.value):
            return updated_node
        kept = ", keeping its conversion" if strip.converts else ""
        self.ctx.fix(original_node, f"removed a per-batch move{kept}: the device loader moves batches")
        target = statement.targets[0].target
        if _rebinds_itself(target, stripped):
            return cst.RemoveFromParent()
        target, stripped = _without_self_assignments(target, stripped)
        assign = statement.with_changes(targets=[statement.targets[0].with_changes(target=target)], value=stripped)
        return updated_node.with_changes(body=[assign])

    def _is_move(self, node: cst.CSTNode, batch: set[str]) -> bool:
        """``x.to(device)``, ``x.cuda(...)``, ``x.to(device, non_blocking=True)`` of a batch."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return False
        if root(node.func.value) not in batch:
            return False
        method = node.func.attr.value
        if method not in _MOVES:
            return False
        if method == "cuda":
            return True
        where = call_arg(node, 0, "device")
        if where is None:
            return False
        facts = self.ctx.facts
        name = dotted(where.value) or ""
        if (facts.file.qualname(where.value) or "").startswith(_DTYPE_PREFIX):
            return False
        devices = {device.name for device in facts.devices}
        return (
            name in devices
            or name.split(".")[-1] in ("device", "gpu", "local_rank", "rank")
            or facts.is_cuda_device(where.value)
            # ACC002 has already turned ``.to(gpu_id)`` into the target's device
            or self.ctx.code(where.value) == self.ctx.concept("device").render_expr()
        )


_MOVES = frozenset({"to", "cuda"})
# The parameters of Tensor.to and Tensor.cuda that positional arguments fill, in order
# (``to(device, dtype, non_blocking, copy, *, memory_format)``); ``memory_format`` is keyword-only.
_POSITIONS = {"to": ("device", "dtype", "non_blocking", "copy"), "cuda": ("device", "non_blocking")}
_KEYWORD_ONLY = "memory_format"
_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _calls_a_move(value: cst.BaseExpression) -> bool:
    """Whether ``value`` calls a ``.to()`` or ``.cuda()`` method, which a move is (``_is_move``)."""
    return any(
        type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in _MOVES
        for node in (value, *descendants(value))
    )


def _without_move(call: cst.Call) -> cst.BaseExpression | None:
    """What a batch move does besides moving, the device loader's part: nothing (``x.to(device,
    non_blocking=True)`` -> ``x``), or its conversion (``x.to(device, torch.float16)`` ->
    ``x.to(torch.float16)``, ``x.cuda(memory_format=torch.channels_last)`` ->
    ``x.to(memory_format=torch.channels_last)``). None where an argument cannot be told
    (``**options``): the move stays, as moving a batch already on the device costs nothing."""
    positions = _POSITIONS[call.func.attr.value]
    kept = []
    for index, arg in enumerate(call.args):
        name = _parameter(arg, index, positions)
        if name is None:
            return None
        # Where the batch already is, non_blocking has nothing to overlap and copy=False nothing to skip.
        if name in ("device", "non_blocking") or name == "copy" and _is_false(arg.value):
            continue
        if arg.keyword is None and name != "dtype":  # dtype comes first once the device goes
            arg = arg.with_changes(keyword=cst.Name(name), equal=_EQUAL)
        kept.append(arg)
    if not kept:
        return call.func.value
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=with_commas(kept))


def _parameter(arg: cst.Arg, index: int, positions: tuple[str, ...]) -> str | None:
    """The parameter that the ``index``-th argument fills; None where that cannot be told
    (``*args``, ``**options``, an argument the method does not take)."""
    if arg.star:
        return None
    if arg.keyword is not None:
        return arg.keyword.value if arg.keyword.value in (*positions, _KEYWORD_ONLY) else None
    return positions[index] if index < len(positions) else None


def _is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


class _StripMoves:
    """Replaces each move of a batch value by what it does besides moving (``_without_move``):
    the value itself, or its conversion (in a comprehension over the batch, of its elements
    too). ``converts``: whether a conversion stays."""

    def __init__(self, rule: DeviceLoader, batch: set[str]):
        self.rule = rule
        self.batch = set(batch)
        self.converts = False

    def stripped(self, value: cst.BaseExpression) -> cst.BaseExpression:
        return rebuilt(value, self._leave, self._enter)

    def _enter(self, node):
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            bind_comprehension(self.batch, node)

    def _leave(self, original_node, updated_node):
        if type(original_node) is not cst.Call or not self.rule._is_move(original_node, self.batch):
            return updated_node
        remains = _without_move(updated_node)
        if remains is None:
            return updated_node
        self.converts = self.converts or remains is not updated_node.func.value
        return remains


def _replaced(value: cst.BaseExpression, name: str, replacement: cst.BaseExpression) -> cst.BaseExpression:
    """``value`` with each ``name`` (a name or a dotted one) in it replaced by ``replacement``."""

    def leave(original_node, updated_node):
        named = type(original_node) in (cst.Name, cst.Attribute) and dotted(original_node) == name
        return replacement if named else updated_node

    return rebuilt(value, leave)


def _rebinds_itself(target: cst.BaseExpression, value: cst.BaseExpression) -> bool:
    """``x = x``, ``x, y = x, y``, ``b = {k: v for k, v in b.items()}``, ``b = list(t for t in b)``
    (not ``tuple(t for t in b)``: a DataLoader's batch is a list, which the device loader keeps)."""
    if target.deep_equals(value):
        return True
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple):
        return len(target.elements) == len(value.elements) and all(
            t.value.deep_equals(v.value) for t, v in zip(target.elements, value.elements)
        )
    name = dotted(target)
    if isinstance(value, cst.Call) and dotted(value.func) == "list" and len(value.args) == 1:
        value = value.args[0].value
    if isinstance(value, (cst.GeneratorExp, cst.ListComp)):
        loop = value.for_in
        return dotted(loop.iter) == name and value.elt.deep_equals(loop.target) and not loop.ifs
    if isinstance(value, cst.DictComp):
        loop = value.for_in
        items = loop.iter
        return (
            isinstance(items, cst.Call)
            and isinstance(items.func, cst.Attribute)
            and items.func.attr.value == "items"
            and dotted(items.func.value) == name
            and isinstance(loop.target, cst.Tuple)
            and len(loop.target.elements) == 2
            and value.key.deep_equals(loop.target.elements[0].value)
            and value.value.deep_equals(loop.target.elements[1].value)
        )
    return False


def _without_self_assignments(target: cst.BaseExpression, value: cst.BaseExpression):
    """``x = x.to(torch.float16)`` for ``x, y = x.to(torch.float16), y``: the target and value
    without the elements that assign a name itself (a moved element the move has left)."""
    if not (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)):
        return target, value
    elements = (*target.elements, *value.elements)
    if len(target.elements) != len(value.elements) or any(isinstance(e, cst.StarredElement) for e in elements):
        return target, value
    pairs = [(t, v) for t, v in zip(target.elements, value.elements) if not t.value.deep_equals(v.value)]
    if len(pairs) == len(target.elements):
        return target, value
    if len(pairs) == 1:
        return pairs[0][0].value, pairs[0][1].value
    targets, values = [t for t, _ in pairs], [v for _, v in pairs]
    return target.with_changes(elements=with_commas(targets)), value.with_changes(elements=with_commas(values))


def _emptied(original: cst.BaseSuite, updated: cst.BaseSuite) -> bool:
    """Whether a block is left holding only the ``pass`` the walk puts in an emptied block."""
    return (
        isinstance(updated, cst.IndentedBlock) and len(updated.body) == 1
        and isinstance(updated.body[0], cst.SimpleStatementLine)
        and isinstance(updated.body[0].body[0], cst.Pass)
        and not _has_pass(original)
    )


def _has_pass(block: cst.BaseSuite) -> bool:
    return any(
        isinstance(line, cst.SimpleStatementLine) and any(isinstance(small, cst.Pass) for small in line.body)
        for line in getattr(block, "body", ())
    )
