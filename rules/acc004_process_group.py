import libcst as cst

from accrewrite.nodes import string_value
from accrewrite.rule import Example, Rule
from accrewrite.rules.acc002_device_placement import _with_commas

_INIT = {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
# init_process_group's parameters in order, for positional arguments.
_PARAMETERS = ("backend", "init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options", "device_id")


class ProcessGroup(Rule):
    """Create the process group on the target's backend.

    TorchAcc's migration guide, step 3: `dist.init_process_group` takes the target's backend, and its init
    method where the target has one:

    - `runtime`: the backend accrewrite.runtime picks for the machine (`xm.dist_backend()`:
      nccl with CUDA, gloo without); the init method, rank and world size stay as they are, so
      torchrun (env://) and `mp.spawn` scripts (`init_method=args.dist_url, world_size=...,
      rank=...`) run unchanged;
    - `torchacc`: `backend='xla'` plus `import torchacc.torch_xla.distributed.xla_backend`
      (which registers it); `init_method='env://'` is added where the call names none, and a
      script's own init method (`tcp://`) with its rank and world size is kept;
    - `torch_xla`: `backend='xla', init_method='xla://'` plus
      `import torch_xla.distributed.xla_backend`. The `xla://` rendezvous takes rank and
      world size from the PJRT runtime and ignores any passed, so `rank=`/`world_size=` are
      dropped, with a diagnostic naming where the script reads them now.

    Any backend expression is replaced (`'nccl'`, `args.dist_backend`,
    `'nccl' if cuda else 'gloo'`): the target decides. `timeout` and the other arguments are
    kept; `device_id=` (which binds the group to a CUDA device) is dropped on every target,
    which chooses the device itself. `destroy_process_group` stays as it is.
    """

    code = "ACC004"
    name = "process-group"
    summary = "dist.init_process_group(...) -> the target's backend and init method, plus the backend import"
    concepts = ("dist_backend",)
    triggers = frozenset({"init_process_group"})
    examples = (
        Example(
            before="""
            import torch.distributed as dist

            dist.init_process_group(backend="nccl", init_method="env://")
            """,
            after="""
            import torch.distributed as dist
            import accrewrite.runtime.xla_model as xm

            dist.init_process_group(backend=xm.dist_backend(), init_method="env://")
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch.distributed as dist

            dist.init_process_group(backend="nccl")
            """,
            after="""
            import torch.distributed as dist
            import torchacc.torch_xla.distributed.xla_backend

            dist.init_process_group(backend="xla", init_method="env://")
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch.distributed as dist

            def main_worker(gpu, ngpus_per_node, args):
                args.rank = args.rank * ngpus_per_node + gpu
                dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                        world_size=args.world_size, rank=args.rank)
            """,
            after="""
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            def main_worker(gpu, ngpus_per_node, args):
                args.rank = args.rank * ngpus_per_node + gpu
                dist.init_process_group(backend='xla', init_method='xla://')
            """,
        ),
    )

    def leave_Call(self, original_node, updated_node):
        if self.ctx.facts.qualname(original_node.func) not in _INIT:
            return updated_node
        if any(arg.star for arg in original_node.args):
            self.ctx.diagnose(
                original_node,
                "init_process_group(*args/**kwargs): its backend cannot be told",
                "Pass the target's backend by hand (see `accrewrite explain ACC004`).",
                code="ACC105",
            )
            return updated_node
        ctx = self.ctx
        backend = ctx.expr("dist_backend")
        init_method = ctx.concept("dist_init_method") if ctx.target.has("dist_init_method") else None
        drops_ranks = ctx.target.has("dist_assigned_rank")
        args: list[cst.Arg] = []
        changes: list[str] = []
        named: set[str] = set()
        dropped: list[str] = []
        skipped = False
        quoting: cst.BaseExpression | None = None  # a string literal whose quotes new ones follow
        for position, (original, arg) in enumerate(zip(original_node.args, updated_node.args)):
            name = arg.keyword.value if arg.keyword is not None else _PARAMETERS[position]
            named.add(name)
            if isinstance(original.value, cst.SimpleString) and quoting is None:
                quoting = original.value
            if name == "backend":
                if not _same(ctx.code(original.value), ctx.code(backend)):
                    arg = arg.with_changes(value=_quoted_like(original.value, backend))
                    changes.append(f"backend {ctx.code(original.value)} -> {ctx.code(backend)}")
            elif name == "init_method" and init_method is not None and not init_method.keep:
                wanted = ctx.expr("dist_init_method")
                if not _same(ctx.code(original.value), ctx.code(wanted)):
                    arg = arg.with_changes(value=_quoted_like(original.value, wanted))
                    changes.append(f"init_method {ctx.code(original.value)} -> {ctx.code(wanted)}")
            elif name in ("rank", "world_size") and drops_ranks:
                dropped.append(name)
                skipped = True
                continue
            elif name == "device_id":
                changes.append("dropped device_id= (a CUDA device; the target chooses the device)")
                skipped = True
                continue
            if arg.keyword is None and skipped:
                # A positional argument after a dropped one must name its parameter.
                arg = arg.with_changes(keyword=cst.Name(name), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
            args.append(arg)
        if "backend" not in named:
            args.insert(0, _keyword("backend", _quoted_like(quoting, backend)))
            changes.append(f"backend={ctx.code(backend)}")
        if "init_method" not in named and init_method is not None:
            wanted = ctx.expr("dist_init_method")
            args.insert(1, _keyword("init_method", _quoted_like(quoting, wanted)))
            changes.append(f"init_method={ctx.code(wanted)}")
        if dropped:
            rank = ctx.concept("dist_assigned_rank").render_expr()
            size = ctx.concept("dist_assigned_world_size").render_expr()
            ctx.diagnose(
                original_node,
                f"dropped {' and '.join(dropped)} from init_process_group",
                "This target's init method assigns them from its runtime and ignores values passed; read "
                f"them with {rank} and {size} (or dist.get_rank()/dist.get_world_size() after this call), "
                "and launch with torchrun or the target's launcher rather than one process per CUDA device.",
            )
            changes.append(f"dropped {'/'.join(dropped)} (assigned by the init method)")
        if not changes:
            return updated_node
        ctx.fix(original_node, "init_process_group on the target: " + "; ".join(changes))
        return updated_node.with_changes(args=_with_commas(args))


def _same(code: str, wanted: str) -> bool:
    """Whether two expressions are the same code, or string literals of the same value."""
    if code == wanted:
        return True
    try:
        left, right = cst.parse_expression(code), cst.parse_expression(wanted)
    except cst.ParserSyntaxError:
        return False
    return string_value(left) is not None and string_value(left) == string_value(right)


def _quoted_like(original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` in the quotes of the string literal it replaces (the file's quoting is kept)."""
    if isinstance(original, cst.SimpleString) and isinstance(new, cst.SimpleString):
        quote, value = original.quote, new.evaluated_value
        if quote in ('"', "'") and quote not in value and "\\" not in value:
            return new.with_changes(value=f"{quote}{value}{quote}")
    return new


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
