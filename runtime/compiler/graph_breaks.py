"""``accrewrite.runtime.explain(model, *example_inputs)``: where and why the graph breaks.

Every graph break splits the captured step into separately compiled graphs with eager Python
between them (a host sync, data-dependent control flow, an unsupported call...). This runs
dynamo's explain on the example inputs and reports each break at the user's line.
"""

import dataclasses
from types import MappingProxyType

from accrewrite.base import torch_compat as compat


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """One graph break: the user code line where it happened, and dynamo's reason."""

    filename: str
    lineno: int
    reason: str

    def __str__(self):
        return f"{self.filename}:{self.lineno}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The graphs dynamo captured for one call and the breaks between them."""

    graph_count: int
    breaks: tuple[GraphBreak, ...]

    def __str__(self):
        head = f"{self.graph_count} graph(s), {len(self.breaks)} graph break(s)"
        return "\n".join([head, *(f"  {b}" for b in self.breaks)])


def explain(model, *example_inputs, **example_kwargs) -> Explanation:
    """Run ``model(*example_inputs, **example_kwargs)`` under dynamo and list its graph breaks.

    Like ``torch._dynamo.explain``, on which it is built, this resets dynamo's compiled-code
    caches: models compiled before recompile on their next call.
    """
    if not callable(model):
        raise TypeError(f"explain() expects a model or function, got {type(model).__name__}")
    result = compat.dynamo_explain(model)(*example_inputs, **example_kwargs)
    breaks = []
    for reason in result.break_reasons:
        # The innermost frame of the user stack is the line that broke the graph.
        frame = reason.user_stack[-1] if reason.user_stack else None
        breaks.append(
            GraphBreak(
                filename=frame.filename if frame else "<unknown>",
                lineno=frame.lineno if frame else 0,
                reason=_first_line(reason.reason),
            )
        )
    return Explanation(graph_count=result.graph_count, breaks=tuple(breaks))


# Dynamo's terse reasons, in words (its other reasons start with a readable sentence).
_PLAIN = MappingProxyType({"generic_jump": "Python control flow depends on a tensor's value"})


def _first_line(reason: str) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else "unknown reason"
    plain = _PLAIN.get(line.split(" ", 1)[0])
    return f"{plain} ({line})" if plain else line
