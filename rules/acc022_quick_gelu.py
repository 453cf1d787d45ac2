from accrewrite.concepts import SPELLING, Definition
from accrewrite.rule import Example

from ._constructor_swap import ConstructorSwap


class QuickGelu(ConstructorSwap):
    """`nn.GELU()` becomes `QuickGelu()`: `x * sigmoid(1.702 * x)` (TorchAcc's migration guide, "QuickGelu").

    Unsafe: QuickGelu approximates GELU (they differ by up to about 0.02), so a model trained
    with GELU computes different numbers; it is cheaper and fuses into one kernel. Applied only
    with --unsafe-fixes or when selected by its code or name. GELU's arguments
    (`approximate=`) are dropped.
    """

    code = "ACC022"
    name = "quick-gelu"
    summary = "nn.GELU -> QuickGelu (unsafe: a different function)"
    safe = False
    keeps_arguments = False
    swaps = {"torch.nn.GELU": "quick_gelu"}
    concepts = ("quick_gelu",)
    defines = (Definition("quick_gelu", SPELLING, "torch.nn.GELU's faster approximation (unsafe: numerics change)",
                          hook=True),)
    triggers = frozenset({"GELU"})
    examples = (
        Example(
            target="torchacc",
            before="""
            from torch import nn

            mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(approximate="tanh"), nn.Linear(256, 64))
            """,
            after="""
            from torch import nn
            from torchacc.runtime.nn.quick_gelu import QuickGelu

            mlp = nn.Sequential(nn.Linear(64, 256), QuickGelu(), nn.Linear(256, 64))
            """,
        ),
    )
