"""``syncfree.Adam``, ``syncfree.AdamW``, ``syncfree.SGD``: optimizers that skip an overflow step
on the device.

Each ``step(closure=None, found_inf=None)`` takes the overflow flag as a tensor (nonzero: skip)
and leaves parameters and optimizer state unchanged when it is set, deciding that on the device
(``torch.where``), never with ``.item()`` or ``bool(tensor)``. With ``torch.amp.GradScaler`` /
``amp.GradScaler`` they declare ``_step_supports_amp_scaling``, so ``scaler.step(optimizer)``
passes them the scale and the flag as tensors (the ``grad_scale`` / ``found_inf`` attributes it
sets for the call) instead of syncing; the gradients are then divided by the scale here.

Without an overflow the updates are ``torch.optim``'s. The Adam math is the project's one
implementation, ``accrewrite.kernels.adam.adam_step`` (Triton on CUDA, PyTorch elsewhere); state
keys match ``torch.optim`` (``step``, ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) with
``step`` kept on the parameter's device so that no step count crosses to the host.
"""

import torch

from accrewrite.kernels.adam import new_state, step_param_group


class _SyncFree(torch.optim.Optimizer):
    """What the three optimizers share: the GradScaler protocol and the step skeleton.

    Subclasses define ``_init_state(param, group)`` (fill ``self.state[param]`` on the first
    step) and ``_update(group, params, grad_scale, found_inf)`` (update the group's parameters
    that have a gradient).
    """

    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None, found_inf=None):
        """One update of every parameter with a gradient; none where ``found_inf`` is nonzero.

        ``found_inf`` defaults to the flag a GradScaler set for this call.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if not self.state[p]:
                    self._init_state(p, group)
            if params:
                self._update(group, params, grad_scale, found_inf)
        return loss

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch.optim leaves a loaded "step" where it was saved (the CPU, after xm.save or from a
        # torch.optim checkpoint); the update reads it on the parameter's device, without a sync.
        for param, state in self.state.items():
            if "step" in state:
                state["step"] = state["step"].to(device=param.device, dtype=torch.float32)


def _check_hyperparameters(name, lr, eps=0.0, weight_decay=0.0, betas=(0.0, 0.0), momentum=0.0):
    checks = [
        (isinstance(lr, torch.Tensor) or lr >= 0, f"learning rate {lr}"),
        (eps >= 0, f"eps {eps}"),
        (weight_decay >= 0, f"weight_decay {weight_decay}"),
        (0 <= betas[0] < 1 and 0 <= betas[1] < 1, f"betas {betas}"),
        (momentum >= 0, f"momentum {momentum}"),
    ]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"{name}: invalid {what}")


def _check_options(name, amsgrad=False, differentiable=False):
    """``foreach``, ``fused`` and ``capturable`` are accepted and change nothing: the update is
    the runtime's one kernel, and its state already stays on the device."""
    if amsgrad:
        raise ValueError(f"syncfree.{name} does not support amsgrad=True")
    if differentiable:
        raise ValueError(f"syncfree.{name} does not support differentiable=True")


class Adam(_SyncFree):
    """``torch.optim.Adam`` that skips overflow steps on the device (no ``amsgrad``)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        del foreach, capturable, fused
        _check_options(type(self).__name__, amsgrad, differentiable)
        _check_hyperparameters(type(self).__name__, lr, eps, weight_decay, betas)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=False, maximize=maximize)
        super().__init__(params, defaults)
        self._decoupled_weight_decay = decoupled_weight_decay

    def _init_state(self, param, group):
        self.state[param].update(new_state(param))

    def _update(self, group, params, grad_scale, found_inf):
        step_param_group(
            self.state, group, params, decoupled_weight_decay=self._decoupled_weight_decay,
            grad_scale=grad_scale, found_inf=found_inf,
        )


class AdamW(Adam):
    """``torch.optim.AdamW`` (decoupled weight decay) that skips overflow steps on the device."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)


class SGD(_SyncFree):
    """``torch.optim.SGD`` (momentum, dampening, nesterov, weight decay, maximize) that skips
    overflow steps on the device.

    torch.optim creates the momentum buffer from the first gradient; here it exists from the
    start (zeros) and a per-parameter ``step`` tensor on the device says whether the first real
    update has happened, so an overflow on the first step leaves the buffer "unstarted" too.
    """

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        del foreach, fused
        _check_options("SGD", differentiable=differentiable)
        _check_hyperparameters("SGD", lr, weight_decay=weight_decay, momentum=momentum)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def _init_state(self, param, group):
        if group["momentum"] != 0:
            state = self.state[param]
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def _update(self, group, params, grad_scale, found_inf):
        keep = None if found_inf is None else found_inf == 0
        momentum, dampening = group["momentum"], group["dampening"]
        for param in params:
            grad = param.grad if grad_scale is None else param.grad / grad_scale
            if group["maximize"]:
                grad = -grad
            if group["weight_decay"] != 0:
                grad = grad.add(param, alpha=group["weight_decay"])
            if momentum != 0:
                state = self.state[param]
                buf, step = state["momentum_buffer"], state["step"]
                new_buf = torch.where(step == 0, grad, buf.mul(momentum).add(grad, alpha=1 - dampening))
                _masked_copy_(buf, new_buf, keep)
                _masked_copy_(step, step + 1, keep)
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            _masked_copy_(param, param.add(grad, alpha=-group["lr"]), keep)


def _masked_copy_(target, value, keep):
    """``target[...] = value`` where ``keep`` (a device bool tensor) is true; always when None."""
    target.copy_(value if keep is None else torch.where(keep, value, target))
