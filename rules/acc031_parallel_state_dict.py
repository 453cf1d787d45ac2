import re

import libcst as cst

from accrewrite.nodes import call_arg, dotted, walk
from accrewrite.rule import Example, Rule
from accrewrite.toolbox import wrapped_models

# An `if` that runs on one rank only.
_ONE_RANK = re.compile(r"rank|master|main_process|is_main")


class ParallelStateDict(Rule):
    """`migrate --parallel`: saving the model's weights keeps giving a whole state dict.

    Under FSDP2 or tensor parallelism `model.state_dict()` holds each rank's shards (DTensors),
    which a plain `torch.load` + `load_state_dict` elsewhere cannot read. So
    `torch.save(model.state_dict(), path)` (or `model.module.state_dict()`) becomes
    `accrt.export_full_state_dict(path, model)`: the unsharded state dict, gathered from every
    rank and written by rank 0, which a plain model on one process loads.

    The export is collective: every rank must call it. A save under an `if` on the rank
    (`if rank == 0:`) is reported instead of changed: move it out of the `if`. A state dict
    saved inside a larger object (a dict with the optimizer's state) is reported too: a
    resumable checkpoint is `accrt.save_checkpoint(path, model, optimizer, **extra)` (sharded,
    resharding, atomic), read back with `accrt.load_checkpoint`; so is any other use of the
    model's `state_dict()`, which now holds this rank's shards.

    Under pipeline parallel (`pp` in the kind) the save is reported and left: each rank holds
    one stage, and the export writes rank 0's.
    """

    code = "ACC031"
    name = "parallel-state-dict"
    summary = "--parallel: torch.save(model.state_dict(), p) -> accrt.export_full_state_dict(p, model)"
    opt_in = True
    parallel = True
    concepts = ("full_state_export",)
    triggers = frozenset({"state_dict"})
    examples = (
        Example(
            before="""
            import torch

            model = GPT(config)
            model = torch.nn.parallel.DistributedDataParallel(model)
            train(model)
            torch.save(model.module.state_dict(), "model.pt")
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = GPT(config)
            model = torch.nn.parallel.DistributedDataParallel(model)
            train(model)
            accrt.export_full_state_dict("model.pt", model)
            """,
        ),
        Example(
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(GPT(config))
            if rank == 0:
                torch.save(model.module.state_dict(), "model.pt")
            torch.save({"model": model.state_dict(), "step": step}, "ckpt.pt")
            """,
            diagnostics=("ACC031:5", "ACC031:6"),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._models: set[str] = set()
        self._handled: set[cst.CSTNode] = set()  # state_dict calls inside a torch.save

    def applies(self) -> bool:
        self._models = self.ctx.facts.file.models | wrapped_models(self.ctx.facts, self.ctx.module)
        return bool(self._models)

    def _saved_model(self, node: cst.CSTNode) -> str | None:
        """``M`` when ``node`` is ``M.state_dict()`` or ``M.module.state_dict()`` of a model."""
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "state_dict" and not node.args):
            return None
        owner = node.func.value
        if isinstance(owner, cst.Attribute) and owner.attr.value == "module":
            owner = owner.value
        name = dotted(owner)
        return name if name in self._models else None

    def _torch_save(self, statement) -> tuple[cst.Arg, cst.Arg] | None:
        """``(object, path)`` when ``statement`` is ``torch.save(object, path)``."""
        if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Expr):
            return None
        call = statement.body[0].value
        if not isinstance(call, cst.Call) or self.ctx.facts.file.qualname(call.func) != "torch.save":
            return None
        saved, path = call_arg(call, 0, "obj"), call_arg(call, 1, "f")
        return None if saved is None or path is None else (saved, path)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        saving = self._torch_save(node)
        if saving is not None:  # reported or changed as a whole when left
            self._handled.update(_calls(saving[0].value))

    def visit_Call(self, node: cst.Call) -> None:
        model = self._saved_model(node)
        if model is not None and node not in self._handled:
            self.ctx.diagnose(
                node, f"{self.ctx.code(node)} holds this rank's shards under --parallel",
                f"A plain load_state_dict elsewhere cannot read it. For weights read elsewhere, "
                f"accrt.export_full_state_dict(path, {model}) on every rank; for a checkpoint to resume "
                f"from, accrt.save_checkpoint(path, {model}, optimizer, **extra) and accrt.load_checkpoint.",
            )

    def leave_SimpleStatementLine(self, original_node, updated_node):
        saving = self._torch_save(original_node)
        if saving is None:
            return updated_node
        saved, path = saving
        model = self._saved_model(saved.value)
        if model is None:
            if any(self._saved_model(call) for call in _calls(saved.value)):
                self.ctx.diagnose(
                    original_node, "a sharded model's state dict saved inside another object",
                    "Under --parallel each rank holds shards. For a checkpoint to resume from, call "
                    "accrt.save_checkpoint(path, model, optimizer, **extra) on every rank and "
                    "accrt.load_checkpoint to read it; for weights read elsewhere, "
                    "accrt.export_full_state_dict(path, model).",
                )
            return updated_node
        one_rank = [s for s in self.ctx.open_statements if isinstance(s, cst.If)
                    and _ONE_RANK.search(self.ctx.code(s.test))]
        if one_rank:
            self.ctx.diagnose(
                original_node, "the full-state export must run on every rank, not under this `if`",
                f"Replace this save by accrt.export_full_state_dict({self.ctx.code(path.value)}, {model}) "
                "outside the `if`: it gathers the shards from every rank and writes from rank 0.",
            )
            return updated_node
        if "pp" in (self.ctx.parallel or "").split(","):
            self.ctx.diagnose(
                original_node, "under pipeline parallel this rank's model is one stage, not the whole model",
                "Each rank holds one stage's parameters (named as in the whole model), and "
                "accrt.export_full_state_dict writes rank 0's only. Save every stage: each rank's "
                f"{model}.state_dict() to its own file, or gathered to one rank (dist.gather_object) and merged.",
            )
            return updated_node
        self.ctx.fix(original_node, "state_dict save -> export_full_state_dict: unsharded, from rank 0")
        [statement] = self.ctx.statements("full_state_export", path=self.ctx.code(path.value), model=model)
        return statement.with_changes(leading_lines=updated_node.leading_lines)


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found = []

    def enter(child: cst.CSTNode) -> bool:
        if isinstance(child, cst.Call):
            found.append(child)
        return True

    walk(node, enter)
    return found
