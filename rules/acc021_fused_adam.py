from accrewrite.rule import Example

from ._constructor_swap import ConstructorSwap


class FusedAdam(ConstructorSwap):
    """`torch.optim.Adam`/`AdamW` become the target's fused Adam (TorchAcc's migration guide, "FusedAdam").

    One multi-tensor kernel updates a whole parameter group; the optimizer is a drop-in
    (param groups, defaults and state_dict interchangeable with torch.optim's). Only where the
    file has no GradScaler: with one, ACC008 gives the syncfree optimizers instead, which skip
    overflowing steps on the device. On torchacc the replacement is the guide's hook,
    `hooks.enable_fused_adam()`, called once before torch is imported.
    """

    code = "ACC021"
    name = "fused-adam"
    summary = "torch.optim.Adam/AdamW -> the target's FusedAdam/FusedAdamW (without a GradScaler)"
    swaps = {"torch.optim.Adam": "fused_adam", "torch.optim.AdamW": "fused_adamw"}
    concepts = ("fused_adam", "fused_adamw")
    triggers = frozenset({"Adam", "AdamW"})
    examples = (
        Example(
            before="""
            import torch

            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
            """,
            after="""
            import torch
            from accrewrite.runtime.optim import FusedAdamW

            optimizer = FusedAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
            """,
        ),
    )

    def applies(self) -> bool:
        return not self.ctx.facts.uses_grad_scaler and super().applies()
