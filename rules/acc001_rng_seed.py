import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES
from accrewrite.nodes import call_arg
from accrewrite.rule import Example, Rule
from accrewrite.targets import spelled_callees
from accrewrite.toolbox import ddp_kept

_CUDA_SEEDS = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all")
_SEEDS = frozenset({*_CUDA_SEEDS, *spelled_callees("seed")})
_INIT = "torch.distributed.init_process_group"
# The seed given to a script that had none (any constant does: what matters is that every
# worker uses the same one).
_DEFAULT_SEED = "0"


class RngSeed(Rule):
    """Seed the target's generator instead of CUDA's.

    TorchAcc's migration guide, step 1: a fixed seed on every worker gives every worker the same initial weights
    (an alternative to broadcasting them). `torch.manual_seed(s)` becomes the target's seed call
    (`xm.set_rng_state(s)`); where the target's call seeds only the device generator (torch_xla)
    torch's own seed is kept before it. `torch.cuda.manual_seed[_all](s)` is dropped when the
    file also calls `torch.manual_seed`, and otherwise becomes the target's seed call.

    Only a seed call standing alone as a statement is rewritten: one used as a value (its
    generator) is left as it is, and so is a seed in the process that launches the workers
    where the target's launcher owns the devices (torch_xla's refuses to start once that process
    has used its runtime; the processes it starts seed themselves), and so is a seed in a
    DataLoader's `worker_init_fn` (timm's `_worker_init`): a loader worker seeds its host
    generator for its augmentations, and never uses the device.

    A script that wraps its model in DistributedDataParallel but never seeds relied on DDP
    broadcasting rank 0's weights. ACC005 removes the wrapper and, where the target can,
    broadcasts them itself; elsewhere the target's seed call (with seed 0) goes right after
    `dist.init_process_group(...)`, as in the BERT example of TorchAcc's migration guide. Where
    ACC005 keeps the wrapper (and says why), it still broadcasts them: nothing is added.
    """

    code = "ACC001"
    name = "rng-seed"
    summary = "torch.manual_seed / torch.cuda.manual_seed[_all] -> the target's seed call"
    concepts = ("seed",)
    triggers = frozenset({"manual_seed", "manual_seed_all", "init_process_group"})
    examples = (
        Example(
            before="""
            import torch

            torch.manual_seed(1337)
            torch.cuda.manual_seed_all(1337)
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            xm.set_rng_state(1337)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def setup(seed):
                torch.cuda.manual_seed(seed)
            """,
            after="""
            import torch
            import torch_xla.core.xla_model as xm

            def setup(seed):
                torch.manual_seed(seed)
                xm.set_rng_state(seed)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            dist.init_process_group(backend="nccl")
            model = DDP(Net().cuda())
            """,
            after="""
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            import torchacc.torch_xla.core.xla_model as xm

            dist.init_process_group(backend="nccl")
            xm.set_rng_state(0)
            model = DDP(Net().cuda())
            """,
        ),
        Example(  # a loader worker's seed stays torch's: the worker has no device
            target="torch_xla",
            before="""
            from functools import partial
            import torch

            def _worker_init(worker_id, seed):
                torch.manual_seed(seed + worker_id)

            torch.manual_seed(0)
            loader = torch.utils.data.DataLoader(data, num_workers=2, worker_init_fn=partial(_worker_init, seed=1))
            """,
            after="""
            from functools import partial
            import torch
            import torch_xla.core.xla_model as xm

            def _worker_init(worker_id, seed):
                torch.manual_seed(seed + worker_id)

            torch.manual_seed(0)
            xm.set_rng_state(0)
            loader = torch.utils.data.DataLoader(data, num_workers=2, worker_init_fn=partial(_worker_init, seed=1))
            """,
        ),
        Example(  # seeded: migrated again, the target's seed call counts as the seed
            target="torchacc",
            before="""
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            if args.seed is not None:
                torch.manual_seed(args.seed)
            dist.init_process_group(backend="nccl")
            model = DDP(Net().cuda())
            """,
            after="""
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            import torchacc.torch_xla.core.xla_model as xm

            if args.seed is not None:
                xm.set_rng_state(args.seed)
            dist.init_process_group(backend="nccl")
            model = DDP(Net().cuda())
            """,
            with_rules=("ACC006",),
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self._seeded_after_init = False
        self._inits: frozenset[str] | None = None  # ``_worker_inits``

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        facts = self.ctx.facts
        if facts.torch_seeds or facts.file.called & _SEEDS or not facts.file.called & WRAPPER_NAMES:
            return  # seeded (by a target's call too: a migrated file), or nothing to broadcast
        if self.ctx.target.has("broadcast_master_param") or ddp_kept(self.ctx) is not None:
            return  # ACC005 broadcasts rank 0's weights as the wrapper did, or keeps it: no seed is needed
        if self._seeded_after_init or not self._is_init(node):
            return
        self._seeded_after_init = True
        seeds = self._seed_statements(_DEFAULT_SEED, kept=None)
        if self._already_seeded(node, seeds):
            return  # seeded by an earlier migration
        self.ctx.insert_after(node, seeds)
        self.ctx.fix(node, "DistributedDataParallel no longer broadcasts rank 0's weights: every worker is seeded alike")

    def _worker_inits(self) -> frozenset[str]:
        """The file's functions given to a DataLoader as ``worker_init_fn`` (as they are, or
        through ``functools.partial``)."""
        if self._inits is None:
            names = set()
            for call, _ in self.ctx.facts.file.calls:
                given = call_arg(call, 99, "worker_init_fn")
                value = given.value if given is not None else None
                if isinstance(value, cst.Call) and value.args:  # partial(_worker_init, ...)
                    value = value.args[0].value
                if isinstance(value, cst.Name):
                    names.add(value.value)
            self._inits = frozenset(names)
        return self._inits

    def _is_init(self, line: cst.SimpleStatementLine) -> bool:
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
            return False
        call = line.body[0].value
        return isinstance(call, cst.Call) and self.ctx.facts.file.qualname(call.func) == _INIT

    def _seed_statements(self, seed: str, kept) -> list:
        """The target's seed call; where the target keeps torch's own seed, ``kept`` (or a new
        ``torch.manual_seed``) comes first."""
        statements = self.ctx.statements("seed", seed=seed)
        if self.ctx.concept("seed").keep:
            if kept is None:
                kept = cst.parse_statement(f"torch.manual_seed({seed})", config=self.ctx.module.config_for_parsing)
            statements = [kept, *statements]
        return statements

    def _seed_call(self, line: cst.SimpleStatementLine) -> tuple[str, cst.Arg] | None:
        """(qualified name, seed argument) when the line is exactly one seed call."""
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
            return None
        call = line.body[0].value
        if not isinstance(call, cst.Call):
            return None
        callee = self.ctx.facts.file.qualname(call.func)
        if callee != "torch.manual_seed" and callee not in _CUDA_SEEDS:
            return None
        seed = call_arg(call, 0, "seed")
        return (callee, seed) if seed is not None else None

    def leave_SimpleStatementLine(self, original_node, updated_node):
        found = self._seed_call(original_node)
        if found is None:
            return updated_node
        if self.ctx.target.has("spawn_owns_devices") and self.ctx.facts.in_launcher(self.ctx.scopes):
            return updated_node
        if any(getattr(scope, "name", None) and scope.name.value in self._worker_inits() for scope in self.ctx.scopes):
            return updated_node  # a loader worker's process seeds its host generator, and has no device
        callee, seed_arg = found
        seed = self.ctx.code(seed_arg.value)
        concept = self.ctx.concept("seed")
        if callee in _CUDA_SEEDS and self.ctx.facts.torch_seeds:
            self.ctx.fix(original_node, f"removed {callee}(): the target's seed call covers it")
            return cst.RemoveFromParent()
        kept = updated_node if callee == "torch.manual_seed" else None
        replacement = self._seed_statements(seed, kept)
        if concept.keep and kept is not None and self._already_seeded(original_node, replacement):
            return updated_node
        self.ctx.fix(original_node, f"{callee}({seed}) -> the target's seed call")
        # The first statement keeps the original line's comments and blank lines.
        replacement[0] = replacement[0].with_changes(
            leading_lines=updated_node.leading_lines, trailing_whitespace=updated_node.trailing_whitespace
        )
        return cst.FlattenSentinel(replacement)

    def _already_seeded(self, line: cst.SimpleStatementLine, replacement) -> bool:
        """Whether the statement after ``line`` is already the last of ``replacement``."""
        following = self.ctx.facts.next_statement.get(line)
        return following is not None and self.ctx.code(following).strip() == self.ctx.code(replacement[-1]).strip()
