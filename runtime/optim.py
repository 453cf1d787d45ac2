"""``FusedAdam`` / ``FusedAdamW``: drop-ins for ``torch.optim.Adam`` / ``torch.optim.AdamW`` whose
step is ``accrewrite.kernels.adam.adam_step`` (one Triton launch per param group on CUDA, the
PyTorch reference elsewhere).

They subclass the torch classes: same constructor signature and defaults, same param-group keys,
same per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``), so a state_dict saved by one
loads into the other both ways, ``isinstance(opt, torch.optim.Adam)`` holds and LR schedulers
work unchanged. Differences, by design:

- ``step`` is kept on the parameter's device as float32 (as ``fused=True`` does), so no step
  count crosses to the host; a loaded state_dict's steps are moved there.
- The arithmetic is float32 for float32/bfloat16/float16 parameters (float64 for float64 ones);
  ``foreach=`` and ``fused=`` are accepted and have no effect (the kernel is always the fused
  one; the group stores ``fused=None``).
- The kernel has no ``amsgrad`` and is not ``differentiable``: an optimizer with a group that
  asks for either runs torch's own step (and then does not take GradScaler's tensors), so that
  ``hooks.enable_fused_adam()`` never breaks a script.
- With a ``GradScaler`` (``_step_supports_amp_scaling``) the scaler hands the step its scale
  and overflow flag as tensors: gradients are divided by the scale inside the kernel and an
  overflow step is skipped on the device, as ``torch.optim.Adam(fused=True)`` does; the
  ``.grad`` tensors themselves stay scaled.
"""

import torch

from accrewrite.kernels.adam import step_param_group

__all__ = ["FusedAdam", "FusedAdamW"]


class _FusedAdamStep:
    """The step and state handling shared by FusedAdam and FusedAdamW (mixed in before the torch
    class, whose constructor and bookkeeping they keep)."""

    def _needs_torch_step(self) -> bool:
        return any(group["amsgrad"] or group["differentiable"] for group in self.param_groups)

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # GradScaler's protocol: pass grad_scale / found_inf to step() instead of unscaling.
        return not self._needs_torch_step()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for param, state in self.state.items():
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(param.device)

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam(W) update of every parameter that has a gradient."""
        if self._needs_torch_step():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by GradScaler.step for the duration of this call (see the module docstring).
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            step_param_group(
                self.state, group, params, decoupled_weight_decay=group["decoupled_weight_decay"],
                grad_scale=grad_scale, found_inf=found_inf,
            )
        return loss


class FusedAdam(_FusedAdamStep, torch.optim.Adam):
    """``torch.optim.Adam`` with the fused multi-tensor step (see the module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        # fused= is accepted for the signature but not passed on: torch's fused=True checks
        # devices and dtypes for torch's own kernel, which is not the one that runs here.
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=None, decoupled_weight_decay=decoupled_weight_decay)


class FusedAdamW(_FusedAdamStep, torch.optim.AdamW):
    """``torch.optim.AdamW`` with the fused multi-tensor step (see the module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         foreach=foreach, capturable=capturable, differentiable=differentiable,
                         fused=None)

