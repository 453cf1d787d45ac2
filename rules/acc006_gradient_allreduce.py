import libcst as cst

from accrewrite.rule import Example, Rule, RuleContext
from accrewrite.toolbox import (
    GRADIENT_READERS, SHARDING, block_reduction, ddp_kept, stepped_optimizer, steps_through_target,
)


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

    The optimizer is one the file builds (from torch.optim, or from an optimizer class of its
    own, such as VICReg's `LARS`), or in training code one named `optimizer`, `optim` or `opt`
    (built by a factory or in another module). Scheduler steps, `zero_grad` and EMA updates keep
    their places. A file that shards its model (FSDP, `fully_shard`, DTensor's
    `parallelize_module`) or all-reduces its parameters' gradients itself is left as it is: its
    gradients are reduced already, or are shards. So is one where DistributedDataParallel stays
    (ACC005 keeps it where this rule cannot reach every step, and says why): DDP reduces.
    """

    code = "ACC006"
    name = "gradient-allreduce"
    summary = "gradient all-reduce before the AMP step; optimizer.step() -> xm.optimizer_step()"
    concepts = ("gradient_allreduce", "optimizer_step")
    triggers = frozenset({"step", *GRADIENT_READERS})
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

    def __init__(self, ctx: RuleContext):
        super().__init__(ctx)
        self._reduced_steps: set[cst.CSTNode] = set()

    def applies(self) -> bool:
        facts = self.ctx.facts
        if any(callee.startswith(SHARDING) for callee in facts.file.called):
            return False
        # Where DistributedDataParallel stays (ACC005 says why), it reduces: nothing else may.
        return bool(facts.loops or facts.step_functions) and not facts.reduces_gradients and ddp_kept(self.ctx) is None

    # With a GradScaler: reduce before the gradients are read ----------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        self._reduce_in(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._reduce_in(node.body)

    def _reduce_in(self, body) -> None:
        planned = block_reduction(self.ctx.facts, body, self.ctx.in_training)
        if planned is None:
            return
        if not planned.scaled:
            self._reduced_steps.add(planned.step)
        if planned.done:
            return  # migrated already
        optimizer = self.ctx.code(planned.optimizer)
        what = "the scaler reads them" if planned.scaled else "they are read (clipped, checked)"
        self.ctx.insert_before(planned.anchor, self.ctx.statements("gradient_allreduce", optimizer=optimizer))
        self.ctx.fix(planned.step, f"gradients of {optimizer} are all-reduced before {what}")

    # Without one: the target's optimizer step ----------------------------------------------

    def leave_SimpleStatementLine(self, original_node, updated_node):
        """Each ``optimizer.step()`` of the line (``loss.backward(); opt.step()`` too), and
        LBFGS's ``optimizer.step(closure)``, becomes the target's optimizer step."""
        if original_node in self._reduced_steps:
            return updated_node
        body = list(updated_node.body)
        for index, small in enumerate(original_node.body):
            call = small.value if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) else None
            if call is None or not isinstance(call.func, cst.Attribute) or not steps_through_target(call):
                continue
            owner = stepped_optimizer(self.ctx.facts, call, self.ctx.in_training)
            if owner is None:
                continue
            if call.args:
                closure = self.ctx.code(call.args[0].value)
                step = self.ctx.expr("optimizer_step_closure", optimizer=owner, closure=closure)
            else:
                step = self.ctx.expr("optimizer_step", optimizer=owner)
            self.ctx.fix(original_node, f"{owner}.step() -> the target's optimizer step, which reduces gradients first")
            body[index] = body[index].with_changes(value=step)
        return updated_node.with_changes(body=body) if self.ctx.pending else updated_node
