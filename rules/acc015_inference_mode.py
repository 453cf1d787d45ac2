import libcst as cst

from accrewrite.rule import Example, Rule


class InferenceMode(Rule):
    """Evaluation under `torch.no_grad()` where the target's tensors cannot be inference tensors.

    `torch.inference_mode()` makes inference tensors, which have no version counter; XLA's lazy
    tensors need one (`RuntimeError: Cannot set version_counter for inference tensor` as soon as
    a model that trains is evaluated under it). `torch.no_grad()` computes the same outputs
    without recording gradients, so the context manager and the decorator (`@torch.inference_mode()`,
    `@torch.inference_mode`) become it on such targets. `torch.inference_mode(mode)` with an
    argument is left as it is and reported: `no_grad` takes none.
    """

    code = "ACC015"
    name = "inference-mode"
    summary = "torch.inference_mode() -> torch.no_grad() where the target has no inference tensors"
    concepts = ("grad_free_mode",)
    triggers = frozenset({"inference_mode"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch

            @torch.inference_mode()
            def evaluate(model, x):
                return model(x)

            with torch.inference_mode():
                test_pred = model(X_test)
            """,
            after="""
            import torch

            @torch.no_grad()
            def evaluate(model, x):
                return model(x)

            with torch.no_grad():
                test_pred = model(X_test)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            with torch.inference_mode(not training):
                test_pred = model(X_test)
            """,
            diagnostics=("ACC015:3",),
        ),
    )

    def _names_inference_mode(self, node: cst.CSTNode) -> bool:
        return self.ctx.facts.file.qualname(node) == "torch.inference_mode"

    def leave_Call(self, original_node, updated_node):
        if not self._names_inference_mode(original_node.func):
            return updated_node
        if original_node.args:
            self.ctx.diagnose(
                original_node, "`torch.inference_mode(...)` makes inference tensors, which this target lacks",
                "XLA's lazy tensors need a version counter, which inference tensors have not. Use "
                "`torch.no_grad()` where the mode is on (it takes no argument), and migrate again.",
            )
            return updated_node
        self.ctx.fix(original_node, "torch.inference_mode() -> torch.no_grad() (no inference tensors on the target)")
        return updated_node.with_changes(func=self.ctx.expr("grad_free_mode"))

    def leave_Decorator(self, original_node, updated_node):
        if not self._names_inference_mode(original_node.decorator):
            return updated_node
        self.ctx.fix(original_node, "@torch.inference_mode -> @torch.no_grad (no inference tensors on the target)")
        return updated_node.with_changes(decorator=self.ctx.expr("grad_free_mode"))
