"""Causal attention on the CPU: accrewrite's C++ kernel against ATen's fused kernel, side by side.

    python benchmarks/cpu_attention.py [--threads N] [--repeat N]

For each shape (batch, heads, tokens, head size), float32, with q, k and v the heads of one
(batch, tokens, 3 * hidden) projection as a GPT block makes them, it prints the median time of
the forward and of the backward for ATen's kernel (what ``F.scaled_dot_product_attention(...,
is_causal=True)`` runs) and for ``accrewrite.runtime.compiler.attention``, and the ratio of the
totals (ours / ATen's; below 1: ours is faster). Both run on the same inputs in one process,
in turns. ``kernels="auto"`` chooses ours up to 1024 tokens (kernel_selection.py).
"""

import argparse
import statistics
import time

import torch

from accrewrite.runtime.compiler import attention
from accrewrite.runtime.host_memory import cache_host_memory

SHAPES = [(16, 4, 64, 32), (16, 4, 128, 64), (8, 8, 128, 128), (8, 4, 256, 64),
          (4, 4, 512, 64), (2, 4, 1024, 64), (2, 3, 100, 40)]
_aten = torch.ops.aten


def inputs(batch, heads, tokens, dim):
    hidden = heads * dim
    projection = torch.randn(batch, tokens, 3 * hidden)
    q, k, v = (
        t.view(batch, tokens, heads, dim).transpose(1, 2) for t in projection.split(hidden, -1)
    )
    grad = torch.randn(batch, tokens, hidden).view(batch, tokens, heads, dim).transpose(1, 2)
    return q, k, v, grad


def implementations(q, k, v, grad):
    """name: (forward, backward) of ATen's kernel and of ours on these inputs."""
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls of each (median)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cache_host_memory()  # as compile() turns it on for a CPU model
    if attention.unavailable():
        raise SystemExit(f"accrewrite's attention kernel is unavailable: {attention.unavailable()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, ms")
    print(f"{'shape':>20}  {'ATen fwd':>8} {'bwd':>6}  {'ours fwd':>8} {'bwd':>6}  ours/ATen")
    for shape in SHAPES:
        torch.manual_seed(0)
        timings = {name: ([], []) for name in ("ATen", "accrewrite")}
        functions = implementations(*inputs(*shape))
        for repeat in range(args.repeat + 3):  # in turns; the first 3 rounds warm up
            for name, calls in functions.items():
                for call, times in zip(calls, timings[name]):
                    start = time.perf_counter()
                    call()
                    if repeat >= 3:
                        times.append(time.perf_counter() - start)
        ms = {name: [statistics.median(t) * 1e3 for t in times] for name, times in timings.items()}
        ratio = sum(ms["accrewrite"]) / sum(ms["ATen"])
        print(f"{'x'.join(map(str, shape)):>20}  {ms['ATen'][0]:8.2f} {ms['ATen'][1]:6.2f}  "
              f"{ms['accrewrite'][0]:8.2f} {ms['accrewrite'][1]:6.2f}  {ratio:8.2f}x")


if __name__ == "__main__":
    main()
