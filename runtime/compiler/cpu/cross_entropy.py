"""Cross-entropy on the CPU by accrewrite's C++ kernel (``cpu_kernels.cpp``): the implementation
"cpp" of the op cross_entropy (``ops/cross_entropy.py``), the alternative to inductor's code for
``F.cross_entropy(logits, target)`` over rows of many classes (a language model's vocabulary),
float32.

A language model's loss is ``F.cross_entropy(head(x), target)``. Inductor compiles it to a
forward that reads the logits twice, a backward that reads them again to write their gradient,
and the head's bias gradient, the sums of that gradient down its columns, in a pass of its own
that reads a strip of columns down all the rows at a time (at 2048 x 4096 on 2 Zen 4 cores:
2.5, 3.9 and 3.9 ms, in a profile of a gpt-4 step). The kernel reads a row once per pass (the
forward's second read comes from the cache) and adds each row of the gradient to its thread's
column sums as it writes it; ``reuse_column_sums`` then gives the bias gradient from those sums.
A compiled head and loss, forward and backward with the same oneDNN matmuls, took 0.90x and
0.93x the time with the kernel at 2048 x 256 x 4096 (71.1 vs 78.9 ms, 75.6 vs 81.3 ms) and 0.91x
at 1024 x 128 x 32000, in two runs of ``benchmarks/cpu_kernels.py``.

Operators: ``accrewrite::cross_entropy`` (the loss and each row's log-sum-exp) and
``accrewrite::cross_entropy_backward`` (the gradient and its column sums), with fake
implementations for inductor and joined by autograd for the joint graph the pattern is traced
to, as the attention's (``attention.py``).
"""

import functools
import operator

import torch
from torch import Tensor

from accrewrite.runtime.compiler.core.custom_ops import define
from accrewrite.runtime.compiler.core.graph_insert import call
from accrewrite.runtime.compiler.core.registry import Cost, Implementation, never, register
from accrewrite.runtime.compiler.cpu import cpu_kernels

_aten = torch.ops.aten


@functools.cache
def unavailable() -> str | None:
    """Why the kernel cannot run in this process, or None; asked once."""

    def trial():
        logits, target = torch.randn(3, 5), torch.tensor([0, 4, -100])
        _, lse = cross_entropy(logits, target, -100)
        cross_entropy_backward(torch.ones(()), logits, target, lse, -100)

    return cpu_kernels.why_unavailable("cross-entropy", trial)


def _check(logits: Tensor, target: Tensor) -> None:
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy takes logits (rows, classes) and target (rows,); got "
            f"{list(logits.shape)} and {list(target.shape)}"
        )
    if logits.dtype != torch.float32 or target.dtype != torch.int64:
        raise ValueError(
            f"cross_entropy takes float32 logits and int64 targets; got {logits.dtype} and "
            f"{target.dtype}"
        )
    if logits.device.type != "cpu" or target.device.type != "cpu":
        raise ValueError("cross_entropy takes tensors on the CPU")


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """``F.cross_entropy(logits, target, ignore_index=ignore_index)`` for float32 ``logits``
    (rows, classes) and int64 ``target`` (rows,) on the CPU: the mean over the rows whose
    target is not ``ignore_index``; and each row's log-sum-exp, which the backward takes."""
    return _forward_op(logits, target, ignore_index)


def cross_entropy_backward(grad, logits, target, lse, ignore_index) -> tuple[Tensor, Tensor]:
    """The gradient of :func:`cross_entropy`'s logits for ``grad``, the loss's gradient, and
    that gradient's sums over the rows."""
    return _backward_op(grad, logits, target, lse, ignore_index)


def _forward(logits, target, ignore_index):
    _check(logits, target)
    logits, target = cpu_kernels.contiguous_rows(logits), target.contiguous()
    rows, classes = logits.shape
    loss, lse = logits.new_empty(()), logits.new_empty(rows)
    cpu_kernels.library().accrewrite_cross_entropy_forward(
        logits, target, loss, lse, rows, classes, logits.stride(0), ignore_index,
        torch.get_num_threads(),
    )
    return loss, lse


