import libcst as cst

from accrewrite.nodes import call_arg, dotted
from accrewrite.rule import Example, Rule
from accrewrite.toolbox import with_keywords

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_MHA = "torch.nn.MultiheadAttention"
_SPLIT = ("Under --parallel cp each layer computes on its part of the sequence, and its attention on the "
          "whole sequence with a share of the heads; a mask built for the whole sequence, or for one part, "
          "does not follow that split, and accelerate refuses it at the layer's first forward. ")
_MASK = _SPLIT + ("{causal} A padding or other mask has no such form: pack the sequences without padding, "
                  "or migrate with --parallel fsdp instead of cp.")


class ContextParallelAttention(Rule):
    """`migrate --parallel cp` (and `fsdp,cp`): attention that context parallel cannot split is
    reported where it is written, before the migrated script fails at its first step; an
    `nn.MultiheadAttention` whose weights are thrown away is told not to return them.

    Context parallel (`config.dist.sp`, Ulysses) runs each of the model's repeated blocks on its
    part of the sequence and swaps, around every `F.scaled_dot_product_attention`, the split of
    the sequence for a split of the heads, so that attention sees the whole sequence; an
    `nn.MultiheadAttention` is first made into projections and that call. `accelerate` refuses,
    at a block's first forward, what does not follow the split; this rule names it in the
    source, with what to write, and makes the one change that keeps the model as it was:

    - `self.attn(x, x, x)[0]` and `y, _ = self.attn(x, x, x)` (an `nn.MultiheadAttention`
      whose weights are not read) get `need_weights=False`: it returns the attention weights
      by default, which no rank computes whole; the output is the same.

    Reported:

    - `scaled_dot_product_attention` given an `attn_mask`: `is_causal=True` where the mask is
      causal; a padding mask has no form that follows the split;
    - an `nn.MultiheadAttention` called with a `key_padding_mask`, or with an `attn_mask` and
      no `is_causal=True` (nn.MultiheadAttention's hint that the mask is causal);
    - an `nn.MultiheadAttention` whose weights are read, or whose `need_weights` is not the
      literal False.

    Attention written by hand (a matmul and a softmax), positions taken from a block's input
    length and other mixing of tokens outside attention are not found here: `accelerate`
    compares each block's first forward on the parts with its forward on the whole sequence, and
    refuses one that differs. So does a sequence length that does not divide by the number of
    ranks of a context-parallel group, which is known only from the data.
    """

    code = "ACC036"
    name = "context-parallel-attention"
    summary = "--parallel with cp: attn(q, k, v)[0] -> attn(q, k, v, need_weights=False); masks reported"
    opt_in = True
    parallel = True
    concepts = ("parallel_accelerate",)
    triggers = None  # an nn.MultiheadAttention is called by the script's own attribute names
    examples = (
        Example(
            parallel="cp",
            before="""
            import torch.nn.functional as F
            from torch import nn

            class Block(nn.Module):
                def __init__(self, width, heads):
                    super().__init__()
                    self.attn = nn.MultiheadAttention(width, heads, batch_first=True)

                def forward(self, x, mask, padding):
                    y = self.attn(x, x, x, attn_mask=mask, is_causal=True)[0]
                    z, weights = self.attn(x, x, x, key_padding_mask=padding)
                    return F.scaled_dot_product_attention(y, z, z, attn_mask=mask)
            """,
            after="""
            import torch.nn.functional as F
            from torch import nn

            class Block(nn.Module):
                def __init__(self, width, heads):
                    super().__init__()
                    self.attn = nn.MultiheadAttention(width, heads, batch_first=True)

                def forward(self, x, mask, padding):
                    y = self.attn(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
                    z, weights = self.attn(x, x, x, key_padding_mask=padding)
                    return F.scaled_dot_product_attention(y, z, z, attn_mask=mask)
            """,
            diagnostics=("ACC036:11", "ACC036:11", "ACC036:12"),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._attentions: frozenset[str] = frozenset()
        self._weights_unread: set[cst.Call] = set()  # nn.MultiheadAttention calls whose weights go unread

    def applies(self) -> bool:
        # Without cp there is no split; without accelerate (the XLA targets) ACC030 says so.
        if "cp" not in (self.ctx.parallel or "").split(",") or not self.ctx.target.has(*self.concepts):
            return False
        text = self.ctx.source_text
        if "scaled_dot_product_attention" not in text and "MultiheadAttention" not in text:
            return False
        self._attentions = frozenset(
            name for name, callee in self.ctx.facts.file.assigned_calls.items() if callee == _MHA)
        return True

    # The weights thrown away: `attn(...)[0]` and `y, _ = attn(...)`; seen before the call itself.

    def visit_Subscript(self, node: cst.Subscript) -> None:
        index = node.slice[0].slice if len(node.slice) == 1 else None
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0":
            self._note_weights_unread(node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        target = node.targets[0].target if len(node.targets) == 1 else None
        if isinstance(target, cst.Tuple) and len(target.elements) == 2 and _is(target.elements[1], "_"):
            self._note_weights_unread(node.value)

    def _note_weights_unread(self, value: cst.BaseExpression) -> None:
        if isinstance(value, cst.Call) and dotted(value.func) in self._attentions:
            self._weights_unread.add(value)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.facts.file.qualname(node.func) == _SDPA:
            if _given(call_arg(node, 3, "attn_mask")):
                self.ctx.diagnose(node, "scaled_dot_product_attention is given an attn_mask, which context "
                                        "parallel cannot split",
                                  _MASK.format(causal="Where the mask is causal, pass is_causal=True in its place."))
        elif dotted(node.func) in self._attentions:
            self._check_multihead(node)

    def _check_multihead(self, call: cst.Call) -> None:
        name = dotted(call.func)
        if _given(call_arg(call, 3, "key_padding_mask")):
            self.ctx.diagnose(call, f"{name} is given a key_padding_mask, which context parallel cannot split",
                              _MASK.format(causal="Drop it: a causal attn_mask, with is_causal=True beside it, "
                                                  "follows the split."))
        elif _given(call_arg(call, 5, "attn_mask")) and not _is(call_arg(call, 7, "is_causal"), "True"):
            self.ctx.diagnose(call, f"{name} is given an attn_mask without is_causal=True, which context "
                                    f"parallel cannot split",
                              _MASK.format(causal="Where the mask is causal, pass is_causal=True beside it "
                                                  "(nn.MultiheadAttention's hint that it is)."))
        need_weights = call_arg(call, 4, "need_weights")
        if need_weights is None and call in self._weights_unread:
            return  # fixed on leaving
        if not _is(need_weights, "False"):
            self.ctx.diagnose(
                call, f"{name} returns its attention weights, which context parallel does not compute whole",
                "nn.MultiheadAttention returns the attention weights unless need_weights=False; under --parallel "
                "cp each rank attends with a share of the heads, and accelerate refuses the call at the layer's "
                "first forward. Where the weights are not read, pass need_weights=False (they are then None).",
            )

    def leave_Call(self, original_node, updated_node):
        if original_node not in self._weights_unread or call_arg(original_node, 4, "need_weights") is not None:
            return updated_node
        self.ctx.fix(original_node, "need_weights=False: the weights are not read, and context parallel does "
                                    "not compute them whole")
        return with_keywords(updated_node, [("need_weights", cst.Name("False"))])


def _given(arg: cst.Arg | None) -> bool:
    """An argument given, and not the literal None."""
    return arg is not None and not _is(arg, "None")


def _is(arg: cst.Arg | cst.Element | None, literal: str) -> bool:
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == literal

