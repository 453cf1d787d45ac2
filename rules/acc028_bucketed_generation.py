import libcst as cst

from accrewrite import snippets
from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import origins, rebuilt
from accrewrite.rule import Example, Rule
from accrewrite.rules._generation import Generation, keeps_dimension, planned_generation


class BucketedGeneration(Rule):
    """Pad a generation loop's context to a few bucket lengths, so that sampling N tokens
    compiles a few graphs instead of N.

    On a device that compiles a graph per shape (torchacc, torch_xla), a loop that runs its
    model on a sequence growing by one token (`idx = torch.cat((idx, idx_next), dim=1)`, a
    GPT's `generate`) compiles new graphs for every token: the model's, and the growth's own.
    Rewritten, the sequence grows on the host (moved there before the loop and back after it,
    each sampled token brought back), where a new length compiles nothing; the model runs on the
    context padded on the right to the next power of two (at most the crop's N of
    `idx[:, -N:]`), moved to the device; and its logits are read at the last real position
    through a tensor index, since a Python int would be a constant of the graph. So N tokens
    compile about log2(N) model graphs, none once the context reaches its crop.

    The padded positions come after the real ones, so a causal model computes the real
    positions' logits exactly as before. Rewritten only where the file shows it: the model's
    class (`self` in its own `generate`, or a name bound once to an instance) and the classes it
    builds use layers of one position, attention masked with a lower-triangular buffer
    (`masked_fill(self.tril[:T, :T] == 0, ...)`) or `scaled_dot_product_attention(...,
    is_causal=True)`, or one-directional `nn.LSTM`/`GRU`/`RNN`; its forward returns every
    position's logits (not nanoGPT's `x[:, [-1], :]`); the loop reads them at the last
    position only (`logits[:, -1, :]`); and an uncropped context goes to a model without
    positions of a fixed number. Dropout draws its masks for the padded shape, so a model
    sampled in training mode draws other (equally distributed) tokens. Elsewhere ACC103 names
    the loop and says why it stays.
    """

    code = "ACC028"
    name = "bucketed-generation"
    summary = "generation loops: the context padded to power-of-two lengths, the sequence grown on the host"
    concepts = ("generation_context", "generation_position")
    defines = (
        Definition("generation_context", EXPRESSION,
                   "a generation loop's context padded on the right to a bucket length, on the device",
                   ("context", "bucket", "length", "device")),
        Definition("generation_position", EXPRESSION, "a position as a one-element index tensor on the device",
                   ("position", "device")),
    )
    triggers = frozenset({"cat", "concat", "concatenate"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Bigram(nn.Module):
                def __init__(self, vocab_size):
                    super().__init__()
                    self.table = nn.Embedding(vocab_size, vocab_size)

                def forward(self, idx):
                    return self.table(idx)

                def generate(self, idx, max_new_tokens):
                    for _ in range(max_new_tokens):
                        logits = self(idx)
                        probs = F.softmax(logits[:, -1, :], dim=-1)
                        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
                    return idx
            """,
            after="""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Bigram(nn.Module):
                def __init__(self, vocab_size):
                    super().__init__()
                    self.table = nn.Embedding(vocab_size, vocab_size)

                def forward(self, idx):
                    return self.table(idx)

                def generate(self, idx, max_new_tokens):
                    idx_device = idx.device
                    idx = idx.cpu()
                    for _ in range(max_new_tokens):
                        idx_window = idx.size(1)
                        idx_last = torch.tensor([idx_window - 1], device=idx_device)
                        logits = self(torch.nn.functional.pad(idx, (0, (1 << (idx_window - 1).bit_length()) - idx_window)).to(idx_device))
                        probs = F.softmax(logits[:, idx_last, :].squeeze(1), dim=-1)
                        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1).cpu()), dim=1)
                    idx = idx.to(idx_device)
                    return idx
            """,
        ),
        # A one-directional GRU, its context cropped to the last `window` tokens, its logits read on the call.
        Example(
            target="torchacc",
            before="""
            import torch
            from torch import nn

            class CharRNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(65, 32)
                    self.rnn = nn.GRU(32, 64, batch_first=True)
                    self.head = nn.Linear(64, 65)

                def forward(self, idx):
                    return self.head(self.rnn(self.embed(idx))[0])

            model = CharRNN().to(device)
            idx = torch.zeros((1, 1), dtype=torch.long, device=device)
            while idx.size(1) < 100:
                nxt = model(idx[:, -window:])[:, [-1]].argmax(-1)
                idx = torch.cat([idx, nxt], dim=1)
            """,
            after="""
            import torch
            from torch import nn

            class CharRNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(65, 32)
                    self.rnn = nn.GRU(32, 64, batch_first=True)
                    self.head = nn.Linear(64, 65)

                def forward(self, idx):
                    return self.head(self.rnn(self.embed(idx))[0])

            model = CharRNN().to(device)
            idx = torch.zeros((1, 1), dtype=torch.long, device=device)
            idx_device = idx.device
            idx = idx.cpu()
            while idx.size(1) < 100:
                idx_window = idx[:, -window:].size(1)
                idx_last = torch.tensor([idx_window - 1], device=idx_device)
                nxt = model(torch.nn.functional.pad(idx[:, -window:], (0, min(1 << (idx_window - 1).bit_length(), window) - idx_window)).to(idx_device))[:, idx_last].argmax(-1)
                idx = torch.cat([idx, nxt.cpu()], dim=1)
            idx = idx.to(idx_device)
            """,
        ),
    )

    def leave_For(self, original_node, updated_node):
        return self._bucketed(original_node, updated_node)

    def leave_While(self, original_node, updated_node):
        return self._bucketed(original_node, updated_node)

    def _bucketed(self, loop, updated):
        plan = planned_generation(self.ctx, loop)
        if not isinstance(plan, Generation):
            return updated
        grown = plan.grown
        device, window, last = self._fresh(f"{grown}_device", f"{grown}_window", f"{grown}_last")
        rewrite = _Rewrite(self.ctx, plan, device, window, last, origins(loop, updated))
        result = rebuilt(updated, rewrite.leave)
        if not rewrite.complete:
            self.ctx.diagnose(loop, f"`{grown}`'s generation loop was changed by another rule; not padded to buckets",
                              "Run the migration again with this rule selected alone to pad it.")
            return updated
        self.ctx.insert_before(loop, [self._statement(f"{device} = {grown}.device"),
                                      self._statement(f"{grown} = {grown}.cpu()")])
        self.ctx.insert_after(loop, [self._statement(f"{grown} = {grown}.to({device})")])
        self.ctx.fix(loop, f"`{grown}` grows on the host; the model's context is padded to power-of-two lengths")
        return result

    def _fresh(self, *wanted: str) -> list[str]:
        """``wanted``, each with a number added where the scope or the module binds it already."""
        bound = self.ctx.facts.file.local_names
        scope = self.ctx.scope
        taken = set(bound.get(self.ctx.module, ())) | set(bound.get(scope.body, ()) if scope is not None else ())
        names = []
        for name in wanted:
            fresh, number = name, 1
            while fresh in taken:
                fresh, number = f"{name}_{number}", number + 1
            names.append(fresh)
        return names

    def _statement(self, line: str) -> cst.BaseStatement:
        return snippets.statement(line, self.ctx.module.config_for_parsing)


class _Rewrite:
    """The loop's nodes rewritten, bottom up: found by a child no other rule changes (the call's
    function, the read's index), since another rule may have rebuilt the nodes around it, and
    through ``origins`` (the loop as the rules left it -> the loop as written), since a rebuilt
    node is a new object."""

    def __init__(self, ctx, plan: Generation, device: str, window: str, last: str, origins) -> None:
        self.ctx, self.plan, self.device, self.window, self.last = ctx, plan, device, window, last
        self.origins = origins
        self.done: set[str] = set()
        self._lines: list[cst.BaseStatement] | None = None

    @property
    def complete(self) -> bool:
        return self.done == {"call", "cat", "line", "read"}

    def leave(self, node, updated):
        plan = self.plan
        if isinstance(node, cst.Call) and self._was(node.func, plan.call.func) and "call" not in self.done:
            return self._padded_call(updated)
        if isinstance(node, cst.Call) and self._was(node.func, plan.cat.func):
            self.done.add("cat")
            return _with_element(updated, 1, self._host(updated.args[0].value.elements[1].value))
        if isinstance(node, cst.Subscript) and any(
                len(node.slice) > 1 and self._was(node.slice[1], read.slice[1]) for read in plan.reads):
            self.done.add("read")
            return self._read_at_last(node, updated)
        if isinstance(node, cst.SimpleStatementLine) and self._lines is not None:
            lines, self._lines = self._lines, None
            self.done.add("line")
            return cst.FlattenSentinel([*lines, updated])
        return updated

    def _was(self, node: cst.CSTNode, written: cst.CSTNode) -> bool:
        return self.origins.get(node) is written

    def _padded_call(self, call: cst.Call) -> cst.Call:
        ctx, plan = self.ctx, self.plan
        context = ctx.code(call.args[0].value)
        bucket = f"1 << ({self.window} - 1).bit_length()"
        bucket = f"({bucket})" if plan.limit is None else f"min({bucket}, {ctx.code(plan.limit)})"
        padded = ctx.expr("generation_context", context=context, bucket=bucket, length=self.window, device=self.device)
        position = ctx.expr("generation_position", position=f"{self.window} - 1", device=self.device)
        config = ctx.module.config_for_parsing
        self._lines = [
            snippets.statement(f"{self.window} = {context}.size(1)", config),
            cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(self.last))], position)]),
        ]
        self.done.add("call")
        return call.with_changes(args=[call.args[0].with_changes(value=padded), *call.args[1:]])

    def _host(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.Call(cst.Attribute(value, cst.Name("cpu")))

    def _read_at_last(self, node: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        elements = list(updated.slice)
        elements[1] = elements[1].with_changes(slice=cst.Index(cst.Name(self.last)))
        read = updated.with_changes(slice=elements)
        if keeps_dimension(node):
            return read
        return cst.Call(cst.Attribute(read, cst.Name("squeeze")), [cst.Arg(cst.Integer("1"))])


def _with_element(call: cst.Call, index: int, value: cst.BaseExpression) -> cst.Call:
    parts = call.args[0].value
    elements = list(parts.elements)
    elements[index] = elements[index].with_changes(value=value)
    return call.with_changes(args=[call.args[0].with_changes(value=parts.with_changes(elements=elements)),
                                   *call.args[1:]])
