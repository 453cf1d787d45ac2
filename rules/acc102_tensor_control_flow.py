from types import MappingProxyType

import libcst as cst

from accrewrite.rule import Example, Rule, excerpt
from accrewrite.rules._training_code import LoopDiagnostic

# The nodes whose test is checked, and how a report names each.
_TESTED = MappingProxyType({
    cst.If: "`if`",
    cst.While: "`while`",
    cst.IfExp: "conditional expression on",
    cst.Assert: "`assert`",
})


class TensorControlFlow(LoopDiagnostic, Rule):
    """Report Python control flow that depends on a tensor's value inside the training loop.

    `if loss > best:`, `while (x != 0).any():`, `if torch.isnan(loss):` or
    `if loss.item() > 10:` make Python decide on a value that only the device knows: the
    host waits for it (an XLA sync that runs the pending graph mid-step), and under
    torch.compile the graph breaks at the test, with a separate graph (and recompilation) for
    each branch taken. A test on Python values (`if step % 10 == 0`) is fine.

    What to do: compute both sides and select with `torch.where(cond, a, b)` (or multiply by
    a mask), check the condition every N steps or in a step closure, or keep such checks out of
    the compiled region. Only the training loop and its step functions are checked. Whether a
    test is on a tensor comes from the file's data-flow analysis: a value that is a tensor or
    None (`acc = None if ... else t.mean()`) is tested as a tensor; a number from `.item()`,
    `len()`, `time.time()` or an option is not a tensor.
    """

    code = "ACC102"
    name = "tensor-control-flow"
    summary = "Python control flow (if/while/ternary/assert) on a tensor value inside the loop"
    # Found by their statements (if, while, conditional expressions, assert), not by words.
    triggers = frozenset()
    trigger_nodes = tuple(_TESTED)
    examples = (
        Example(
            before="""
            import torch

            model = Net().cuda()
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x), y)
                if torch.isnan(loss):
                    continue
                loss.backward()
                optimizer.step()
                if step % 100 == 0 and loss.item() < best:
                    best = loss.item()
            """,
            diagnostics=("ACC102:6", "ACC102:10"),
        ),
        # A tensor kept as the best value, an optional tensor (None on the first step) and a
        # tensor tolerance loop; tests on len(), an option, time.time() and the step are not on tensors.
        Example(
            before="""
            import time
            import torch

            model = torch.nn.Linear(16, 4).cuda()
            best, tol = float("inf"), 1e-3
            start = time.time()
            for step, (x, y) in enumerate(train_loader):
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                if loss < best:
                    best = loss.detach()
                acc = None if step == 0 else (model(x.cuda()).argmax(-1) == y.cuda()).float().mean()
                if acc:
                    print("accuracy logged")
                err = model.weight.grad.norm()
                while err > tol:
                    err = err / 2
                lr = args.lr * 0.5 if len(train_loader) > 10 else args.lr
                if step % 100 == 0 and time.time() - start > 60:
                    print(f"step {step} lr {lr}")
            """,
            diagnostics=("ACC102:11", "ACC102:14", "ACC102:17"),
        ),
    )

    def applies(self) -> bool:
        return self.could_report()

    def _leave_test(self, original_node, updated_node):
        """Report the test of an ``if``, ``while``, conditional expression or ``assert`` in the
        loop where it is on a tensor's value."""
        if not self.in_loop:
            return updated_node
        test = original_node.test
        tensors = self.tensors()
        if tensors.tested_as_tensor(test):
            how = "a tensor's truth value"
        elif tensors.reads_value(test):
            how = "a value read from a tensor"
        else:
            return updated_node
        self.report(
            test,
            f"{_TESTED[type(original_node)]} `{excerpt(self.ctx.code(test))}` tests {how}",
            "The host waits for the device (an XLA sync mid-step) and torch.compile breaks the graph "
            "here, with one graph per branch. Select with torch.where(cond, a, b) or a mask instead, "
            "or check it every N steps or in a step closure.",
        )
        return updated_node

    leave_If = leave_While = leave_IfExp = leave_Assert = _leave_test
