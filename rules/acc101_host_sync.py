import libcst as cst

from accrewrite.analysis import FRAMEWORK_STEPS, HOST_READ_CALLS
from accrewrite.values import SYNC_NODES, SYNC_WORDS, read_names
from accrewrite.nodes import call_arg, dotted, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.rules._training_code import LOGGING_WORDS, LoopDiagnostic, is_logging_call


class HostSync(LoopDiagnostic, Rule):
    """Report reads of a tensor's value on the host inside the training loop.

    `.item()`, `.cpu()`, `.to("cpu")`, `.numpy()`, `.tolist()`, `float(t)`/`int(t)`/`bool(t)`,
    printing, logging or formatting a tensor (`f"{norm:.4f}"`, `"{:.4f}".format(t)`, `"%f" % t`:
    each calls `Tensor.__format__`, an `.item()`), and calling a helper of the file that returns
    its argument read on the host (`to_python_float(t)`) copy its value to the host: Python stops
    until the device has computed it. On an XLA target that forces the pending lazy graph to compile and
    run in the middle of the step (an XLA sync), and with torch.compile it is a graph break: the
    compiled graph ends at that line and a new one starts after it. Each finding says so; the
    lines reported are exactly the ones that cut the compiled graph.

    What to do: keep the value as a tensor while training (`running_loss += loss.detach()`),
    read it every N steps instead of every step, or read it in a step closure
    (`xm.add_step_closure`; ACC009 moves logging there by itself).

    Whether a value is a tensor comes from the file's data-flow analysis, through its helpers
    (`reduce_tensor(loss.data).item()`) and arithmetic (`0.0 + loss.detach()` is a tensor); a
    number from `.item()`, `len()`, `time.time()` or an option is not one.

    Only the training loop (one that calls backward, also with parameters updated by hand) and
    its step functions are checked: elsewhere a host read costs once. A script that Hugging
    Face Accelerate trains (ACC019) is checked the same way, as Accelerate's TPU guide warns of
    these reads too: there a metric given tensors (`metric.add_batch(...)` of `evaluate`, which
    turns them into numpy) and `accelerator.log` given a tensor read it. In one that Hugging
    Face's Trainer trains (ACC017), what the Trainer calls on each step is checked: its
    callbacks' methods, its subclass's (`compute_loss`), the collator and
    `preprocess_logits_for_metrics` it is given. A LightningModule's `training_step` is its step
    (ACC018): on an XLA target, `self.log(..., sync_dist=True)` there reduces the value on the
    host every step (Lightning's XLA strategy calls `xm.mesh_reduce`).
    Nothing inside a step closure is reported, including the logging that ACC009 moves into one
    in the same run.
    """

    code = "ACC101"
    name = "host-sync"
    summary = "host sync in the loop (.item(), .cpu(), .numpy(), .tolist(), printing a tensor): breaks the graph"
    # "%" finds `"%f" % t` (a word of string literals); f-strings are found by their expressions.
    triggers = frozenset({*SYNC_WORDS, "%", HOST_READ_CALLS, *LOGGING_WORDS})
    trigger_nodes = SYNC_NODES
    examples = (
        Example(
            before="""
            import torch

            model = Net().cuda()
            running = 0.0
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                running += loss.item()
                preds = model(x).argmax(-1).cpu().numpy()
                if step % 100 == 0:
                    print(f"step {step} loss {loss.item():.3f}")
            print(f"done: {running / len(train_loader):.3f}")
            """,
            diagnostics=("ACC101:9", "ACC101:10", "ACC101:12"),
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def train_step(model, batch, optimizer):
                batch = {k: v.cuda() for k, v in batch.items()}
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                return {"loss": float(loss), "ok": bool(torch.isfinite(loss))}
            """,
            diagnostics=("ACC101:8", "ACC101:8"),
        ),
        # A helper's tensor read on the host, arithmetic with a Python number (a tensor still), a
        # helper that returns its argument read on the host (apex's to_python_float), a tensor
        # given to logging; the number len() gives is not a tensor.
        Example(
            before="""
            import torch
            import torch.distributed as dist


            def reduce_tensor(t):
                rt = t.clone()
                dist.all_reduce(rt)
                rt /= dist.get_world_size()
                return rt


            def to_python_float(t):
                return t.float().item()


            model = Net().cuda()
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                reduced = reduce_tensor(loss.data).item()
                lossf = 0.0 + loss.detach()
                if step % 100 == 0:
                    meter.update(to_python_float(loss), x.size(0))
                    logger.info("step %d loss %s", step, lossf)
                    logger.info("step %d of %d", step, len(train_loader))
            """,
            diagnostics=("ACC101:21", "ACC101:24", "ACC101:25"),
        ),
        # A tensor formatted (f-string, str.format, %) where no logging call moves it: each is
        # Tensor.__format__, an .item(); an option's float, time.time() and len() are not tensors.
        Example(
            before="""
            import argparse
            import time
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=0.1)
            args = parser.parse_args()

            model = Net().cuda()
            start = time.time()
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                elapsed = time.time() - start
                with open("train.log", "a") as log:
                    log.write(f"{step}: norm {norm:.4f} lr {args.lr} {elapsed:.1f}s\\n")
                    log.write("{:.4f}\\n".format(norm))
                    log.write("%d: %.4f of %d\\n" % (step, norm, len(train_loader)))
            """,
            diagnostics=("ACC101:18", "ACC101:19", "ACC101:20"),
        ),
        # A loop that updates the parameters by hand (no optimizer.step()) trains; a list given
        # tensors holds tensors (accuracy()'s res), and so does a model's state dict.
        Example(
            before="""
            import torch


            def accuracy(output, target):
                res = []
                correct = output.argmax(-1).eq(target)
                res.append(correct.float().mean() * 100)
                return res


            model = torch.nn.Linear(16, 4).cuda()
            lr = 0.1
            for epoch in range(10):
                for x, y in train_loader:
                    x, y = x.cuda(), y.cuda()
                    output = model(x)
                    loss = criterion(output, y)
                    loss.backward()
                    with torch.no_grad():
                        for p in model.parameters():
                            p -= lr * p.grad
                            p.grad = None
                    acc1 = accuracy(output, y)
                    top1.update(acc1[0].item(), x.size(0))
                snapshot = {k: v.cpu() for k, v in model.state_dict().items()}
            """,
            diagnostics=("ACC101:24", "ACC101:25"),
        ),
        # test() returns Python floats (its .item() runs in test, not in the step): formatting
        # them reads nothing, although test() was being computed when train_iter was first read.
        Example(
            before="""
            import torch


            def train_iter(model, optimizer, x, y):
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                history.append(loss.item())
                loss_val, acc_val = test(model, x, y)
                print(f"loss {loss_val:.4f} acc {acc_val:.4f}")


            def test(model, x, y):
                with torch.no_grad():
                    out = model(x)
                    loss = criterion(out, y)
                    acc = (out.argmax(1) == y).float().mean()
                return loss.item(), acc.item()


            model = Net().cuda()
            features = torch.randn(100, 16).cuda()
            labels = torch.randint(0, 4, (100,)).cuda()
            for epoch in range(100):
                train_iter(model, optimizer, features, labels)
            loss_test, acc_test = test(model, features, labels)
            """,
            diagnostics=("ACC101:9",),
        ),
        # A script that Accelerate trains (ACC019) has its reads reported as in any other: a metric
        # given tensors (evaluate's add_batch turns them into numpy), accelerator.log given a
        # tensor, math.exp of one.
        Example(
            before="""
            import math
            import evaluate
            import torch
            from accelerate import Accelerator

            accelerator = Accelerator(log_with="all")
            metric = evaluate.load("glue", "mrpc")
            model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
            for epoch in range(3):
                for batch in train_loader:
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                losses = []
                for batch in eval_loader:
                    with torch.no_grad():
                        outputs = model(**batch)
                    losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(8)))
                    predictions, references = accelerator.gather_for_metrics((outputs.logits.argmax(-1), batch["labels"]))
                    metric.add_batch(predictions=predictions, references=references)
                eval_loss = torch.cat(losses).mean()
                accelerator.log({"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}, step=epoch)
            """,
            diagnostics=("ACC101:21", "ACC101:23", "ACC101:23"),
        ),
        # Inside a step closure (a function or lambda given to add_step_closure) a read runs after
        # the step's graph: not reported.
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch_xla.core.xla_model as xm

            device = xm.xla_device()
            model = torch.nn.Linear(16, 4).to(device)
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x), y)
                loss.backward()
                xm.optimizer_step(optimizer)

                def report(step, loss):
                    print(f"step {step} loss {loss.item():.4f}")

                xm.add_step_closure(report, args=(step, loss))
                xm.add_step_closure(lambda loss: print(loss.item()), args=(loss.detach(),))
                total = loss.item()
            """,
            diagnostics=("ACC101:16",),
        ),
        # A Trainer's callback runs at each step the Trainer takes.
        Example(
            target="torch_xla",
            before="""
            import torch
            from transformers import Trainer, TrainerCallback

            class GradNorm(TrainerCallback):
                def on_step_end(self, args, state, control, model=None, **kwargs):
                    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
                    print("grad norm", torch.stack(norms).norm().item())

            Trainer(model=model, args=args, callbacks=[GradNorm()]).train()
            """,
            diagnostics=("ACC101:7",),
        ),
    )

    def applies(self) -> bool:
        return self.could_report()

    def check_call(self, node: cst.Call) -> None:
        if not self.in_loop:
            return
        if self._reduced_on_the_host(node):
            self.report(node, _message(self.ctx.code(node), "sync_dist=True"), _SYNC_DIST_HELP)
            return
        tensors = self.tensors()
        how = tensors.sync(node)
        if how is None and is_logging_call(self.ctx.facts, node):
            # print(loss), logger.info("%s", loss), wandb.log({"loss": loss}): formatted or
            # converted where the call runs
            if any(tensors.holds_tensor(arg.value) for arg in node.args):
                how = "printing a tensor" if dotted(node.func) == "print" else "logging a tensor"
        if how is None:
            return
        func = node.func
        if isinstance(func, cst.Attribute) and tensors.sync(func.value) is not None:
            return  # `.cpu().numpy()`: the first read is the one that waits
        message, help = _message(self.ctx.code(node), how), _HELP
        logged = self._read_only_by_logging()
        if logged:
            help += (f" `{logged}` is read only by logging: compute it inside that logging call's step "
                     "closure (pass the tensor, call .item() there).")
        self.report(node, message, help)

    def _reduced_on_the_host(self, node: cst.Call) -> bool:
        """``self.log(..., sync_dist=True)`` in a LightningModule's step, reduced every step."""
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in _LIGHTNING_LOGS and dotted(func.value) == "self"):
            return False
        # Where Lightning trains on the target's lazy device (ACC018 migrates its Trainer there).
        if self.ctx.facts.framework not in FRAMEWORK_STEPS or not self.ctx.target.has("lazy_execution",
                                                                                     "lightning_accelerator"):
            return False
        sync, on_step = call_arg(node, 99, "sync_dist"), call_arg(node, 99, "on_step")
        # Logged only on_epoch, the value is reduced once an epoch.
        return sync is not None and dotted(sync.value) != "False" and (on_step is None or dotted(on_step.value) != "False")

    def _read_only_by_logging(self) -> str | None:
        """The variable this statement assigns, when nothing but logging calls read it (nanoGPT's
        ``lossf = loss.item() * gradient_accumulation_steps`` before its print)."""
        statement = self.ctx.statement
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        assign = statement.body[0]
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            return None
        name = target.value
        scope = self.ctx.scope
        body = scope.body if scope is not None else self.ctx.module
        reads = {"logging": 0, "other": 0}
        facts = self.ctx.facts

        def enter(node):
            if node is statement or isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not scope:
                return False
            if isinstance(node, cst.SimpleStatementLine):
                if name in read_names(node):
                    only = (
                        len(node.body) == 1 and isinstance(node.body[0], cst.Expr)
                        and isinstance(node.body[0].value, cst.Call) and is_logging_call(facts, node.body[0].value)
                    )
                    reads["logging" if only else "other"] += 1
                return False
            if isinstance(node, cst.BaseCompoundStatement):
                header = [getattr(node, attr, None) for attr in ("test", "iter", "items")]
                if any(part is not None and name in _header_names(part) for part in header):
                    reads["other"] += 1
            return True

        walk(body, enter)
        return name if reads["logging"] and not reads["other"] else None

    def leave_BinaryOperation(self, original_node, updated_node):
        if self.in_loop and isinstance(original_node.operator, cst.Modulo):
            tensors = self.tensors()
            if tensors.sync(original_node) is not None:  # "%f" % t: each tensor formatted is read
                right = original_node.right
                if isinstance(right, (cst.Tuple, cst.Dict)):
                    operands = [element.value for element in right.elements if isinstance(element, cst.BaseElement)]
                else:
                    operands = [right]
                for operand in operands:
                    if tensors.is_tensor(operand):
                        self.report(operand, _message(self.ctx.code(operand), "formatting a tensor"), _HELP)
        return updated_node

    def leave_FormattedStringExpression(self, original_node, updated_node):
        if self.in_loop and self.tensors().sync(original_node) is not None:
            expression = original_node.expression
            self.report(expression, _message(self.ctx.code(expression), "formatting a tensor"), _HELP)
        return updated_node


_HELP = (
    "Reading a tensor's value waits for the device: on XLA it forces the pending graph to run "
    "mid-step, and under torch.compile the graph breaks at this line. Keep the value as a tensor "
    "(`total += loss.detach()`), read it every N steps, or read it in a step closure "
    "(xm.add_step_closure; ACC009 moves logging there)."
)


# A LightningModule's logging methods.
_LIGHTNING_LOGS = frozenset({"log", "log_dict"})
_SYNC_DIST_HELP = (
    "Lightning's XLA strategy reduces a value logged with sync_dist=True through xm.mesh_reduce, which "
    "copies it to the host: the pending graph runs mid-step. Log it without sync_dist in training_step "
    "(each device's value), or with sync_dist=True and on_step=False, on_epoch=True, which reduces it once an epoch."
)


def _message(code: str, how: str) -> str:
    shown = excerpt(code)
    reason = "" if how.startswith(".") and how in shown else f" ({how})"  # `x.item()` says .item()
    return f"`{shown}` syncs the host every step{reason}"


def _header_names(part) -> set[str]:
    if isinstance(part, (list, tuple)):  # with-items
        return set().union(*(read_names(item.item) for item in part)) if part else set()
    return read_names(part)
