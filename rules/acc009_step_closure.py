from functools import cached_property

import libcst as cst

from accrewrite.nodes import dotted, origins, rebuilt, walk
from accrewrite.rule import Example, Rule
from accrewrite.rules._running_sums import running_sums
from accrewrite.rules._training_code import (
    BUILTIN_NAMES,
    LoopDiagnostic,
    contains,
    LOGGING_WORDS,
    is_logging_call,
    is_step_closure_call,
    loop_helpers,
    ends_the_run,
    host_read,
    records_only,
    root_name,
)
from accrewrite.values import bound_names, read_names



class StepClosure(LoopDiagnostic, Rule):
    """Log tensor values in a step closure instead of waiting for the device in the loop.

    From the BERT example of TorchAcc's migration guide: logging a step's loss reads the loss
    tensor on the host, which waits for the device and (with XLA) cuts the lazy graph every step.
    The migrated script hands the logging to `xm.add_step_closure(fn, args=(...), ...)`: it
    runs at the step's end, after the step's graph has executed.

    A logging call in a training loop (or a step function) moves when it reads a tensor's value:
    `print`, `logging.*`/`logger.*`, `writer.add_scalar` and the other SummaryWriter
    methods, `wandb.log`, tqdm's `set_postfix`, and the script's own helpers such as
    `log_metrics`/`print_rank_0`, given `.item()`/`.tolist()`/`float(t)` of a tensor or
    a tensor itself (printed or formatted). Logging that reads only Python values stays.

    The values the call reads are evaluated where the call was, as before, and passed to the
    closure as arguments: a step closure runs later, when loop variables such as `step` have
    moved on. Only what reads a tensor's value (`.item()`, formatting) happens inside the
    closure. A call whose arguments are all plain values is passed as is
    (`xm.add_step_closure(log_metrics, args=(epoch, step, loss), ...)`); otherwise the closure
    is a lambda taking the values, and a tensor it reads only through methods (`loss.item()`)
    is passed detached, so that its autograd graph is not kept alive until the step ends.

    The output stays as the original prints it, line for line and in order:

    - a line that a later line of the same step would print before (a plain `print` after
      it in the loop's body) stays where it is, and so does one right before `sys.exit()` or
      `raise`; ACC101 reports its host sync;
    - a closure that prints runs on the calling thread at the step boundary
      (`run_async=False`), since two threads' lines interleave; recording (TensorBoard,
      wandb, a progress bar) runs on the worker thread (`run_async=True`), off the loop;
    - a loop that queued closures ends with the target's step boundary (`xm.mark_step()`),
      also when it is left by `break`, and runs them before a `return` leaves it; where the
      target does not run pending closures at interpreter exit (torch_xla), the step boundary
      is registered to run then (`atexit.register(torch_xla.sync)`), for a loop left by an
      exception.

    A name the loop assigns a host read of a tensor (`D_x = output.mean().item()`,
    `float(t)`, `t.tolist()`) only to log it, as pytorch/examples' dcgan does, stays a tensor
    (`D_x = output.mean().detach()`) and the closure reads it where the call did
    (`D_x.item()`), so the step neither waits for the device there nor cuts its graph, and the
    line is printed as before. Only where every read of the name that the assignment reaches
    is in logging that moves into a step closure: one appended to a list, compared, computed
    with, returned, read after the loop or by a function keeps its number, as does one that a
    path may reach from another assignment. A read of a tensor that may change in place before
    the closure runs (`loss.item()`) is copied (`loss.detach().clone()`); a new one
    (`output.mean()`, `a - b`) is not.

    Objects are passed by reference, as Python passes them: a tensor or a meter (imagenet's
    `AverageMeter`) that the loop updates in place after the call is read when the closure
    runs. Pass a copy (`running.clone()`) where the exact value at that line matters.

    A helper of the same file that the loop calls with tensors (`log_metrics(..., loss, ...)`)
    is followed one level: its parameters that receive tensors are tensors, and its own logging
    call moves into the step closure inside it, as in the guide's example; the call in the loop
    then stays as it is.
    """

    code = "ACC009"
    name = "step-closure"
    summary = "logging that reads tensor values in the loop -> xm.add_step_closure(fn, args=(...)), output order kept"
    concepts = ("step_closure",)
    triggers = LOGGING_WORDS | {"item", "tolist", "float"}  # and the host reads it keeps on the device
    examples = (
        Example(
            before="""
            import torch

            for epoch in range(epochs):
                for step, (x, y) in enumerate(train_loader):
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    if step % 10 == 0:
                        # progress
                        print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
                        writer.add_scalar("train/loss", loss.item(), global_step)
                print(f"epoch {epoch} done")
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            for epoch in range(epochs):
                for step, (x, y) in enumerate(train_loader):
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    if step % 10 == 0:
                        # progress
                        xm.add_step_closure(
                            lambda epoch, step, loss: print(f"epoch {epoch} step {step} loss {loss.item():.4f}"),
                            args=(epoch, step, loss.detach()),
                            run_async=False)
                        xm.add_step_closure(
                            lambda loss, global_step: writer.add_scalar("train/loss", loss.item(), global_step),
                            args=(loss.detach(), global_step),
                            run_async=True)
                xm.mark_step()
                print(f"epoch {epoch} done")
            """,
        ),
        Example(
            before="""
            import torch

            netD = Discriminator().to(device)
            for epoch in range(epochs):
                for i, (x, y) in enumerate(loader):
                    output = netD(x)
                    errD = criterion(output, y)
                    errD.backward()
                    optimizerD.step()
                    D_x = output.mean().item()
                    accuracy = float((output > 0.5).float().mean())
                    score = output.max().item()
                    scores.append(score)
                    best = min(best, errD.item())
                    print(f"[{i}] Loss_D: {errD.item():.4f} D(x): {D_x:.4f} acc {accuracy:.1%} best {best:.4f}")
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            netD = Discriminator().to(device)
            for epoch in range(epochs):
                for i, (x, y) in enumerate(loader):
                    output = netD(x)
                    errD = criterion(output, y)
                    errD.backward()
                    optimizerD.step()
                    D_x = output.mean().detach()
                    accuracy = (output > 0.5).float().mean().detach()
                    score = output.max().item()
                    scores.append(score)
                    best = min(best, errD.item())
                    xm.add_step_closure(
                        lambda i, errD, D_x, accuracy, best: print(f"[{i}] Loss_D: {errD.item():.4f} D(x): {D_x.item():.4f} acc {float(accuracy):.1%} best {best:.4f}"),
                        args=(i, errD.detach(), D_x, accuracy, best),
                        run_async=False)
                xm.mark_step()
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import logging
            import torch

            logger = logging.getLogger(__name__)

            def full_train_epoch(epoch, model, loader, optimizer):
                for step, inputs in enumerate(loader):
                    outputs = model(**inputs)
                    loss = outputs["loss"]
                    loss.backward()
                    optimizer.step()
                    log_metrics(epoch, step, loss, time_elapsed)
                    logger.info("step %d lr %.2e loss %s", step, scheduler.get_last_lr()[0], loss)
            """,
            after="""
            import logging
            import torch
            import torchacc.torch_xla.core.xla_model as xm
            import atexit

            logger = logging.getLogger(__name__)

            atexit.register(xm.mark_step)

            def full_train_epoch(epoch, model, loader, optimizer):
                for step, inputs in enumerate(loader):
                    outputs = model(**inputs)
                    loss = outputs["loss"]
                    loss.backward()
                    optimizer.step()
                    xm.add_step_closure(log_metrics, args=(epoch, step, loss, time_elapsed), run_async=False)
                    xm.add_step_closure(logger.info, args=("step %d lr %.2e loss %s", step, scheduler.get_last_lr()[0], loss), run_async=False)
                xm.mark_step()
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch

            def log_metrics(epoch, step, batch_size, loss, batch_time, samples_per_step, peak_mem):
                batch_time = f"{batch_time:.3f}"
                print_test_update(epoch, step, batch_size, loss, batch_time, samples_per_step, peak_mem)

            def full_train_epoch(epoch, model, train_device_loader, optimizer):
                for step, inputs in enumerate(train_device_loader):
                    loss = model(**inputs)["loss"]
                    loss.backward()
                    optimizer.step()
                    if step % args.log_interval == 0:
                        log_metrics(epoch, step, args.batch_size, loss, time_elapsed, samples_per_step, peak_mem)
            """,
            after="""
            import torch
            import torchacc.torch_xla.core.xla_model as xm

            def log_metrics(epoch, step, batch_size, loss, batch_time, samples_per_step, peak_mem):
                batch_time = f"{batch_time:.3f}"
                xm.add_step_closure(print_test_update, args=(epoch, step, batch_size, loss, batch_time, samples_per_step, peak_mem), run_async=False)

            def full_train_epoch(epoch, model, train_device_loader, optimizer):
                for step, inputs in enumerate(train_device_loader):
                    loss = model(**inputs)["loss"]
                    loss.backward()
                    optimizer.step()
                    if step % args.log_interval == 0:
                        log_metrics(epoch, step, args.batch_size, loss, time_elapsed, samples_per_step, peak_mem)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            import wandb

            def train(model, loader, optimizer):
                for batch in loader:
                    loss = model(**batch).loss
                    loss.backward()
                    optimizer.step()
                    wandb.log({"loss": loss.item(), "lr": optimizer.param_groups[0]["lr"]})
            """,
            after="""
            import torch
            import wandb
            import torch_xla.core.xla_model as xm
            import atexit
            import torch_xla

            atexit.register(torch_xla.sync)

            def train(model, loader, optimizer):
                for batch in loader:
                    loss = model(**batch).loss
                    loss.backward()
                    optimizer.step()
                    xm.add_step_closure(
                        lambda loss, lr: wandb.log({"loss": loss.item(), "lr": lr}),
                        args=(loss.detach(), optimizer.param_groups[0]["lr"]),
                        run_async=True)
                torch_xla.sync()
            """,
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        # Per loop (or helper function): the order numbers of its logging statements that read
        # no tensor, and the names each reads (one that reads a name kept on the device moves).
        self._plain: dict[cst.CSTNode, list[tuple[int, set[str]]]] = {}
        # Loops in which a logging call moved into a step closure: they flush at their exit.
        self._flushed: set[cst.CSTNode] = set()
        self._exit_flush = False
        # Per training loop: the names assigned a host read (``D_x = output.mean().item()``) that
        # only the loop's moved logging reads -> how they were read (``item``, ``tolist``, ``float``).
        self._on_device: dict[cst.CSTNode, dict[str, str]] = {}
        self._kept_lines: set[cst.CSTNode] = set()  # their assignments (the original lines)

    @cached_property
    def _loop_helpers(self) -> dict[cst.FunctionDef, frozenset[str]]:
        return loop_helpers(self.ctx)  # asked at every logging line: found once per file

    def leave_SimpleStatementLine(self, original_node, updated_node):
        self._flush_before_return(original_node)
        kept = self._kept_on_device(original_node, updated_node)
        if kept is not None:
            return kept
        call = self._logging_call(original_node)
        if call is None:
            return updated_node
        # The call as the other rules left it (``.cuda()`` migrated, ``model.module`` unwrapped):
        # the closure is made of it, while the analysis, which knows the original nodes, decides.
        updated = updated_node.body[0].value if len(updated_node.body) == 1 else None
        if not isinstance(updated, cst.Call):
            return updated_node
        if self.in_loop:
            if self._helper_logs_inside(call):
                return updated_node  # the helper's own logging call moves, as in TorchAcc's migration guide
        elif self.in_closure or self.ctx.scope not in self._loop_helpers:
            return updated_node
        tensors = self.tensors()
        region = self.ctx.loop.node if self.ctx.loop is not None else self.ctx.scope
        on_device = self._on_device_in(region) if self.ctx.loop is not None and self.in_loop else {}
        if not self._moves(original_node, call, tensors, region, on_device):
            return updated_node
        prints = not records_only(self.ctx.facts, call)
        closure, values = self._closure(call, updated, tensors, on_device)
        args = ", ".join(self.ctx.code(value) for value in values) + ("," if len(values) == 1 else "")
        # A closure that prints runs on the calling thread: the order of lines printed by two
        # threads is not kept. Recording has no order to keep.
        run_async = not prints
        replacement = self.ctx.expr("step_closure", closure=closure, args=args, run_async=str(run_async))
        if self.ctx.loop is not None:
            self._flushed.add(self.ctx.loop.node)
            self._flush_at_exit()
        if closure.startswith("lambda") and len(self.ctx.code(replacement)) > _WRAP_AT:
            replacement = _one_argument_a_line(replacement)
        self.ctx.fix(
            original_node,
            f"{self.ctx.code(call.func)}(...) reads tensor values: moved into a step closure, "
            f"so the loop does not wait for the device",
        )
        return updated_node.with_changes(body=[updated_node.body[0].with_changes(value=replacement)])

    def _moves(self, line, call: cst.Call, tensors, region, on_device: dict[str, str]) -> bool:
        """Whether the logging ``call`` (the whole of ``line``) moves into a step closure: it reads
        tensor values (or names kept on the device), and no later line of the step prints at once."""
        if not self._reads_tensors(call, tensors) and not read_names(call) & on_device.keys():
            return False
        if records_only(self.ctx.facts, call):
            return True
        here = self.ctx.facts.order.get(line, 0)
        later = any(order > here for order in self._plain_logging(region, on_device))
        return not later and not ends_the_run(self.ctx, self.ctx.facts.next_statement.get(line))

    # Host reads made only for logging ------------------------------------------------------------

    def _kept_on_device(self, line, updated_line):
        """``D_x = output.mean().item()`` -> ``D_x = output.mean().detach()`` where every read of
        ``D_x`` is in logging that moves into the step closure, which reads its value there."""
        read = self._host_read_assignment(line)
        if read is None or self.ctx.loop is None or not self.in_loop:
            return None
        name, form, receiver = read
        self._device_reads(self.ctx.loop.node)
        if line not in self._kept_lines:
            return None
        assign = updated_line.body[0] if len(updated_line.body) == 1 else None
        updated = host_read(assign.value) if isinstance(assign, cst.Assign) else None
        if updated is None or updated[0] != form:
            return None
        kept = _detached(updated[1])
        if not _fresh(receiver):  # it may share its storage with a tensor changed in place before the closure runs
            kept = cst.Call(func=cst.Attribute(value=kept, attr=cst.Name("clone")))
        self.ctx.fix(line, f"`{name}` is read only by logging in a step closure: it stays a tensor, read there")
        return updated_line.with_changes(body=[assign.with_changes(value=kept)])

    def _host_read_assignment(self, line) -> tuple[str, str, cst.BaseExpression] | None:
        """(name, how it is read, the tensor read) for a line ``name = x.item()``, ``name = x.tolist()`` or
        ``name = float(x)`` where ``x`` is known to be a tensor."""
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        assign = line.body[0]
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            return None
        read = host_read(assign.value)
        if read is None or read[0] == "float" and "float" in self.ctx.facts.file.imports:
            return None
        form, receiver = read
        if not self.tensors().is_tensor(receiver):
            return None
        return assign.targets[0].target.value, form, receiver

    def _on_device_in(self, loop: cst.CSTNode) -> dict[str, str]:
        """The names of ``loop`` that hold a tensor where the original held a number: its host
        reads kept for logging, and the running sums ACC033 keeps (read as they are)."""
        sums = running_sums(self.ctx).names.get(loop, ())
        return {**self._device_reads(loop), **dict.fromkeys(sums, "value")}

    def _device_reads(self, loop: cst.CSTNode) -> dict[str, str]:
        """The names ``loop`` assigns a host read whose every read is in logging that moves into
        the step closure: the loop's own lines, not a nested loop's, function's or class's. A
        name kept on the device makes the logging that reads it move, so the names are narrowed
        until each one's logging moves."""
        found = self._on_device.get(loop)
        if found is not None:
            return found
        tensors = self.tensors()
        lines = _own_lines(loop)
        assigned: dict[str, dict[cst.CSTNode, str]] = {}
        for line in lines:
            read = self._host_read_assignment(line)
            if read is not None:
                assigned.setdefault(read[0], {})[line] = read[1]
        names = {name: next(iter(forms.values())) for name, forms in assigned.items() if len(set(forms.values())) == 1}
        logging = {}
        if names:
            for line in lines:
                call = self._logging_call(line)
                if call is not None and not self._helper_logs_inside(call):
                    logging[line] = call
        while names:
            moving = {line.body[0] for line, call in logging.items() if self._moves(line, call, tensors, loop, names)}
            kept = {name: form for name, form in names.items() if _only_read_in(tensors, name, assigned[name], moving)}
            if kept == names:
                break
            names = kept
        self._on_device[loop] = names
        self._kept_lines.update(line for name in names for line in assigned[name])
        return names

    # Keeping the output's order -----------------------------------------------------------------

    def _plain_logging(self, region: cst.CSTNode | None, on_device: dict[str, str]) -> list[int]:
        """Where ``region`` (a loop, or a helper function) logs Python values only, with the
        names ``on_device`` kept there (so read in a step closure)."""
        if region is None:
            return []
        found = self._plain.get(region)
        if found is None:
            found = self._plain[region] = []
            tensors = self.tensors()

            def enter(child):
                if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and child is not region:
                    return False
                call = self._logging_call(child)
                if (call is not None and not records_only(self.ctx.facts, call)
                        and not self._reads_tensors(call, tensors) and not is_step_closure_call(call)):
                    found.append((self.ctx.facts.order.get(child, 0), read_names(call)))
                return True

            walk(region, enter)
        return [order for order, names in found if not names & on_device.keys()]

    def _flush_at_exit(self) -> None:
        """Where the target does not run pending closures at interpreter exit (torch_xla), the
        step boundary is registered to run then, once, at module level before the first
        definition or loop that queues closures: a loop left by an exception keeps its last
        lines too."""
        if self._exit_flush or not self.ctx.target.has("flush_at_exit"):
            return
        self._exit_flush = True
        setting = self.ctx.statements("flush_at_exit")
        if all(self.ctx.code(line).strip() in self.ctx.source_text for line in setting):
            return  # migrated already
        anchor = self.ctx.open_statements[0]
        blank = [line for line in getattr(anchor, "leading_lines", ()) if line.comment is None]
        setting[0] = setting[0].with_changes(leading_lines=blank)  # set apart like the definition
        self.ctx.insert_before(anchor, setting)

    def _flush_before_return(self, line: cst.SimpleStatementLine) -> None:
        """``return`` out of a loop that queued closures runs them first."""
        loop = self.ctx.loop
        if loop is None or loop.node not in self._flushed or not isinstance(line.body[0], cst.Return):
            return
        self.ctx.insert_before(line, self.ctx.statements("mark_step"))
        self.ctx.fix(line, "the step closures run before the return leaves the loop")

    def leave_For(self, original_node, updated_node):
        return self._flush_after(original_node, updated_node)

    def leave_While(self, original_node, updated_node):
        return self._flush_after(original_node, updated_node)

    def _flush_after(self, original_node, updated_node):
        """A loop that queued closures runs them when it ends (also by ``break``), before
        anything after it prints."""
        if original_node not in self._flushed:
            return updated_node
        marks = self.ctx.statements("mark_step")
        following = self.ctx.facts.next_statement.get(original_node)
        if following is not None and self.ctx.code(following).strip() == self.ctx.code(marks[0]).strip():
            return updated_node  # flushed already
        self.ctx.insert_after(original_node, marks)
        self.ctx.fix(original_node, "the loop's step closures run when it ends")
        return updated_node

    # Which calls log -------------------------------------------------------------------------

    def _logging_call(self, line: cst.CSTNode) -> cst.Call | None:
        """The logging call that ``line`` consists of, else None."""
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        statement = line.body[0]
        if not isinstance(statement, cst.Expr) or not isinstance(statement.value, cst.Call):
            return None
        return statement.value if self._is_logging(statement.value) else None

    def _helper_logs_inside(self, call: cst.Call) -> bool:
        """Whether ``call`` calls a helper of this file (TorchAcc's migration guide's ``log_metrics``) whose own
        logging of the tensors it is given moves (or has moved) into a step closure."""
        if not isinstance(call.func, cst.Name):
            return False
        for helper in self._loop_helpers:
            if helper.name.value == call.func.value:
                tensors = self.ctx.facts.values(helper)
                found = False

                def enter(child):
                    nonlocal found
                    if found or isinstance(child, (cst.FunctionDef, cst.ClassDef)) and child is not helper:
                        return False
                    if is_step_closure_call(child):  # migrated already: it logs in a step closure
                        found = True
                        return False
                    logging = self._logging_call(child)
                    if logging is not None and self._reads_tensors(logging, tensors):
                        found = True
                        return False
                    return True

                walk(helper, enter)
                return found
        return False

    def _is_logging(self, call: cst.Call) -> bool:
        return is_logging_call(self.ctx.facts, call)

    @staticmethod
    def _reads_tensors(call: cst.Call, tensors) -> bool:
        return tensors.reads_value(call) or any(tensors.holds_tensor(arg.value) for arg in call.args)

    # The closure -----------------------------------------------------------------------------

    def _closure(self, call: cst.Call, updated: cst.Call, tensors,
                 on_device: dict[str, str]) -> tuple[str, list[cst.BaseExpression]]:
        """The closure's code and the values passed to it, made of ``updated`` (``call`` with the
        other rules' changes). A tensor the closure only reads through its methods
        (``loss.item()``) is passed detached: its autograd graph would stay alive until the step
        ends. One that is printed whole keeps it (its text shows ``grad_fn``). A name kept on
        the device (``on_device``) is passed as its tensor and read where the call read it
        (``D_x.item()``), so the call is given the same value."""
        made_from = origins(call, updated)
        bound = bound_names(call)
        on_device = {name: form for name, form in on_device.items() if name in read_names(call)}
        plain = all(arg.keyword is None and not arg.star for arg in call.args) and dotted(call.func) is not None
        if (plain and not on_device and all(self._eager(arg.value, tensors, bound) for arg in call.args)
                and len(updated.args) == len(call.args)):
            return self.ctx.code(updated.func), [arg.value for arg in updated.args]
        extract = _Extract(self, tensors, bound, updated, made_from, on_device)
        body = extract.extracted(updated)
        params = ", ".join(extract.params)
        head = f"lambda {params}" if params else "lambda"
        read = _read_through_methods(body)
        values = [
            _detached(value) if param in read and tensors.is_tensor(made_from.get(value, value)) else value
            for param, value in zip(extract.params, extract.values)
        ]
        return f"{head}: {self.ctx.code(body)}", values

    def _eager(self, node: cst.CSTNode, tensors, bound: set[str]) -> bool:
        """Whether ``node`` can be evaluated where the call was: it reads no tensor value and
        no name bound inside the call."""
        return not tensors.reads_value(node) and not (read_names(node) & bound) and not contains(node, cst.Lambda)

    def _passed(self, node: cst.CSTNode, bound: set[str]) -> bool:
        """Whether ``node`` reads a variable (rather than only literals, imports and builtins)."""
        imports = self.ctx.facts.file.imports
        return any(
            name not in imports and name not in BUILTIN_NAMES and name not in bound for name in read_names(node)
        )


class _Extract:
    """Replaces the values a logging call reads by the closure's parameters. The call walked is
    the updated one; what is a value is asked of the original node each node stands for
    (`origins`), or of the node itself where another rule made it."""

    def __init__(self, rule: StepClosure, tensors, bound: set[str], call: cst.Call, origins: dict,
                 on_device: dict[str, str]):
        self.rule = rule
        self.on_device = on_device
        self._host_reads: dict[cst.CSTNode, str] = {}  # a name kept on the device -> how the call read it
        self.tensors = tensors
        self.bound = bound
        self.origins = origins
        self.params: list[str] = []
        self.values: list[cst.BaseExpression] = []
        self._by_code: dict[str, str] = {}
        self._replace: dict[cst.CSTNode, str] = {}
        self._kept: set[cst.CSTNode] = {call.func}  # the logging function itself stays as it is
        self._call = call  # never a value itself: the closure would only return it
        self._method: set[cst.CSTNode] = set()
        self._parts: set[cst.CSTNode] = set()
        self._taken = read_names(call) | bound

    def extracted(self, call: cst.Call) -> cst.Call:
        return rebuilt(call, self._leave, self._enter)

    def _enter(self, node: cst.CSTNode) -> bool:
        if node in self._kept:
            return False
        if isinstance(node, cst.Attribute):
            self._kept.add(node.attr)
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            self._kept.add(node.keyword)
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Name):
                self._kept.add(func)
            elif isinstance(func, cst.Attribute):
                receiver = func.value
                if root_name(receiver) in self.rule.ctx.facts.file.imports or not self._is_value(receiver):
                    self._kept.add(func)
                else:
                    self._method.add(func)  # the receiver is a value; the method call stays
        if isinstance(node, cst.ConcatenatedString):
            # Its parts must stay strings ("a" f"{x}"): the values inside them are replaced.
            self._parts.update((node.left, node.right))
        if node in self._method or node in self._parts or isinstance(node, cst.StarredElement):
            return True  # a starred element's value is replaced, the star stays
        origin = self.origins.get(node, node)
        if type(origin) is cst.Name and origin.value in self.on_device:
            self._replace[node] = self._param(node)
            self._host_reads[node] = self.on_device[origin.value]
            return False
        if isinstance(node, cst.BaseExpression) and node is not self._call and self._is_value(node):
            self._replace[node] = self._param(node)
            return False
        return True

    def _is_value(self, node: cst.CSTNode) -> bool:
        node = self.origins.get(node, node)
        if self.on_device and read_names(node) & self.on_device.keys():
            return False  # its names kept on the device are read inside the closure
        return self.rule._eager(node, self.tensors, self.bound) and self.rule._passed(node, self.bound)

    def _leave(self, original_node, updated_node):
        name = self._replace.get(original_node)
        if name is None:
            return updated_node
        param = cst.Name(name)
        form = self._host_reads.get(original_node)
        if form == "float":
            return cst.Call(func=cst.Name("float"), args=[cst.Arg(param)])
        if form is not None and form != "value":
            return cst.Call(func=cst.Attribute(value=param, attr=cst.Name(form)))
        return param.with_changes(lpar=(), rpar=())

    def _param(self, node: cst.CSTNode) -> str:
        code = self.rule.ctx.code(node).strip()
        if code in self._by_code:
            return self._by_code[code]
        name = _param_name(node)
        candidate, number = name, 2
        while candidate in self.params or (candidate != code and candidate in self._taken) or candidate in BUILTIN_NAMES:
            candidate, number = f"{name}_{number}", number + 1
        self._by_code[code] = candidate
        self.params.append(candidate)
        self.values.append(node)
        return candidate




def _own_lines(loop: cst.CSTNode) -> list[cst.SimpleStatementLine]:
    """The statement lines of ``loop``'s body, in order, also under its ``if``/``with``/``try``;
    not those of a loop, function or class inside it."""
    found = []

    def enter(node):
        if node is not loop and isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(node, cst.SimpleStatementLine):
            found.append(node)
            return False
        return not isinstance(node, cst.BaseExpression)

    walk(loop.body, enter)
    return found


def _only_read_in(tensors, name: str, bindings: dict[cst.CSTNode, str], statements: set[cst.CSTNode]) -> bool:
    """Whether ``name`` is read, and every read of it that one of ``bindings`` reaches is in one
    of ``statements``, and every path to it comes through those bindings. (A value never read
    stays as it is: no closure would read it.)"""
    read_somewhere = False
    for binding in bindings:
        reads = tensors.reads_reached(name, binding)
        if reads is None:
            return False
        for read in reads:
            statement = tensors.statement_of(read)  # the small statement: a logging line's only one
            reaching = tensors.bindings_at(name, statement)  # none: a path may bring a value from elsewhere
            if statement not in statements or not reaching or not reaching <= bindings.keys():
                return False
            read_somewhere = True
    return read_somewhere


# Methods that give a new tensor, never a view of their receiver: a host read of one can wait
# for the step closure without a copy.
_FRESH_METHODS = frozenset({"mean", "sum", "std", "var", "norm", "prod", "argmax", "argmin"})


def _fresh(tensor: cst.BaseExpression) -> bool:
    """Whether ``tensor`` is computed here into storage of its own (``output.mean()``, ``a - b``)."""
    if isinstance(tensor, (cst.BinaryOperation, cst.UnaryOperation)):
        return True
    func = tensor.func if isinstance(tensor, cst.Call) else None
    return isinstance(func, cst.Attribute) and func.attr.value in _FRESH_METHODS


def _detached(value: cst.BaseExpression) -> cst.BaseExpression:
    return cst.Call(func=cst.Attribute(value=value, attr=cst.Name("detach")))


def _read_through_methods(body: cst.CSTNode) -> set[str]:
    """The names that ``body`` uses only as ``name.attribute`` (``loss.item()``)."""
    whole: set[str] = set()
    through: set[str] = set()

    def enter(node):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            through.add(node.value.value)
            return False
        if isinstance(node, cst.Name):
            whole.add(node.value)
        return True

    walk(body, enter)
    return through - whole


# A step-closure call with a lambda longer than this is written one argument a line. (The
# direct form, ``xm.add_step_closure(log_metrics, args=(...), run_async=True)``, stays on one.)
_WRAP_AT = 88


def _one_argument_a_line(call: cst.Call) -> cst.Call:
    """``f(\n    a,\n    b)``, indented from the statement's own indentation; the closing
    parenthesis ends the last line, as in TorchAcc's migration guide's ``xm.add_step_closure(...)``."""

    def line_break() -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True, last_line=cst.SimpleWhitespace("    ")
        )

    last = len(call.args) - 1
    args = [
        arg.with_changes(comma=cst.MaybeSentinel.DEFAULT if number == last else cst.Comma(whitespace_after=line_break()))
        for number, arg in enumerate(call.args)
    ]
    return call.with_changes(whitespace_before_args=line_break(), args=args)


def _param_name(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript):
        index = node.slice[0].slice if len(node.slice) == 1 else None
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            text = index.value.evaluated_value
            if isinstance(text, str) and text.isidentifier():
                return text
        return _param_name(node.value)
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name) and node.func.value in BUILTIN_NAMES and len(node.args) == 1:
            return f"{node.func.value}_{_param_name(node.args[0].value)}"  # len(losses) -> len_losses
        return _param_name(node.func)
    return "value"
