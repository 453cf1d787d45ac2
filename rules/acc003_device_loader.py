import libcst as cst

from accrewrite.nodes import call_arg, dotted, names_in, walk
from accrewrite.rule import Example, Rule
from accrewrite.rules._generation import calls_a_model as _calls_a_model, grown_sequence
from accrewrite.targets import spelled_callees
from accrewrite.values import Kind

_DTYPE_PREFIX = "torch."  # .to(torch.float16) converts, it does not move


class DeviceLoader(Rule):
    """Feed training and evaluation loops from a device loader, and stop moving each batch.

    TorchAcc's migration guide, step 2: `loader = pl.MpDeviceLoader(loader, device)`. The device loader copies
    the next batches to the device in the background while the current step runs, so the
    per-batch `x = x.to(device)` / `.cuda()` in the loop is removed (as are dict and tuple
    forms such as `batch = {k: v.to(device) for k, v in batch.items()}`).

    Where the wrap goes: a `DataLoader` assigned in a function that can see the device is
    rebound right after both exist (after the device's statement when the device is chosen
    later, as in the guide's example). The target's device loader then answers `len()`,
    `.dataset` and `.sampler.set_epoch()` like the loader it wraps. Where the target's
    device loader does not stand in for the loader (torch_xla's has no `.dataset` or
    `.sampler`), or no device is visible where the loader is made, the loop's iterable is
    wrapped instead (`for x, y in pl.MpDeviceLoader(loader, device)`) and the loader keeps its
    name and attributes.

    A step loop that no device loader feeds (nanoGPT's `get_batch()` loop) ends each
    iteration with the target's `xm.mark_step()`: the device loader is what otherwise marks
    step boundaries, where step closures run and, on XLA, each step's graph is executed.
    """

    code = "ACC003"
    name = "device-loader"
    summary = "DataLoaders feeding loops -> the target's device loader; per-batch .to(device) removed; other step loops mark steps"
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
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        facts = ctx.facts
        rebind = ctx.target.has("device_loader") and ctx.concept("device_loader").rebind
        # Loaders rebound at their assignment: statement -> [(loader, device)] to add after it.
        self._wraps: dict[cst.CSTNode, list[tuple[str, str]]] = {}
        self._rebound: set[str] = set(facts.device_loaders)
        for loader in facts.loader_bindings:
            device = self._device_for(loader.scope)
            if loader.name in facts.device_loaders or not rebind or device is None:
                continue
            later = device.scope is loader.scope and device.order > loader.order
            anchor = device.statement if later else loader.statement
            self._wraps.setdefault(anchor, []).append((loader.name, device.name))
            self._rebound.add(loader.name)
        self._device_loaders = spelled_callees("device_loader")
        # Loops fed by a device loader, innermost last: (loop, names its batches bind, the
        # loader to wrap at the loop or None).
        self._fed: list[tuple[cst.CSTNode, set[str], str | None]] = []

    def applies(self) -> bool:
        return bool(self.ctx.facts.loaders or self.ctx.facts.loops or self.ctx.target.has("lazy_execution"))

    def _device_for(self, scope):
        """The CUDA device binding visible in ``scope``: the function's own, else the module's."""
        devices = self.ctx.facts.devices
        return next((d for d in devices if d.scope is scope), None) or next((d for d in devices if d.scope is None), None)

    # Rebinding at the assignment ------------------------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # On the way down: another rule may replace this statement on the way up.
        for loader, device in self._wraps.get(node, ()):
            wrapped = self.ctx.expr("device_loader", loader=loader, device=device)
            line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.parse_expression(loader))], wrapped)])
            self.ctx.insert_after(node, [line])
            self.ctx.fix(node, f"{loader} is wrapped in the target's device loader")

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self._fed and self._is_inside_fed_loop():
            return self._drop_batch_moves(original_node, updated_node)
        return updated_node

    # Loops ----------------------------------------------------------------------------------

    def visit_While(self, node: cst.While) -> None:
        self._mark_steps(node)

    def visit_For(self, node: cst.For) -> None:
        self._visit_for(node)
        if not self._fed or self._fed[-1][0] is not node:
            self._mark_steps(node)

    def _mark_steps(self, node) -> None:
        """A step loop that no device loader feeds ends each step itself: the device loader
        is what marks step boundaries (where step closures run and, on XLA, the step's graph
        is cut and executed), so without one the loop calls the target's mark_step. So does a
        generation loop on a lazy device (a model called on a sequence that grows each
        iteration, ``idx = torch.cat((idx, idx_next), dim=1)``), whose graph would otherwise
        grow with every token."""
        loop = next((loop for loop in self.ctx.facts.loops if loop.node is node), None)
        generates = loop is None and self.ctx.target.has("lazy_execution") and self._generates(node)
        if not generates and (loop is None or not loop.calls_step or loop.encloses_step_loop):
            return
        body = node.body.body
        marks = self.ctx.statements("mark_step")
        spelled = {self.ctx.code(mark).strip() for mark in marks}
        if not body or any(mark in self.ctx.code(statement) for statement in body for mark in spelled):
            return  # marked already (guarded or not)
        self.ctx.insert_after(body[-1], marks)
        if generates:
            self.ctx.fix(node, "each generated token ends the device's graph (it would grow with every token)")
        else:
            self.ctx.fix(node, "the step loop marks each step's end (no device loader does it)")

    def _generates(self, node) -> bool:
        return grown_sequence(self.ctx.facts, node, self.ctx.facts.values(self.ctx.scope)) is not None

    def _visit_for(self, node: cst.For) -> None:
        if self._device_loader_in(node.iter) or names_in(node.iter) & self._rebound or self._fed_through(node.iter):
            self._fed.append((node, names_in(node.target), None))
            return
        loader = self._loader_to_wrap(node)
        if loader is not None:
            self._fed.append((node, names_in(node.target), loader))

    def _fed_through(self, iterable: cst.BaseExpression) -> bool:
        """A loop over a name assigned a device loader or a wrapper of one (``pbar = tqdm(loader)``
        where ``loader`` is rebound)."""
        loader = _iterated(iterable)
        if loader is None:
            return False
        behind = _iterated(self.ctx.facts.values(self.ctx.scope).assigned_value(loader))
        return behind is not loader and (dotted(behind) in self._rebound or self._device_loader_in(behind))

    def _device_loader_in(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` builds a target's device loader already (a migrated file)."""
        return any(self.ctx.facts.qualname(call.func) in self._device_loaders for call in _calls(node))

    def _loader_to_wrap(self, node: cst.For) -> str | None:
        """The loader a loop iterates (itself, or through ``enumerate``, ``tqdm`` and the like)
        when it is to be wrapped at the loop: a loop that trains or calls a model, over a
        loader that is not rebound. Where loaders are rebound, a loop over a parameter gets a
        device loader from its caller."""
        facts = self.ctx.facts
        values = facts.values(self.ctx.scope)
        loader = _iterated(node.iter)
        if loader is None or values.kind(loader) is not Kind.LOADER:
            return None
        name = dotted(loader)
        if name is None or name in self._rebound:
            return None
        if self._rebound and isinstance(loader, cst.Name) and _is_parameter(self.ctx.scope, name):
            return None
        trains = any(loop.node is node for loop in facts.loops)
        if trains or name in facts.loaders or _calls_a_model(node.body, values):
            return name
        return None

    def leave_Call(self, original_node, updated_node):
        """``iter(loader)`` feeding a training loop's ``next()`` reads from the device loader
        where the loader is not rebound (``it = iter(loader)`` before ``while True: x =
        next(it)``); a one-off ``next(iter(loader))`` keeps reading the loader."""
        if dotted(original_node.func) != "iter" or len(original_node.args) != 1 or not self._feeds_a_step():
            return updated_node
        loader = original_node.args[0].value
        name = dotted(loader)
        values = self.ctx.facts.values(self.ctx.scope)
        if name is None or name in self._rebound or values.kind(loader) is not Kind.LOADER:
            return updated_node
        if self.ctx.statement is not None and self._peeks(original_node):
            return updated_node
        device = self.ctx.facts.device_in(self.ctx.scope) or self.ctx.code(self.ctx.expr("device"))
        wrapped = self.ctx.expr("device_loader", loader=name, device=device)
        self.ctx.fix(original_node, f"iter({name}) reads from the target's device loader")
        return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=wrapped)])

    def _feeds_a_step(self) -> bool:
        """Whether the function (or module) being walked trains: it holds a step loop."""
        return any(loop.scope is self.ctx.scope and loop.calls_step for loop in self.ctx.facts.loops)

    def _peeks(self, call: cst.Call) -> bool:
        """``next(iter(loader))``: one batch, for its shape."""
        return any(
            dotted(outer.func) == "next" and outer.args and outer.args[0].value is call
            for outer in _calls(self.ctx.statement)
        )

    def leave_For(self, original_node, updated_node):
        if not self._fed or self._fed[-1][0] is not original_node:
            return updated_node
        _, _, loader = self._fed.pop()
        if loader is None:
            return updated_node
        device = self.ctx.facts.device_in(self.ctx.scope) or self.ctx.code(self.ctx.expr("device"))
        wrapped = self.ctx.expr("device_loader", loader=loader, device=device)
        self.ctx.fix(original_node, f"the loop over {loader} reads from the target's device loader")
        return updated_node.with_changes(iter=_Replace(loader, wrapped).visit_expr(updated_node.iter))

    # Per-batch moves --------------------------------------------------------------------------

    def leave_If(self, original_node, updated_node):
        """``if torch.cuda.is_available(): images = images.cuda()`` whose moves are gone goes too."""
        body = updated_node.body
        if (
            self._fed and self._is_inside_fed_loop() and original_node.orelse is None
            and isinstance(body, cst.IndentedBlock) and len(body.body) == 1
            and isinstance(body.body[0], cst.SimpleStatementLine)
            and isinstance(body.body[0].body[0], cst.Pass)
            and not _has_pass(original_node.body)
        ):
            self.ctx.fix(original_node, "removed a branch that only moved the batch: the device loader moves batches")
            return cst.RemoveFromParent()
        return updated_node

    def _is_inside_fed_loop(self) -> bool:
        return any(loop in self.ctx.open_statements for loop, _, _ in self._fed)

    def _batch_names(self) -> set[str]:
        names: set[str] = set()
        for loop, bound, _ in self._fed:
            if loop in self.ctx.open_statements:
                names |= bound
        return names

    def _drop_batch_moves(self, original_node, updated_node):
        if len(updated_node.body) != 1:
            return updated_node
        statement = updated_node.body[0]
        batch = self._batch_names()
        if isinstance(statement, cst.Expr) and self._is_move(statement.value, batch):
            self.ctx.fix(original_node, "removed a per-batch move: the device loader moves batches")
            return cst.RemoveFromParent()
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
            return updated_node
        stripped = _StripMoves(self, batch | names_in(statement.value)).visit_expr(statement.value)
        if stripped.deep_equals(statement.value):
            return updated_node
        self.ctx.fix(original_node, "removed a per-batch move: the device loader moves batches")
        if _rebinds_itself(statement.targets[0].target, stripped):
            return cst.RemoveFromParent()
        return updated_node.with_changes(body=[statement.with_changes(value=stripped)])

    def _is_move(self, node: cst.CSTNode, batch: set[str]) -> bool:
        """``x.to(device)``, ``x.cuda(...)``, ``x.to(device, non_blocking=True)`` of a batch."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return False
        root = dotted(node.func.value) or ""
        if not (names_in(node.func.value) & batch) and root.split(".")[0] not in batch:
            return False
        method = node.func.attr.value
        if method == "cuda":
            return True
        if method != "to":
            return False
        where = call_arg(node, 0, "device")
        if where is None:
            return False
        facts = self.ctx.facts
        name = dotted(where.value) or ""
        if (facts.qualname(where.value) or "").startswith(_DTYPE_PREFIX):
            return False
        devices = {device.name for device in facts.devices}
        return (
            name in devices
            or name.split(".")[-1] in ("device", "gpu", "local_rank", "rank")
            or facts.is_cuda_device(where.value)
            # ACC002 has already turned ``.to(gpu_id)`` into the target's device
            or self.ctx.code(where.value) == self.ctx.concept("device").render_expr()
        )


class _StripMoves(cst.CSTTransformer):
    """Replaces each move of a batch value by the value itself."""

    def __init__(self, rule: DeviceLoader, batch: set[str]):
        super().__init__()
        self.rule = rule
        self.batch = batch

    def visit_expr(self, node):
        return node.visit(self)

    def leave_Call(self, original_node, updated_node):
        if self.rule._is_move(original_node, self.batch):
            return updated_node.func.value
        return updated_node


class _Replace(cst.CSTTransformer):
    def __init__(self, name: str, replacement: cst.BaseExpression):
        super().__init__()
        self.name = name
        self.replacement = replacement

    def visit_expr(self, node):
        return node.visit(self)

    def leave_Name(self, original_node, updated_node):
        return self.replacement if original_node.value == self.name else updated_node

    def leave_Attribute(self, original_node, updated_node):
        return self.replacement if dotted(original_node) == self.name else updated_node


def _rebinds_itself(target: cst.BaseExpression, value: cst.BaseExpression) -> bool:
    """``x = x``, ``x, y = x, y``, ``b = {k: v for k, v in b.items()}``, ``b = tuple(t for t in b)``."""
    if target.deep_equals(value):
        return True
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple):
        return len(target.elements) == len(value.elements) and all(
            t.value.deep_equals(v.value) for t, v in zip(target.elements, value.elements)
        )
    name = dotted(target)
    if isinstance(value, cst.Call) and dotted(value.func) in ("tuple", "list") and len(value.args) == 1:
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


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    """Every call in ``node``'s subtree."""
    found = []
    walk(node, lambda child: found.append(child) if isinstance(child, cst.Call) else None)
    return found


# Calls whose iteration is their first argument's: the loader behind ``enumerate(loader)``.
_PASSING = frozenset({"enumerate", "iter", "tqdm", "trange", "islice", "zip", "log_every"})


def _iterated(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a for loop's iterable iterates: itself, or the loader that ``enumerate(...)``,
    ``tqdm(...)`` or ``metric_logger.log_every(...)`` pass through."""
    while isinstance(node, cst.Call):
        name = (dotted(node.func) or "").split(".")[-1]
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        if name.lower() not in _PASSING or not positional:
            return node
        node = positional[0]
    return node


def _is_parameter(scope: cst.FunctionDef | None, name: str) -> bool:
    if scope is None:
        return False
    params = scope.params
    return any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params))


def _has_pass(block: cst.BaseSuite) -> bool:
    return any(
        isinstance(line, cst.SimpleStatementLine) and any(isinstance(small, cst.Pass) for small in line.body)
        for line in getattr(block, "body", ())
    )
