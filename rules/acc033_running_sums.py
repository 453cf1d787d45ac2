import libcst as cst

from accrewrite.nodes import rebuilt
from accrewrite.rule import Example, Rule
from accrewrite.rules._running_sums import running_sums
from accrewrite.rules._training_code import host_read


class RunningSumsOnDevice(Rule):
    """Keep a running sum of the step's loss on the device, read when it is logged.

    `total_loss += loss.item()` reads the loss on the host every step: on a lazy device the
    step's graph runs there, before the step's end, and the host waits for it. A hand port
    keeps the sum on the device (`total_loss += loss.detach()`) and reads it only when it is
    logged; so does imagenet's `AverageMeter` given `loss.detach()`, as it is already given the
    accuracy's tensors (`top1.update(acc1[0], n)`). Where the sum is logged in the loop, ACC009
    moves that logging into the step closure, which reads it after the step.

    Done only where a tensor does what the number did: the read is of one value (a loss of
    torch's loss functions or modules, a `.mean()` or `.sum()`), the sum is otherwise only set
    to a number and read formatted (`'{:5.2f}'.format(t)`, an f-string, `'%.2f' % t`), by
    `math`, `float` or `int`, or through arithmetic assigned to a name read the same way, in
    the loop (or formatted after it), and not before the step adds to it in place (a step
    closure would read the addition); a meter's instance is read only by its `update`, as an attribute formatted, or
    beside an instance given tensors. The sum is then a float32 on the device rather than
    Python's float64.
    """

    code = "ACC033"
    name = "running-sums-on-device"
    summary = "total += loss.item() -> total += loss.detach(), read where it is logged"
    concepts = ("lazy_execution",)
    triggers = frozenset({"item", "float"})
    examples = (
        Example(
            target="torch_xla",
            with_rules=("ACC009",),
            before="""
            import math
            import torch

            criterion = torch.nn.NLLLoss()
            for epoch in range(epochs):
                total_loss = 0.
                for batch, (data, targets) in enumerate(loader):
                    loss = criterion(model(data), targets)
                    loss.backward()
                    optimizer.step()
                    total_loss += loss.item()
                    if batch % log_interval == 0:
                        cur_loss = total_loss / log_interval
                        print('loss {:5.2f} | ppl {:8.2f}'.format(cur_loss, math.exp(cur_loss)))
                        total_loss = 0
            """,
            after="""
            import math
            import torch
            import torch_xla.core.xla_model as xm
            import atexit
            import torch_xla

            criterion = torch.nn.NLLLoss()
            atexit.register(torch_xla.sync)
            for epoch in range(epochs):
                total_loss = 0.
                for batch, (data, targets) in enumerate(loader):
                    loss = criterion(model(data), targets)
                    loss.backward()
                    optimizer.step()
                    total_loss += loss.detach()
                    if batch % log_interval == 0:
                        cur_loss = total_loss / log_interval
                        xm.add_step_closure(
                            lambda cur_loss: print('loss {:5.2f} | ppl {:8.2f}'.format(cur_loss, math.exp(cur_loss))),
                            args=(cur_loss,),
                            run_async=False)
                        total_loss = 0
                torch_xla.sync()
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            class AverageMeter:
                def __init__(self, name, fmt):
                    self.name, self.fmt, self.sum, self.count = name, fmt, 0, 0

                def update(self, val, n=1):
                    self.val = val
                    self.sum += val * n
                    self.count += n
                    self.avg = self.sum / self.count

            def train(loader, model, criterion, optimizer):
                losses = AverageMeter("Loss", ":.4e")
                top1 = AverageMeter("Acc@1", ":6.2f")
                progress = ProgressMeter(len(loader), [losses, top1])
                for i, (images, target) in enumerate(loader):
                    output = model(images)
                    loss = criterion(output, target)
                    acc1 = accuracy(output, target)
                    losses.update(loss.item(), images.size(0))
                    top1.update(acc1[0], images.size(0))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if i % 10 == 0:
                        progress.display(i + 1)

            criterion = torch.nn.CrossEntropyLoss().cuda()
            train(loader, model, criterion, optimizer)
            """,
            after="""
            import torch

            class AverageMeter:
                def __init__(self, name, fmt):
                    self.name, self.fmt, self.sum, self.count = name, fmt, 0, 0

                def update(self, val, n=1):
                    self.val = val
                    self.sum += val * n
                    self.count += n
                    self.avg = self.sum / self.count

            def train(loader, model, criterion, optimizer):
                losses = AverageMeter("Loss", ":.4e")
                top1 = AverageMeter("Acc@1", ":6.2f")
                progress = ProgressMeter(len(loader), [losses, top1])
                for i, (images, target) in enumerate(loader):
                    output = model(images)
                    loss = criterion(output, target)
                    acc1 = accuracy(output, target)
                    losses.update(loss.detach(), images.size(0))
                    top1.update(acc1[0], images.size(0))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if i % 10 == 0:
                        progress.display(i + 1)

            criterion = torch.nn.CrossEntropyLoss().cuda()
            train(loader, model, criterion, optimizer)
            """,
        ),
    )

    def leave_SimpleStatementLine(self, original_node, updated_node):
        read = running_sums(self.ctx).reads.get(original_node)
        if read is None:
            return updated_node
        code = self.ctx.code(read)

        def leave(original, updated):
            if type(original) is cst.Call and host_read(original) is not None and self.ctx.code(original) == code:
                return cst.Call(func=cst.Attribute(value=host_read(updated)[1], attr=cst.Name("detach")))
            return updated

        self.ctx.fix(original_node, f"`{code}` stays on the device until it is logged")
        return rebuilt(updated_node, leave)
