import libcst as cst

from accrewrite.nodes import call_arg
from accrewrite.rule import Example, Rule


class CompileBackend(Rule):
    """A script's own `torch.compile` compiles for the target's device.

    `torch.compile(model)` (and `model.compile()`) picks inductor, which generates CPU and
    CUDA code and fails on XLA tensors. Where the target compiles through another dynamo backend
    (torch_xla's `openxla`), it is named: `torch.compile(model, backend='openxla')`. A call
    that names a backend already is left as it is, and so is every call on a target whose
    device inductor compiles for (runtime).
    """

    code = "ACC013"
    name = "compile-backend"
    summary = "torch.compile(model) / model.compile() -> the target's dynamo backend (openxla)"
    concepts = ("compile_backend",)
    triggers = frozenset({"compile"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch

            model = GPT(config).to(device)
            if compile:
                model = torch.compile(model)
            """,
            after="""
            import torch

            model = GPT(config).to(device)
            if compile:
                model = torch.compile(model, backend='openxla')
            """,
        ),
    )

    def applies(self) -> bool:
        return self.ctx.target.has("compile_backend")  # inductor compiles for the others' devices

    def leave_Call(self, original_node, updated_node):
        func = original_node.func
        compiles = self.ctx.facts.file.qualname(func) == "torch.compile" or (
            isinstance(func, cst.Attribute) and func.attr.value == "compile"
            and self.ctx.facts.file.qualname(func) is None and not original_node.args
            and self.ctx.facts.values(self.ctx.scope).is_model(func.value)
        )
        if not compiles or call_arg(original_node, 99, "backend") is not None:
            return updated_node
        if self.ctx.facts.file.qualname(func) == "torch.compile" and len(original_node.args) > 1 and \
                original_node.args[1].keyword is None:
            return updated_node  # torch.compile(model, "inductor"): a backend named by position
        backend = cst.Arg(
            keyword=cst.Name("backend"), value=self.ctx.expr("compile_backend"),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
        )
        args = list(updated_node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        self.ctx.fix(original_node, "torch.compile for the target's device (its dynamo backend)")
        return updated_node.with_changes(args=[*args, backend])
