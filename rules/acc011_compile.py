import libcst as cst

from accrewrite.analysis import placed_model
from accrewrite.rule import Example, Rule


class Compile(Rule):
    """Pass the model through the target's graph compiler once it is on its device.

    accrewrite.runtime compiles through `accrewrite.runtime.compile` (graph capture on
    torch.compile, training-graph passes, kernel selection, regional compilation of repeated
    blocks). The XLA targets compile every step on their device already, so they have no such
    concept and the rule does nothing there.

    Opt-in: compilation trades a cold start (tens of seconds on a large model) for faster
    steps, and changes what a debugger or profiler sees; select ACC011 to use it.

    The compile call goes right after the statement that places the model (`model =
    model.to(device)`, `model.to(device)`, `model = Net().cuda()`), once per model.
    """

    code = "ACC011"
    name = "compile"
    summary = "target runtime: the model goes through accrewrite.runtime.compile after placement"
    concepts = ("compile",)
    opt_in = True
    triggers = frozenset({"to", "cuda"})
    examples = (
        Example(
            before="""
            import torch

            model = GPT(config)
            model.to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = GPT(config)
            model.to(device)
            model = accrt.compile(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        self._compiled: set[str] = set()

    def applies(self) -> bool:
        return self.ctx.target.has("compile") and bool(self.ctx.facts.file.models)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        model = placed_model(node, self.ctx.facts.file.models)
        if model is None or model in self._compiled:
            return
        self._compiled.add(model)
        following = self.ctx.facts.next_statement.get(node)
        if following is not None and ".compile(" in self.ctx.code(following):
            return  # compiled already
        self.ctx.insert_after(node, self.ctx.statements("compile", model=model))
        self.ctx.fix(node, f"{model} is compiled by the target's graph compiler after placement")
