import libcst as cst

from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import call_arg, dotted, walk
from accrewrite.rule import Example, Rule

# Swin's names for the feature map's dimensions, which WindowProcess takes.
_DIMENSIONS = ("B", "H", "W", "C")


class SwinWindowProcess(Rule):
    """Swin's cyclic shift + window partition (and window merge + reverse shift) become one
    fused kernel each (TorchAcc's migration guide, "WindowProcess").

    The two statements of Swin's shifted-window attention

    ```python
    shifted_x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
    x_windows = window_partition(shifted_x, window_size)
    ```

    become `x_windows = WindowProcess.apply(x, B, H, W, C, -s, window_size)`, and

    ```python
    shifted_x = window_reverse(attn_windows, window_size, H, W)
    x = torch.roll(shifted_x, shifts=(s, s), dims=(1, 2))
    ```

    become `x = WindowProcessReverse.apply(attn_windows, B, H, W, C, s, window_size)`. The
    fused kernels move the same elements to the same places (bit-exact). `B, H, W, C` must be
    names of the function, as in Swin's blocks; elsewhere the pair is left as it is.
    """

    code = "ACC024"
    name = "swin-window-process"
    summary = "torch.roll + window_partition (and the reverse) -> WindowProcess(.Reverse).apply"
    concepts = ("window_process", "window_process_reverse")
    defines = (
        Definition("window_process", EXPRESSION, "Swin's shift and window partition, fused",
                   ("x", "shift", "window_size", "target")),
        Definition("window_process_reverse", EXPRESSION, "Swin's window merge and reverse shift, fused",
                   ("x", "shift", "window_size", "target")),
    )
    triggers = frozenset({"roll", "window_partition", "window_reverse"})
    examples = (
        Example(
            before="""
            import torch

            def forward(self, x):
                H, W = self.input_resolution
                B, L, C = x.shape
                x = x.view(B, H, W, C)
                shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
                x_windows = window_partition(shifted_x, self.window_size)
                attn_windows = self.attn(x_windows)
                shifted_x = window_reverse(attn_windows, self.window_size, H, W)
                x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
                return x
            """,
            after="""
            import torch
            from accrewrite.runtime.nn import WindowProcess
            from accrewrite.runtime.nn import WindowProcessReverse

            def forward(self, x):
                H, W = self.input_resolution
                B, L, C = x.shape
                x = x.view(B, H, W, C)
                x_windows = WindowProcess.apply(x, B, H, W, C, -self.shift_size, self.window_size)
                attn_windows = self.attn(x_windows)
                x = WindowProcessReverse.apply(attn_windows, B, H, W, C, self.shift_size, self.window_size)
                return x
            """,
        ),
    )

    def __init__(self, ctx):
        super().__init__(ctx)
        # First statement of a matched pair -> removed; second -> its replacement's code.
        self._removed: set[cst.CSTNode] = set()
        self._replaced: dict[cst.CSTNode, tuple[str, dict]] = {}

    def applies(self) -> bool:
        return "torch.roll" in self.ctx.facts.file.called

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not set(_DIMENSIONS) <= _assigned_names(node):
            return
        body = node.body.body
        for first, second in zip(body, body[1:]):
            self._match(first, second)

    def _match(self, first, second) -> None:
        first_assign, second_assign = _assignment(first), _assignment(second)
        if first_assign is None or second_assign is None:
            return
        (first_target, first_call), (second_target, second_call) = first_assign, second_assign
        code = self.ctx.code
        roll = self._roll(first_call)
        if roll is not None and dotted(second_call.func) == "window_partition":
            source, shift = roll
            if code(second_call.args[0].value) == first_target:
                size = code(second_call.args[1].value)
                self._pair(first, second, "window_process", second_target, source, shift, size)
            return
        roll = self._roll(second_call)
        if dotted(first_call.func) == "window_reverse" and roll is not None:
            source, shift = roll
            if source == first_target and len(first_call.args) >= 2:
                windows, size = code(first_call.args[0].value), code(first_call.args[1].value)
                self._pair(first, second, "window_process_reverse", second_target, windows, shift, size)

    def _pair(self, first, second, concept, target, source, shift, size) -> None:
        self._removed.add(first)
        self._replaced[second] = (concept, {"target": target, "x": source, "shift": shift, "window_size": size})

    def _roll(self, call: cst.Call):
        """(rolled tensor, shift) for ``torch.roll(x, shifts=(s, s), dims=(1, 2))``."""
        if self.ctx.facts.file.qualname(call.func) != "torch.roll":
            return None
        tensor, shifts, dims = call_arg(call, 0, "input"), call_arg(call, 1, "shifts"), call_arg(call, 2, "dims")
        if tensor is None or shifts is None or dims is None or self.ctx.code(dims.value).replace(" ", "") != "(1,2)":
            return None
        if not isinstance(shifts.value, cst.Tuple) or len(shifts.value.elements) != 2:
            return None
        first, second = (self.ctx.code(element.value) for element in shifts.value.elements)
        return (self.ctx.code(tensor.value), first) if first == second else None

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if original_node in self._removed:
            self.ctx.fix(original_node, "torch.roll is fused into the window kernel")
            return cst.RemoveFromParent()
        if original_node in self._replaced:
            concept, values = self._replaced[original_node]
            call = self.ctx.expr(concept, **values)
            self.ctx.fix(original_node, "window partition/merge and cyclic shift -> one fused kernel")
            assign = updated_node.body[0]
            return updated_node.with_changes(body=[assign.with_changes(value=call)])
        return updated_node


def _assignment(statement):
    """(target code, call) for ``name = call(...)``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or not isinstance(assign.value, cst.Call):
        return None
    target = dotted(assign.targets[0].target)
    return (target, assign.value) if target else None


def _assigned_names(function: cst.FunctionDef) -> set[str]:
    names = {param.name.value for param in function.params.params}

    def enter(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.AssignTarget):
            target = node.target
            elements = target.elements if isinstance(target, cst.Tuple) else [target]
            for element in elements:
                value = getattr(element, "value", element)
                if isinstance(value, cst.Name):
                    names.add(value.value)
        return True

    walk(function, enter)
    return names
