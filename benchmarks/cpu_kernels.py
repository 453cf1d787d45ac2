"""accrewrite's C++ CPU kernels against what runs without them, side by side, float32.

    python benchmarks/cpu_kernels.py [--threads N] [--repeat N]

Causal attention: for each shape (batch, heads, tokens, head size), with q, k and v the heads of
one (batch, tokens, 3 * hidden) projection as a GPT block makes them, the median time of the
forward and of the backward for ATen's kernel (what ``F.scaled_dot_product_attention(...,
is_causal=True)`` runs) and for ``accrewrite.runtime.compiler.cpu.attention``.

Cross-entropy: for each shape (rows, hidden, classes), a language model's head and loss,
``F.cross_entropy(linear(x), target)``, compiled with the accrewrite backend, forward and
backward: once as written, where the kernel (``accrewrite.runtime.compiler.cpu.cross_entropy``)
computes the loss and the head's bias gradient, and once with ``ignore_index=-1``, which the
kernel selection does not match (no target is -1: the same loss), so that inductor compiles the
loss. The matmuls are the same oneDNN GEMMs in both.

Each line ends with the ratio of the totals (ours / theirs; below 1: ours is faster). Both run
on the same inputs in one process, in turns.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from accrewrite.runtime.compiler.backend import Backend
from accrewrite.runtime.compiler.cpu import attention, cross_entropy
from accrewrite.runtime.compiler.cpu.host_memory import cache_host_memory

ATTENTION_SHAPES = [(16, 4, 64, 32), (16, 4, 128, 64), (8, 8, 128, 128), (8, 4, 256, 64),
                    (4, 4, 512, 64), (2, 4, 1024, 64), (2, 3, 100, 40)]
CROSS_ENTROPY_SHAPES = [(2048, 256, 4096), (1024, 128, 32000)]
_aten = torch.ops.aten


def attention_calls(batch, heads, tokens, dim):
    """{implementation: (forward, backward)} for ATen's kernel and ours on one input."""
    hidden = heads * dim
    projection = torch.randn(batch, tokens, 3 * hidden)
    q, k, v = (
        t.view(batch, tokens, heads, dim).transpose(1, 2) for t in projection.split(hidden, -1)
    )
    grad = torch.randn(batch, tokens, hidden).view(batch, tokens, heads, dim).transpose(1, 2)
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2]
    ours_out, ours_lse = attention.causal_attention(q, k, v)
    return {
        "ATen": (
            lambda: _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True),
            lambda: _aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, out, lse, 0.0, True),
        ),
        "accrewrite": (
            lambda: attention.causal_attention(q, k, v),
            lambda: attention.causal_attention_backward(grad, q, k, v, ours_out, ours_lse),
        ),
    }


def cross_entropy_calls(rows, hidden, classes):
    """{implementation: (forward, backward)} for a head and its loss compiled with inductor's
    cross-entropy and with ours."""
    x = torch.randn(rows, hidden, requires_grad=True)
    target = torch.randint(0, classes, (rows,))
    linear = torch.nn.Linear(hidden, classes)

    def calls(ignore_index):
        def head(x, target):
            return F.cross_entropy(linear(x), target, ignore_index=ignore_index)

        compiled = torch.compile(head, backend=Backend(), dynamic=False)
        losses = []
        return lambda: losses.append(compiled(x, target)), lambda: losses.pop().backward()

    return {"inductor": calls(-1), "accrewrite": calls(-100)}


def medians(calls, repeat):
    """{implementation: [forward ms, backward ms]}, timed in turns; the first 3 rounds warm up."""
    times = {name: ([], []) for name in calls}
    for round_ in range(repeat + 3):
        for name, pair in calls.items():
            for call, spent in zip(pair, times[name]):
                start = time.perf_counter()
                call()
                if round_ >= 3:
                    spent.append(time.perf_counter() - start)
    return {name: [statistics.median(t) * 1e3 for t in pair] for name, pair in times.items()}


def table(title, shapes, make_calls, theirs, repeat):
    print(f"\n{title}")
    print(f"{'shape':>20}  {theirs + ' fwd':>13} {'bwd':>6}  {'ours fwd':>8} {'bwd':>6}  "
          "ours/theirs")
    for shape in shapes:
        torch.manual_seed(0)
        ms = medians(make_calls(*shape), repeat)
        ratio = sum(ms["accrewrite"]) / sum(ms[theirs])
        print(f"{'x'.join(map(str, shape)):>20}  {ms[theirs][0]:13.2f} {ms[theirs][1]:6.2f}  "
              f"{ms['accrewrite'][0]:8.2f} {ms['accrewrite'][1]:6.2f}  {ratio:8.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls of each (median)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cache_host_memory()  # as compile(..., host_memory=True) turns it on for a CPU model
    for module in (attention, cross_entropy):
        if module.unavailable():
            raise SystemExit(f"{module.__name__}: kernel unavailable: {module.unavailable()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, ms")
    table("causal attention (batch x heads x tokens x head size)", ATTENTION_SHAPES,
          attention_calls, "ATen", args.repeat)
    table("head + cross-entropy (rows x hidden x classes)", CROSS_ENTROPY_SHAPES,
          cross_entropy_calls, "inductor", args.repeat)


if __name__ == "__main__":
    main()
