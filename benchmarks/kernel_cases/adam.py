"""adam cases: one FusedAdamW step over a GPT-2-small-shaped parameter set (124M parameters in
148 tensors) against torch.optim.AdamW's foreach step (eager), its compiled step and its fused
step.

Goal: at least parity with ``torch.optim.AdamW(fused=True)`` and 1.5x foreach.
"""

import torch

from accrewrite.runtime.optim import FusedAdamW

from . import Case


def gpt2_small_shapes(layers=12, dim=768, vocab=50257, context=1024):
    shapes = [(vocab, dim), (context, dim)]
    for _ in range(layers):
        shapes += [(dim,), (dim,), (dim, 3 * dim), (3 * dim,), (dim, dim), (dim,)]  # ln1, attn
        shapes += [(dim,), (dim,), (dim, 4 * dim), (4 * dim,), (4 * dim, dim), (dim,)]  # ln2, mlp
    return shapes + [(dim,), (dim,)]


SMOKE_SHAPES = [(7, 5), (5,), (129,)]


def cases(device, *, smoke=False, compile=torch.compile):
    shapes = SMOKE_SHAPES if smoke else gpt2_small_shapes()
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=generator) for s in shapes]
    grads = [torch.randn(s, generator=generator) for s in shapes]

    def step_of(optimizer_class, **options):
        """One optimizer over its own copy of the parameters (with gradients), its step bound."""
        params = [torch.nn.Parameter(v.to(device)) for v in values]
        for p, g in zip(params, grads):
            p.grad = g.to(device)
        return optimizer_class(params, lr=1e-3, weight_decay=0.01, **options).step

    compiled_step = compile(step_of(torch.optim.AdamW, foreach=False))
    n = sum(v.numel() for v in values)
    return [Case(
        name=f"adamw float32 {n / 1e6:.1f}M params in {len(shapes)} tensors",
        ours=step_of(FusedAdamW),
        eager=step_of(torch.optim.AdamW, foreach=True),
        compiled=compiled_step,
        others={"torch fused": step_of(torch.optim.AdamW, fused=True)},
    )]