def _backward(grad, logits, target, lse, ignore_index):
    _check(logits, target)
    if grad.shape != () or lse.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy_backward takes a loss gradient of shape () and lse (rows,); got "
            f"{list(grad.shape)} and {list(lse.shape)}"
        )
    logits, target = cpu_kernels.contiguous_rows(logits), target.contiguous()
    rows, classes = logits.shape
    threads = torch.get_num_threads()
    grad_logits, column_sum = logits.new_empty(rows, classes), logits.new_empty(classes)
    partial = logits.new_empty(threads, classes)  # each thread's column sums
    cpu_kernels.library().accrewrite_cross_entropy_backward(
        grad.float().contiguous(), logits, target, lse.contiguous(), grad_logits, column_sum,
        partial, rows, classes, logits.stride(0), ignore_index, threads,
    )
    return grad_logits, column_sum


def _setup_context(ctx, inputs, output):
    logits, target, ctx.ignore_index = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.mark_non_differentiable(output[1])


def _gradients(ctx, grad, _grad_lse):
    grad_logits, _ = cross_entropy_backward(grad, *ctx.saved_tensors, ctx.ignore_index)
    return grad_logits, None, None


_backward_op = define(
    "cross_entropy_backward(Tensor grad, Tensor logits, Tensor target, Tensor lse, "
    "int ignore_index) -> (Tensor, Tensor)",
    {"CPU": _backward},
    lambda grad, logits, target, lse, ignore_index: (
        logits.new_empty(logits.shape), logits.new_empty(logits.shape[1:])
    ),
)
_forward_op = define(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)",
    {"CPU": _forward},
    lambda logits, target, ignore_index: (logits.new_empty(()), logits.new_empty(logits.shape[:1])),
    backward=_gradients,
    setup_context=_setup_context,
)

_BACKWARD = _backward_op.default
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


def reuse_column_sums(graph: torch.fx.Graph) -> None:
    """Replace each sum of a ``cross_entropy_backward`` gradient over all its rows (the bias
    gradient of the linear layer that made the logits, seen through views) by the column sums
    the op computed."""
    for backward in graph.find_nodes(op="call_function", target=_BACKWARD):
        grad_logits = [u for u in backward.users if u.target is operator.getitem and u.args[1] == 0]
        classes = backward.meta["val"][1].shape[0]
        for total in [s for g in grad_logits for s in _row_sums(g, classes)]:
            with graph.inserting_after(backward):
                column_sum = call(graph, operator.getitem, backward, 1)
            with graph.inserting_before(total):
                view = call(graph, _aten.view.default, column_sum, list(total.meta["val"].shape))
            total.replace_all_uses_with(view)
            graph.erase_node(total)


def _row_sums(node: torch.fx.Node, classes: int) -> list[torch.fx.Node]:
    """The sums of ``node`` (rows, classes) over everything but its classes, found through
    views that keep the classes as the last dimension."""
    found = []
    ndim = node.meta["val"].dim()
    for user in node.users:
        value = user.meta.get("val")
        if value is None or value.shape[-1:] != (classes,):
            continue
        if user.target in _VIEWS:
            found += _row_sums(user, classes)
        elif (
            user.target is _aten.sum.dim_IntList
            and sorted(d % ndim for d in user.args[1]) == list(range(ndim - 1))
            and user.kwargs.get("dtype") is None
        ):
            found.append(user)
    return found


# Measured on rows of 4096 and 32000 classes, where inductor's code reads each row more often than
# the kernel does; a classifier's few classes stay inductor's.
_MIN_CLASSES = 1024


def _cost(args) -> Cost:
    classes = args["logits"].shape[-1]
    if classes < _MIN_CLASSES:
        return never(f"{classes} classes, under the {_MIN_CLASSES} it is measured at")
    return Cost(0.9, "accrewrite's C++ kernel: fewer passes over the logits than inductor's")


def _unsupported(args) -> str | None:
    logits = args["logits"]
    if logits.dim() != 2:
        return f"logits {list(logits.shape)} are not (rows, classes)"
    if not isinstance(logits.shape[1], int):
        return f"the number of classes ({logits.shape[1]}) is symbolic"
    return unavailable()


def _kernel(logits, target):
    return cross_entropy(logits, target, -100)[0]


register(Implementation(
    "cross_entropy", "cpp", ("cpu",), (torch.float32,), _cost, kernel=_kernel,
    unsupported=_unsupported, ours=True,
    finish=reuse_column_sums,  # the bias gradient of the layer before: the op's column sums
))
