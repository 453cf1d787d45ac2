"""Kernel benchmark: ours against PyTorch eager and torch.compile, side by side, on one CUDA GPU.

    python benchmarks/kernels.py [--kernels layer_norm,adam] [--warmup MS] [--rep MS]

For every case of every kernel (benchmarks/kernel_cases/<kernel>.py) it prints the median time of
one forward + backward (or optimizer step) from ``triton.testing.do_bench`` and the peak memory
that unit allocates, for ours and each baseline, and the ratios:
``speedup = baseline time / our time`` (above 1: ours is faster) and
``memory = our peak / baseline peak`` (below 1: ours needs less). All figures come from one run.

Goals (H100/H200-class GPU): layer_norm bf16 hidden 4096 >= 1.3x eager; AdamW >= 1.0x
torch fused and >= 1.5x foreach (eager); window_process >= 2x eager; bias_dropout_add >= 2x
eager; swin_fmha >= 1.25x eager.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernel_cases  # noqa: E402  (benchmarks/ is not a package)


def peak_memory(fn) -> int:
    """Bytes allocated at the peak of one ``fn()`` above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(fn, warmup: int, rep: int) -> tuple[float, int]:
    """(median milliseconds, peak bytes) of ``fn``; the first call also compiles what needs it."""
    import triton.testing

    fn()
    ms = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return ms, peak_memory(fn)


def format_row(name: str, ms: float, peak: int, ours_ms: float | None,
               ours_peak: int | None) -> str:
    row = f"  {name:<14} {ms:9.3f} ms {peak / 2**20:10.1f} MiB"
    if ours_ms is not None:
        memory = f"{ours_peak / peak:6.2f}x" if peak else "     -"
        row += f"   speedup {ms / ours_ms:5.2f}x   memory {memory}"
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(kernel_cases.kernel_names()),
                        help="comma-separated kernels (default: all of benchmarks/kernel_cases)")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench measuring time, ms")
    args = parser.parse_args(argv)
    names = [n for n in args.kernels.split(",") if n]
    unknown = sorted(set(names) - set(kernel_cases.kernel_names()))
    if unknown:
        known = ", ".join(kernel_cases.kernel_names())
        parser.error(f"no case module for {', '.join(unknown)}; known: {known}")
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py measures the Triton kernels on a CUDA GPU and none is "
              "available here; the CPU runs the PyTorch references only (their correctness is "
              "tested by tests/kernels).", file=sys.stderr)
        return 1

    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("speedup = baseline time / ours (>1: ours faster); memory = ours peak / baseline peak")
    for name in names:
        for case in kernel_cases.load(name).cases("cuda"):
            print(f"\n{case.name}")
            ours_ms, ours_peak = measure(case.ours, args.warmup, args.rep)
            print(format_row("ours", ours_ms, ours_peak, None, None))
            for baseline, fn in case.baselines().items():
                ms, peak = measure(fn, args.warmup, args.rep)
                print(format_row(baseline, ms, peak, ours_ms, ours_peak))
            del case
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
