import libcst as cst

from accrewrite.analysis import call_arg
from accrewrite.rule import Example, Rule

_CUDA_SEEDS = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all")


class RngSeed(Rule):
    """Seed the target's generator instead of CUDA's.

    Seed 001, step 1: a fixed seed on every worker gives every worker the same initial weights
    (an alternative to broadcasting them). ``torch.manual_seed(s)`` becomes the target's seed call
    (``xm.set_rng_state(s)``); where the target's call seeds only the device generator (torch_xla)
    torch's own seed is kept before it. ``torch.cuda.manual_seed[_all](s)`` is dropped when the
    file also calls ``torch.manual_seed``, and otherwise becomes the target's seed call.

    Only a seed call standing alone as a statement is rewritten: one used as a value (its
    generator) is left as it is.
    """

    code = "ACC001"
    name = "rng-seed"
    summary = "torch.manual_seed / torch.cuda.manual_seed[_all] -> the target's seed call"
    concepts = ("seed",)
    triggers = frozenset({"manual_seed", "manual_seed_all"})
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
    )

    def _seed_call(self, line: cst.SimpleStatementLine) -> tuple[str, cst.Arg] | None:
        """(qualified name, seed argument) when the line is exactly one seed call."""
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
            return None
        call = line.body[0].value
        if not isinstance(call, cst.Call):
            return None
        callee = self.ctx.facts.qualname(call.func)
        if callee != "torch.manual_seed" and callee not in _CUDA_SEEDS:
            return None
        seed = call_arg(call, 0, "seed")
        return (callee, seed) if seed is not None else None

    def leave_SimpleStatementLine(self, original_node, updated_node):
        found = self._seed_call(original_node)
        if found is None:
            return updated_node
        callee, seed_arg = found
        seed = self.ctx.code(seed_arg.value)
        concept = self.ctx.concept("seed")
        if callee in _CUDA_SEEDS and self.ctx.facts.torch_seeds:
            self.ctx.fix(original_node, f"removed {callee}(): the target's seed call covers it")
            return cst.RemoveFromParent()
        replacement = self.ctx.statements("seed", seed=seed)
        if concept.keep:
            if callee == "torch.manual_seed":
                if self._already_seeded(original_node, replacement):
                    return updated_node
                kept = updated_node
            else:
                kept = cst.parse_statement(f"torch.manual_seed({seed})", config=self.ctx.module.config_for_parsing)
            replacement = [kept, *replacement]
        self.ctx.fix(original_node, f"{callee}({seed}) -> the target's seed call")
        # The first statement keeps the original line's comments and blank lines.
        replacement[0] = replacement[0].with_changes(
            leading_lines=updated_node.leading_lines, trailing_whitespace=updated_node.trailing_whitespace
        )
        return cst.FlattenSentinel(replacement)

    def _already_seeded(self, line: cst.SimpleStatementLine, replacement) -> bool:
        following = self.ctx.facts.next_statement.get(line)
        return following is not None and self.ctx.code(following).strip() == self.ctx.code(replacement[-1]).strip()
