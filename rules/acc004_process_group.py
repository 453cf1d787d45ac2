import libcst as cst

from accrewrite.nodes import call_arg, dotted, string_value, walk
from accrewrite.rule import Example, Rule
from accrewrite.toolbox import quoted_like, with_commas

_INIT = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})
_BACKEND_FOR_DEVICE = frozenset({"torch.distributed.get_default_backend_for_device",
                       "torch.distributed.distributed_c10d.get_default_backend_for_device"})
# init_process_group's parameters in order, for positional arguments.
_PARAMETERS = ("backend", "init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options", "device_id")
_SPAWN = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"})
# torch.multiprocessing.spawn's parameters in order.
_SPAWN_PARAMETERS = ("fn", "args", "nprocs", "join", "daemon", "start_method")


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
    `dist.get_default_backend_for_device(device)` (PyTorch's examples pick the backend of the
    accelerator so) becomes the target's backend too: torch_xla registers none for its device.

    The processes of PyTorch's DDP tutorial come from `mp.spawn(fn, args=(world_size,),
    nprocs=world_size)`, which calls `fn(index, *args)` in each. It becomes the target's
    launcher:

    - `runtime`: `xmp.spawn(...)` with the same arguments, which also tells each process its
      device (`LOCAL_RANK`, as torchrun does), so that `xm.xla_device()` is its own GPU;
    - `torch_xla`: `torch_xla.launch(fn, args=(...))`, one process per device. It picks the
      number of processes, so `nprocs` goes, and an argument that passed it (`world_size`) is
      read again where the devices are: the launched function starts with `world_size =
      xr.global_runtime_device_count()`. So does the world size it gives `init_process_group`
      from its arguments (`world_size=args.world_size`), which the launching process worked
      out from CUDA's count, 0 where there is no CUDA (VICReg's `args.world_size =
      args.ngpus_per_node`, MoCo's `ngpus_per_node * args.world_size`). Its `xla://`
      rendezvous is the one the group joins (a spawn of torch's would host a second one: the
      address is in use). A spawn it cannot take (`join=False`, `daemon=True`) is left, and
      reported;
    - `torchacc`: unchanged, with the script's own init method, rank and world size.

    Left as it is and reported (ACC004): `init_process_group(*args/**kwargs)`, whose backend
    cannot be told, and a spawn the target's launcher cannot take.
    """

    code = "ACC004"
    name = "process-group"
    summary = "dist.init_process_group(...) -> the target's backend and init method, plus the backend import"
    concepts = ("dist_backend",)
    triggers = frozenset({"init_process_group", "get_default_backend_for_device", "spawn"})
    trigger_nodes = (cst.FunctionDef,)  # a launched function is given its count, whatever its words
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
        Example(
            target="torch_xla",
            before="""
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def demo(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)

            def run(world_size):
                mp.spawn(demo, args=(world_size,), nprocs=world_size, join=True)
            """,
            after="""
            import torch.distributed as dist
            import torch.multiprocessing as mp
            import torch_xla.runtime as xr
            import torch_xla.distributed.xla_backend
            import torch_xla

            def demo(rank, world_size):
                world_size = xr.global_runtime_device_count()
                dist.init_process_group("xla", init_method="xla://")

            def run(world_size):
                torch_xla.launch(demo, args=(world_size,))
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def main_worker(gpu, args):
                dist.init_process_group("nccl", init_method=args.dist_url, world_size=args.world_size, rank=gpu)
                batch_size = args.batch_size // args.world_size

            def main(args):
                args.ngpus_per_node = torch.cuda.device_count()
                args.world_size = args.ngpus_per_node * args.nodes
                mp.spawn(main_worker, (args,), args.ngpus_per_node)
            """,
            after="""
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp
            import torch_xla.runtime as xr
            import torch_xla.distributed.xla_backend
            import torch_xla

            def main_worker(gpu, args):
                args.ngpus_per_node = xr.global_runtime_device_count()
                args.world_size = xr.global_runtime_device_count()
                dist.init_process_group("xla", init_method='xla://')
                batch_size = args.batch_size // args.world_size

            def main(args):
                args.ngpus_per_node = torch.cuda.device_count()
                args.world_size = args.ngpus_per_node * args.nodes
                torch_xla.launch(main_worker, args=(args,))
            """,
        ),
        Example(
            before="""
            import torch.multiprocessing as mp

            mp.spawn(demo, (world_size,), world_size)
            """,
            after="""
            import torch.multiprocessing as mp
            import accrewrite.runtime.distributed.xla_multiprocessing as xmp

            xmp.spawn(demo, args=(world_size,), nprocs=world_size)
            """,
        ),
        Example(  # left as it is, and reported
            before="""
            import torch.distributed as dist

            dist.init_process_group(*args)
            """,
            diagnostics=("ACC004:3",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Launched function -> its parameters (or their attributes) that received nprocs, where
        # the target's launcher picks the number of processes itself.
        self._recounted: dict[cst.FunctionDef, list[str]] = {}
        if ctx.target.has("spawn_owns_devices", "spawn", "device_count"):
            for spawn in ctx.facts.spawns():
                if ctx.facts.file.qualname(spawn.call.func) in _SPAWN and self._launchable(spawn.call):
                    for worker in spawn.workers:
                        params = [p.name.value for p in (*worker.params.posonly_params, *worker.params.params)]
                        self._recounted.setdefault(worker, []).extend(
                            params[i] + attributes for i, attributes in spawn.counted if i < len(params))
                        self._recounted[worker].extend(self._world_sizes(worker, params[1:]))

    def _world_sizes(self, worker: cst.FunctionDef, passed: list[str]) -> list[str]:
        """What ``worker`` passes ``init_process_group`` as its world size, where the launching
        process gave it (``world_size=args.world_size``, ``args`` a parameter): the launching
        process worked it out from its own device count (VICReg's ``args.world_size =
        args.ngpus_per_node``, MoCo's ``ngpus_per_node * args.world_size``), CUDA's. One
        process runs per device of the job, so it is the target's device count."""
        found = []

        def enter(node):
            if isinstance(node, cst.Call) and self.ctx.facts.file.qualname(node.func) in _INIT:
                size = call_arg(node, _PARAMETERS.index("world_size"), "world_size")
                name = dotted(size.value) if size is not None else None
                if name is not None and name.partition(".")[0] in passed:
                    found.append(name)
            return not isinstance(node, (cst.FunctionDef, cst.ClassDef)) or node is worker

        walk(worker, enter)
        return found

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """A launched function reads the device count where the devices are: its parameter that
        received ``nprocs`` from the launching process."""
        names = list(dict.fromkeys(self._recounted.get(node, ())))
        body = list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else []
        start = 1 if body and _is_docstring(body[0]) else 0
        if not names or len(body) <= start:
            return
        count = self.ctx.expr("device_count")
        lines = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.parse_expression(name))], count)])
                 for name in names]
        if all(self.ctx.code(line).strip() in self.ctx.code(statement) for line, statement in zip(lines, body[start:])):
            return  # migrated already
        self.ctx.insert_before(body[start], lines)
        self.ctx.fix(node, f"{', '.join(names)}: the target's device count, read in the launched process "
                           "(its launcher picks the number of processes)")

    def leave_Call(self, original_node, updated_node):
        callee = self.ctx.facts.file.qualname(original_node.func)
        if callee in _SPAWN:
            return self._spawn(original_node, updated_node)
        if callee in _BACKEND_FOR_DEVICE:
            self.ctx.fix(original_node, f"{callee.rpartition('.')[2]}() -> the target's backend")
            return self.ctx.expr("dist_backend")
        if callee not in _INIT:
            return updated_node
        if any(arg.star for arg in original_node.args):
            self.ctx.diagnose(
                original_node,
                "init_process_group(*args/**kwargs): its backend cannot be told; left as it is",
                "Pass the target's backend by hand (see `accrewrite explain ACC004`).",
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
                    arg = arg.with_changes(value=quoted_like(original.value, backend))
                    changes.append(f"backend {ctx.code(original.value)} -> {ctx.code(backend)}")
            elif name == "init_method" and init_method is not None and not init_method.keep:
                wanted = ctx.expr("dist_init_method")
                if not _same(ctx.code(original.value), ctx.code(wanted)):
                    arg = arg.with_changes(value=quoted_like(original.value, wanted))
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
            args.insert(0, _keyword("backend", quoted_like(quoting, backend)))
            changes.append(f"backend={ctx.code(backend)}")
        if "init_method" not in named and init_method is not None:
            wanted = ctx.expr("dist_init_method")
            args.insert(1, _keyword("init_method", quoted_like(quoting, wanted)))
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
        return updated_node.with_changes(args=with_commas(args))


    # Spawning ------------------------------------------------------------------------------

    def _launchable(self, call: cst.Call) -> bool:
        """Whether a launcher that owns the devices can take this spawn: it always joins, never
        makes daemons, and takes its arguments as a tuple."""
        if any(arg.star for arg in call.args):
            return False
        for position, arg in enumerate(call.args):
            name = arg.keyword.value if arg.keyword is not None else _SPAWN_PARAMETERS[position]
            value = self.ctx.code(arg.value)
            if (name, value) not in (("join", "True"), ("daemon", "False")) and name in ("join", "daemon"):
                return False
        return True

    def _spawn(self, original_node, updated_node):
        ctx = self.ctx
        if not ctx.target.has("spawn"):
            return updated_node
        owns = ctx.target.has("spawn_owns_devices")
        if owns and not self._launchable(original_node):
            launcher = ctx.concept("spawn").render_expr()
            ctx.diagnose(
                original_node, f"this spawn cannot become {launcher}(...); left as it is",
                f"{launcher} starts one process per device and waits for them (no join=False, no daemons). "
                "Processes started otherwise cannot join the target's process group (its init method hosts one "
                "rendezvous for the processes it launched): launch them with it.",
            )
            return updated_node
        args = []
        for position, (original, arg) in enumerate(zip(original_node.args, updated_node.args)):
            name = original.keyword.value if original.keyword is not None else _SPAWN_PARAMETERS[position]
            if owns and name in ("nprocs", "join", "daemon"):
                continue  # the launcher's own: every device, joined
            if original.keyword is None and name != "fn":
                arg = arg.with_changes(keyword=cst.Name(name), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
            args.append(arg)
        spawn = next((s for s in ctx.facts.spawns() if s.call is original_node), None)
        if owns and spawn is not None and spawn.counted and not spawn.workers:
            ctx.diagnose(
                original_node, "the launched function is not in this file: its process count is CUDA's",
                "The target's launcher picks the number of processes; the argument that passed nprocs still "
                f"carries this process's count. Read {ctx.concept('device_count').render_expr()} at the start of "
                "the launched function instead.",
            )
        ctx.fix(original_node, "torch.multiprocessing.spawn -> the target's launcher" +
                (" (one process per device)" if owns else " (each process told its device)"))
        return updated_node.with_changes(func=ctx.expr("spawn"), args=with_commas(args))


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _same(code: str, wanted: str) -> bool:
    """Whether two expressions are the same code, or string literals of the same value."""
    if code == wanted:
        return True
    try:
        left, right = cst.parse_expression(code), cst.parse_expression(wanted)
    except cst.ParserSyntaxError:
        return False
    return string_value(left) is not None and string_value(left) == string_value(right)


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
