import libcst as cst

from accrewrite.nodes import call_arg, dotted, holds, walk
from accrewrite.rule import Example, Rule
from accrewrite.toolbox import single_assign, wrapped_models_of, wrapped_module, wraps_model
from accrewrite.values import read_chains

_SYNC_FLAG = "require_backward_grad_sync"
_BUILD_AFTER = ("FSDP2 and tensor parallelism replace the model's parameters with DTensors: an optimizer "
                "built before accrt.accelerate updates the old ones and trains nothing. Build it after.")
_SAMPLERS = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})


class ParallelWrap(Rule):
    """`migrate --parallel fsdp|tp|pp|cp` (or a combination, `fsdp,tp,pp`, `fsdp,cp`):
    DistributedDataParallel becomes FSDP2, tensor, pipeline and/or context parallelism through
    `accelerate` (TorchAcc 2.x's accelerate API), for models or sequences that do not fit one
    device.

    - `model = DDP(model, ...)` becomes `model = accrt.accelerate(model,
      config=accrt.parallel_config("fsdp"))` (the kind given to `--parallel`); FSDP2 reduces
      the gradients, so the explicit all-reduce (ACC006) and the unwrapping (ACC005) do not run;
    - an optimizer built from the model before the wrap moves right after the statement that
      wraps (or after the `if` that holds the wrap): FSDP2 and tensor parallelism replace the
      parameters with DTensors, and an optimizer built earlier would update the old ones;
    - `model.module` becomes `model` (accelerate returns the model itself), and DDP's
      gradient-accumulation switch `model.require_backward_grad_sync = flag` becomes FSDP2's
      `model.set_requires_gradient_sync(flag)` (with `fsdp` or `cp` in the kind, which run
      through FSDP2: without them, every rank is a tensor-parallel rank or a stage, no
      gradients are reduced over data-parallel ranks, and the line is left setting an
      attribute nothing reads).

    With `tp`, `pp` or `cp` in the kind, a `DistributedSampler` is reported: it splits the data
    over every rank, where the ranks of a tensor-parallel or context-parallel group, and the
    stages of a pipeline, must read the same batches. The training step of a pipeline is
    ACC035's; the attention that context parallel cannot split is ACC036's.

    `torch.nn.utils.clip_grad_norm_` keeps working: every parameter is a DTensor on one mesh.
    Saving the model's state is ACC031's. Targets without `accelerate` (the XLA ones) get a
    diagnostic naming their own sharding API instead, and nothing changes.

    Left as it is and reported (ACC030): a wrapper whose module cannot be told (`DDP(*args)`).
    """

    code = "ACC030"
    name = "parallel-wrap"
    summary = "--parallel: DDP -> accrt.accelerate(model, config=...) (FSDP2 / tensor / pipeline / context parallel)"
    opt_in = True
    parallel = True
    supersedes = ("ACC005", "ACC006")
    concepts = ("parallel_accelerate",)
    triggers = None  # the optimizer statement that moves names nothing of DDP
    examples = (
        Example(
            before="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = GPT(config).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            model = DDP(model, device_ids=[local_rank])
            raw_model = model.module
            for micro_step in range(accum):
                model.require_backward_grad_sync = micro_step == accum - 1
                loss = model(x)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            """,
            after="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            import accrewrite.runtime as accrt

            model = GPT(config).to(device)
            model = accrt.accelerate(model, config=accrt.parallel_config("fsdp"))
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            raw_model = model
            for micro_step in range(accum):
                model.set_requires_gradient_sync(micro_step == accum - 1)
                loss = model(x)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            """,
        ),
        Example(
            before="""
            import torch

            model = Net().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if distributed:
                model = torch.nn.parallel.DistributedDataParallel(model)
            train(model, optimizer)
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = Net().to(device)
            if distributed:
                model = accrt.accelerate(model, config=accrt.parallel_config("fsdp"))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train(model, optimizer)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
            diagnostics=("ACC030:3",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped: set[str] = set()
        self._moved: dict[cst.CSTNode, cst.CSTNode] = {}  # optimizer statement -> statement it follows

    @property
    def _kind(self) -> str:
        return self.ctx.parallel or "fsdp"

    def applies(self) -> bool:
        wrapped = wrapped_models_of(self.ctx)
        self._wrapped = wrapped or set()
        return wrapped is not None

    # Optimizers built before the wrap --------------------------------------------------------

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._pair_optimizers(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._pair_optimizers(node.body)

    def _pair_optimizers(self, body) -> None:
        """Note each optimizer statement that precedes, in ``body``, the statement that wraps
        (or holds an ``if`` that wraps) the model it was built from: it moves after that one."""
        if not self.ctx.target.has(*self.concepts):
            return
        statements = list(body)
        for i, statement in enumerate(statements):
            assign = single_assign(statement)
            name = dotted(assign.targets[0].target) if assign is not None else None
            if name not in self.ctx.facts.optimizers:
                continue
            models = read_chains(assign.value) & (self.ctx.facts.file.models | self._wrapped)
            for j in range(i + 1, len(statements)):
                if not models & set(self._wrapped_in(statements[j])):
                    continue
                if any(name in read_chains(between) for between in statements[i + 1:j]):
                    # used before the wrap: moving it would break that use
                    self.ctx.diagnose(statement, f"`{name}` is used before the model is wrapped; left in place",
                                      _BUILD_AFTER)
                else:
                    self._moved[statement] = statements[j]
                break

    def _wrapped_in(self, statement: cst.CSTNode) -> list[str]:
        """The models that ``statement`` (or a statement nested in it) wraps in DDP."""
        found = []

        def enter(node: cst.CSTNode) -> bool:
            if isinstance(node, cst.Assign) and wraps_model(self.ctx.facts, node.value):
                module = call_arg(node.value, 0, "module")
                if module is not None:
                    found.append(dotted(module.value))
            return True

        walk(statement, enter)
        return found

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if original_node in self._moved:
            self.ctx.fix(original_node, "optimizer moved after accelerate: it must see the sharded parameters")
            self.ctx.insert_after(self._moved[original_node], [updated_node])
            return cst.RemovalSentinel.REMOVE
        assign = single_assign(original_node)
        if assign is None or not isinstance(assign.targets[0].target, cst.Attribute):
            return updated_node
        flag = assign.targets[0].target
        if flag.attr.value != _SYNC_FLAG or dotted(flag.value) not in self._wrapped:
            return updated_node
        if not {"fsdp", "cp"} & set(self._kind.split(",")):
            # tp and pp alone take every rank: no data-parallel ranks reduce, and the plain
            # attribute the line sets does nothing, where the method FSDP2 alone has would fail
            # (context parallel runs through FSDP2, which sums the parts' gradients)
            return updated_node
        self.ctx.fix(original_node, "require_backward_grad_sync -> set_requires_gradient_sync (FSDP2)")
        [statement] = self.ctx.statements("gradient_sync_switch", model=dotted(flag.value),
                                          value=self.ctx.code(updated_node.body[0].value))
        return statement.with_changes(leading_lines=updated_node.leading_lines)

    # Expressions -----------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        shared_batches = {"tp", "pp", "cp"} & set(self._kind.split(","))
        if shared_batches and self.ctx.facts.file.qualname(node.func) in _SAMPLERS:
            self.ctx.diagnose(
                node, "a sampler over every rank: tensor-parallel, pipeline or context-parallel ranks would read "
                      "different batches",
                "The ranks of one tensor-parallel or context-parallel group, and the stages of one pipeline, "
                "must read the same batches. Pass the loader to "
                "accrt.accelerate(model, loader, config=...) without this sampler (it returns the loader "
                "split over the data-parallel ranks), or build the sampler over the 'dp' and 'fsdp' dims of "
                "model.accelerate_mesh.",
            )
        # On visit: the target's own rules (ACC005) may replace the call before it is left.
        if wraps_model(self.ctx.facts, node) and not self.ctx.target.has(*self.concepts):
            self.ctx.diagnose(
                node,
                "--parallel: this target has no accelerate(); the DDP wrap is left as it is",
                "FSDP2 and DTensor tensor parallelism are accrewrite.runtime's (--target runtime). On "
                "torch_xla, shard with its SPMD API instead: torch_xla.distributed.spmd.mark_sharding, or "
                "FSDPv2 (torch_xla.experimental.spmd_fully_sharded_data_parallel."
                "SpmdFullyShardedDataParallel); TorchAcc 2.x has torchacc.accelerate(model, config=...).",
            )

    def leave_Call(self, original_node, updated_node):
        if not wraps_model(self.ctx.facts, original_node) or not self.ctx.target.has(*self.concepts):
            return updated_node
        module = wrapped_module(self.ctx, original_node, updated_node, "Call accrt.accelerate(model, config=...) by hand.")
        if module is None:
            return updated_node
        for name, built in self.ctx.facts.optimizers.items():
            if not holds(self.ctx.scope or self.ctx.module, built):
                self.ctx.diagnose(original_node, f"`{name}` is built in another function than this wrap",
                                  _BUILD_AFTER)
        self.ctx.fix(original_node, f"DDP -> accelerate ({self._kind}): FSDP2 shards and reduces")
        return self.ctx.expr("parallel_accelerate", model=self.ctx.code(module.value), kind=f'"{self._kind}"')

    def leave_Attribute(self, original_node, updated_node):
        if original_node.attr.value == "module" and dotted(original_node.value) in self._wrapped:
            name = dotted(original_node.value)
            self.ctx.fix(original_node, f"{name}.module -> {name}: accelerate returns the model itself")
            return updated_node.value
        return updated_node

