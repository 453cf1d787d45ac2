from accrewrite.concepts import SPELLING, Definition
from accrewrite.rule import Example

from ._constructor_swap import ConstructorSwap


class FusedLayerNorm(ConstructorSwap):
    """`nn.LayerNorm` becomes the target's fused LayerNorm (TorchAcc's migration guide, "FusedLayerNorm").

    The fused module is an equivalent replacement: same arguments, same parameters and
    state_dict keys (an `nn.LayerNorm` checkpoint loads into it), the same results within
    floating-point tolerance; on CUDA it runs a Triton kernel. On torchacc the replacement is
    the guide's hook, `hooks.enable_fused_layer_norm()`, called once before torch is imported.
    Only calls are rewritten; a class passed as a value (`norm_layer=nn.LayerNorm`) is left
    as it is.
    """

    code = "ACC020"
    name = "fused-layer-norm"
    summary = "nn.LayerNorm -> the target's FusedLayerNorm"
    swaps = {"torch.nn.LayerNorm": "fused_layer_norm", "torch.nn.modules.normalization.LayerNorm": "fused_layer_norm"}
    concepts = ("fused_layer_norm",)
    defines = (Definition("fused_layer_norm", SPELLING, "torch.nn.LayerNorm's fused replacement", hook=True),)
    triggers = frozenset({"LayerNorm"})
    examples = (
        Example(
            before="""
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.norm = nn.LayerNorm(dim, eps=1e-6)
            """,
            after="""
            import torch.nn as nn
            from accrewrite.runtime.nn import FusedLayerNorm

            class Block(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.norm = FusedLayerNorm(dim, eps=1e-6)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch
            import torch.nn as nn

            norm = nn.LayerNorm(768)
            """,
            after="""
            from torchacc.runtime import hooks
            hooks.enable_fused_layer_norm()
            import torch
            import torch.nn as nn

            norm = nn.LayerNorm(768)
            """,
        ),
    )
