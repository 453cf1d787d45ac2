import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES
from accrewrite.nodes import dotted, walk
from accrewrite.rule import Example, Rule
from accrewrite.targets import called_names, spelled_callees

# Calls that read gradients after the backward passes of a step: the reduction goes before the
# first of them (overflow detection and clipping must see reduced gradients).
_GRADIENT_READERS = ("unscale_", "clip_grad_norm_", "clip_grad_value_")
# What reads gradients before a plain optimizer step: clipping (also a script's own
# ``clip_gradients`` helper) and ``p.grad`` itself (a finite check, a gradient-norm log).
_PLAIN_READERS = ("clip_grad_norm_", "clip_grad_value_", "clip_gradients", "clip_grad", "grad")
# Libraries' loss scalers that call backward and step the optimizer themselves.
_OPAQUE_STEPPERS = frozenset({"timm.utils.NativeScaler", "timm.utils.cuda.NativeScaler", "timm.utils.ApexScaler"})
# Sharding that reduces (reduce-scatters) gradients itself: FSDP, FSDP2, DTensor parallelism.
_SHARDING = ("torch.distributed.fsdp.", "torch.distributed._composable.fsdp.", "torch.distributed.tensor.",
             "torch.distributed._tensor.")


class GradientAllReduce(Rule):
    """All-reduce gradients across workers where the optimizer step happens.

    TorchAcc's migration guide, step 4. DistributedDataParallel is removed (ACC005), so the gradients are reduced
    explicitly:

    - with a GradScaler, the target's gradient reduction is inserted before the first statement
      of the step's block that reads gradients: `scaler.unscale_`, `clip_grad_norm_` or
      `scaler.step` itself. Overflow detection then sees reduced gradients, and with gradient
      accumulation (`for micro_step in ...: scaler.scale(loss).backward()`, or `if (i + 1) %
      accum == 0:`) the reduction happens once per step, not per micro-batch;
    - without one, `optimizer.step()` becomes `xm.optimizer_step(optimizer)`, which reduces
      and steps, unless the step's block reads the gradients first (`clip_grad_norm_`, a
      finite check of `p.grad`): then the reduction goes before the first read, as with a
      GradScaler, and the step stays. Under DDP every read saw averaged gradients; reading
      them before the reduction would clip (or skip) on one rank's own.

    Scheduler steps, `zero_grad` and EMA updates keep their places. A file that shards its
    model (FSDP, `fully_shard`, DTensor's `parallelize_module`) or all-reduces the gradients
    itself is left as it is: its gradients are reduced already, or are shards.

    Reported (ACC006): a library's loss scaler that runs backward and the step inside (timm's
    `NativeScaler`), where no reduction can go.
    """

    code = "ACC006"
    name = "gradient-allreduce"
    summary = "gradient all-reduce before the AMP step; optimizer.step() -> xm.optimizer_step()"
    concepts = ("gradient_allreduce", "optimizer_step")
    triggers = frozenset({"step", "NativeScaler", "ApexScaler", *_GRADIENT_READERS})
    examples = (
        Example(
            target="torchacc",
            before="""
            import torch

            for micro_step in range(accumulation):
                with ctx:
                    loss = model(X, Y) / accumulation
                scaler.scale(loss).backward()
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            """,
            after="""
            import torch
            import torchacc.torch_xla.core.xla_model as xm

            for micro_step in range(accumulation):
                with ctx:
                    loss = model(X, Y) / accumulation
                scaler.scale(loss).backward()
            gradients = xm._fetch_gradients(optimizer)
            xm.all_reduce('sum', gradients, scale=1.0 / xm.xrt_world_size())
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            """,
        ),
        Example(
            before="""
            import torch

            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    xm.optimizer_step(optimizer)
                    scheduler.step()
                    optimizer.zero_grad()
            """,
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self._reduced_steps: set[cst.CSTNode] = set()

    def applies(self) -> bool:
        facts = self.ctx.facts
        if any(callee.startswith(_SHARDING) for callee in facts.called):
            return False
        return bool(facts.loops or facts.step_functions) and not facts.reduces_gradients

    # With a GradScaler: reduce before the gradients are read ----------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        self._reduce_in(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._reduce_in(node.body)

    def _reduce_in(self, body) -> None:
        gradient_readers, plain_readers = _FirstMention(body, _GRADIENT_READERS), _FirstMention(body, _PLAIN_READERS)
        for index, statement in enumerate(body):
            optimizer = self._scaler_step(statement)
            if optimizer is not None:
                anchor = gradient_readers.before(index)
                if anchor is None:
                    anchor = statement
                what = "the scaler reads them"
            else:
                optimizer = self._plain_step(statement)
                if optimizer is None:
                    continue
                anchor = plain_readers.before(index)
                if anchor is None:
                    continue
                self._reduced_steps.add(statement)
                what = "they are read (clipped, checked)"
            if any(self._reduces(s) for s in body[:index]):
                return  # migrated already
            self.ctx.insert_before(anchor, self.ctx.statements("gradient_allreduce", optimizer=optimizer))
            self.ctx.fix(statement, f"gradients of {optimizer} are all-reduced before {what}")
            return

    def _scaler_step(self, statement) -> str | None:
        """The optimizer's code when ``statement`` is ``<scaler>.step(<optimizer>)``."""
        call = _call_statement(statement)
        if call is None or call.func.attr.value != "step" or not call.args:
            return None
        owner = dotted(call.func.value) or ""
        # A scaler passed in as a parameter (TorchAcc's migration guide's loop_with_amp) is known by its name.
        if owner not in self.ctx.facts.scalers and "scaler" not in owner.split(".")[-1].lower():
            return None
        return self.ctx.code(call.args[0].value)

    def _reduces(self, statement) -> bool:
        """A statement that already reduces gradients the way a target does (a migrated file,
        guarded or not); the script's own ``dist.all_reduce(loss)`` is not that."""
        facts = self.ctx.facts
        reductions = spelled_callees("gradient_allreduce")
        names = called_names("gradient_allreduce")
        found = False

        def enter(node):
            nonlocal found
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in names:
                qualified = facts.qualname(node.func)
                found = found or qualified is None or qualified in reductions  # an alias added by this run
            return not found

        walk(statement, enter)
        return found

    # Without one: the target's optimizer step ----------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        """A library's loss scaler that runs backward and the step inside (timm's NativeScaler)
        cannot be given the reduction; with DistributedDataParallel gone, nothing reduces."""
        callee = self.ctx.facts.qualname(node.func)
        if callee in _OPAQUE_STEPPERS and self.ctx.facts.called & WRAPPER_NAMES:
            self.ctx.diagnose(
                node,
                f"{callee} steps the optimizer where no gradient all-reduce can go",
                "It runs backward and the optimizer step inside; with DistributedDataParallel removed "
                "(ACC005) the ranks' gradients are not reduced. Step with a GradScaler in this script "
                "instead (then ACC006 reduces before it).",
            )

    def _plain_step(self, statement) -> str | None:
        """The optimizer's name when ``statement`` is a line that is ``<optimizer>.step()``."""
        call = _call_statement(statement)
        return self._optimizer_of(call) if call is not None and not call.args else None

    def _optimizer_of(self, call: cst.Call) -> str | None:
        """The optimizer's name when ``call`` is ``<optimizer>.step(...)``."""
        if call.func.attr.value != "step":
            return None
        owner = dotted(call.func.value)
        facts = self.ctx.facts
        if owner is None or owner in facts.scalers or "scaler" in owner.split(".")[-1].lower():
            return None
        if owner not in facts.optimizers and not (self.ctx.in_training and owner.split(".")[-1] in ("optimizer", "optim", "opt")):
            return None
        return owner

    def leave_SimpleStatementLine(self, original_node, updated_node):
        """Each ``optimizer.step()`` of the line (``loss.backward(); opt.step()`` too), and
        LBFGS's ``optimizer.step(closure)``, becomes the target's optimizer step."""
        if original_node in self._reduced_steps:
            return updated_node
        body = list(updated_node.body)
        for index, small in enumerate(original_node.body):
            call = small.value if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) else None
            if call is None or not isinstance(call.func, cst.Attribute):
                continue
            owner = self._optimizer_of(call)
            if owner is None or len(call.args) > 1 or any(arg.keyword is not None and arg.keyword.value != "closure"
                                                            for arg in call.args):
                continue
            if call.args:
                closure = self.ctx.code(call.args[0].value)
                step = self.ctx.expr("optimizer_step_closure", optimizer=owner, closure=closure)
            else:
                step = self.ctx.expr("optimizer_step", optimizer=owner)
            self.ctx.fix(original_node, f"{owner}.step() -> the target's optimizer step, which reduces gradients first")
            body[index] = body[index].with_changes(value=step)
        return updated_node.with_changes(body=body) if self.ctx.pending else updated_node


def _call_statement(statement) -> cst.Call | None:
    """The call when ``statement`` is a lone ``x.method(...)`` expression statement."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return None
    expression = statement.body[0]
    if type(expression) is not cst.Expr or type(expression.value) is not cst.Call:
        return None
    call = expression.value
    return call if type(call.func) is cst.Attribute else None


def _mentions(statement, methods) -> bool:
    found = False

    def enter(node: cst.CSTNode) -> bool:
        nonlocal found
        found = found or (isinstance(node, cst.Attribute) and node.attr.value in methods)
        return not found

    walk(statement, enter)
    return found


class _FirstMention:
    """The first statement of a block that mentions one of ``methods``, the block read once and
    only as far as asked (each step statement asks about the statements before it)."""

    def __init__(self, body, methods: tuple[str, ...]):
        self.body = body
        self.methods = methods
        self.read = 0
        self.found = None

    def before(self, index: int):
        """The first such statement before ``body[index]``, or None."""
        while self.found is None and self.read < index:
            statement = self.body[self.read]
            self.read += 1
            if _mentions(statement, self.methods):
                self.found = statement
        return self.found
