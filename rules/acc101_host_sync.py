import libcst as cst

from accrewrite.analysis import HOST_READ_CALLS
from accrewrite.nodes import walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.rules._training_code import LoopDiagnostic, free_names, is_logging_call

_PRINTERS = frozenset({"print"})


class HostSync(LoopDiagnostic, Rule):
    """Report reads of a tensor's value on the host inside the training loop.

    `.item()`, `.cpu()`, `.to("cpu")`, `.numpy()`, `.tolist()`, `float(t)`/`int(t)`/`bool(t)`,
    and printing or formatting a tensor copy its value to the host: Python stops until the
    device has computed it. On an XLA target that forces the pending lazy graph to compile and
    run in the middle of the step (an XLA sync), and with torch.compile it is a graph break: the
    compiled graph ends at that line and a new one starts after it. Each finding says so; the
    lines reported are exactly the ones that cut the compiled graph.

    What to do: keep the value as a tensor while training (`running_loss += loss.detach()`),
    read it every N steps instead of every step, or read it in a step closure
    (`xm.add_step_closure`; ACC009 moves logging there by itself).

    Only the training loop and its step functions are checked: elsewhere a host read costs once.
    Nothing inside a step closure is reported, including the logging that ACC009 moves into one
    in the same run.
    """

    code = "ACC101"
    name = "host-sync"
    summary = "host sync in the loop (.item(), .cpu(), .numpy(), .tolist(), printing a tensor): breaks the graph"
    # "%" finds `"%f" % t` (a word of string literals); f-strings are found by their expressions.
    triggers = frozenset({"item", "tolist", "numpy", "cpu", "float", "int", "bool", "print", "format", "str", "%",
                          HOST_READ_CALLS})
    trigger_nodes = (cst.FormattedStringExpression,)
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
    )

    def check_call(self, node: cst.Call) -> None:
        if not self.in_loop:
            return
        tensors = self.tensors()
        how = tensors.sync(node)
        if how is None and isinstance(node.func, cst.Name) and node.func.value in _PRINTERS:
            if any(tensors.is_tensor(arg.value) for arg in node.args):
                how = "printing a tensor"
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
                if name in free_names(node):
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


def _message(code: str, how: str) -> str:
    shown = excerpt(code)
    reason = "" if how.startswith(".") and how in shown else f" ({how})"  # `x.item()` says .item()
    return f"`{shown}` syncs the host every step{reason}"


def _header_names(part) -> set[str]:
    if isinstance(part, (list, tuple)):  # with-items
        return set().union(*(free_names(item.item) for item in part)) if part else set()
    return free_names(part)
