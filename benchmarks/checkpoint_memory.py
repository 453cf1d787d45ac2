"""auto_checkpoint on a CPU GPT: peak memory and step time of forward + backward, side by side.

    python benchmarks/checkpoint_memory.py [--model gpt] [--blocks 12] [--dim 128] [--seq 256] [--batch 8]

``--model gpt`` is the GPT below; ``--model hf-gpt2`` is transformers' GPT-2 of the same sizes,
built from its config (nothing downloaded): blocks of another layout (``Conv1D`` projections,
its own attention module), on which ``auto_checkpoint``'s policy and estimate were not tuned.

Goals: every block checkpointed brings the peak to at most 0.40x the un-checkpointed
peak at most 1.25x the step time; with a budget b the measured peak ratio is at most b + 0.04
at most 1.3x the step time.
Every block is measured both ways: selective (auto_checkpoint's default, which keeps attention
and down-projection outputs) and full recomputation (plain ``torch.utils.checkpoint``).

Peak memory is measured in a fresh subprocess per configuration, two ways:

- per step: after a warm-up step (which is also the budget's calibration step) the kernel's
  resident-set high-water mark is reset (``/proc/self/clear_refs``), one forward + backward runs,
  and the peak is the high-water mark minus the resident set before the step: the activations,
  gradients and temporaries of the step. glibc is told to serve every allocation over 64 KiB by
  mmap (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave the resident set at once.
- over a whole run, as a user's process sees it: the high-water mark of ``--run-steps`` steps
  from the first (a budget's calibration included) above the resident set before them, with
  glibc's default allocator and with the 64 KiB mmap threshold. The default's threshold rises
  to the size of the largest mmap'd block freed, so later tensors up to that size come from the
  heap, whose freed pages stay resident: the resident set then follows the heap's high-water
  mark, not the live tensors. Both runs import ``torch._dynamo`` before their baseline: the first
  ``torch.utils.checkpoint`` call loads it, a fixed cost of the process and not of the step.

Step times come from the parent process, which alternates steps of the plain and the
checkpointed models (same weights; a budget's calibration in the warm-up round); a model's
time is the median of its steps, and its ratio the median over the rounds of its step over the
plain step of the same round, so that load from other processes, which changes from one second
to the next, cancels.
"""

import argparse
import copy
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from accrewrite.runtime import auto_checkpoint


class Block(nn.Module):
    """A pre-norm GPT-2 block."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x, attn_mask=None, cu_seqlens=None):
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        if cu_seqlens is not None:
            attended = segment_attention(q, k, v, cu_seqlens, dropout)
        else:
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=dropout)
        x = x + F.dropout(self.proj(attended.transpose(1, 2).flatten(2)), self.dropout, self.training)
        return x + self.mlp(self.norm2(x))


def segment_attention(q, k, v, cu_seqlens, dropout=0.0):
    """Causal attention within each segment of each row: q, k, v ``[B, H, L, D]``, segment
    bounds per row in ``cu_seqlens`` ``[B, *]`` (PackedDataset's). What ``flash_attn_varlen``
    does in one kernel: no work is spent across documents."""
    rows = []
    for row, bounds in enumerate(cu_seqlens.tolist()):
        bounds = sorted(set(bounds))
        rows.append(torch.cat([
            F.scaled_dot_product_attention(q[row:row + 1, :, start:end], k[row:row + 1, :, start:end],
                                           v[row:row + 1, :, start:end], is_causal=True, dropout_p=dropout)
            for start, end in zip(bounds, bounds[1:])
        ], dim=2))
    return torch.cat(rows)


class GPT(nn.Module):
    """A small GPT-2: token and position embeddings, ``blocks`` blocks, an LM head.

    ``forward(input_ids, position_ids=None, attn_mask=None, cu_seqlens=None)``: attention is
    causal, or follows ``attn_mask``, or stays within the segments of ``cu_seqlens``; with
    ``position_ids`` and a block-diagonal mask or ``cu_seqlens`` it trains on packed rows. Dropout is
    0 by default, as nanoGPT pretrains (on the CPU, attention dropout also forces SDPA's math
    path, whose L x L matrices and RNG calls would dominate the step).
    """

    def __init__(self, vocab=2048, dim=128, heads=4, blocks=12, max_len=4096, dropout=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, dropout) for _ in range(blocks)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids=None, attn_mask=None, cu_seqlens=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, attn_mask, cu_seqlens)
        return self.head(self.norm(x))


class HFGPT2(nn.Module):
    """transformers' ``GPT2LMHeadModel`` from a config, returning its logits."""

    def __init__(self, vocab=2048, dim=128, heads=4, blocks=12, max_len=4096):
        # This folder's kernels.py would shadow the `kernels` package that transformers imports.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != here]
        from transformers import GPT2Config, GPT2LMHeadModel

        super().__init__()
        config = GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=dim, n_layer=blocks, n_head=heads,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                            use_cache=False)  # a cache grown in the forward differs in the recomputation
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, input_ids):
        return self.gpt2(input_ids).logits


MODELS = {"gpt": GPT, "hf-gpt2": HFGPT2}


def lm_loss(model, batch):
    logits = model(batch)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())


def make(args, budget):
    """The benchmark model and batch; ``budget`` is "plain", "selective", "full" or a fraction."""
    torch.manual_seed(0)
    model = MODELS[args.model](dim=args.dim, blocks=args.blocks)
    batch = torch.randint(0, 2048, (args.batch, args.seq))
    if budget in ("selective", "full"):
        auto_checkpoint(model, selective=budget == "selective")
    elif budget != "plain":
        auto_checkpoint(model, budget=float(budget))
    return model, batch


def step(model, batch):
    model.zero_grad(set_to_none=True)
    lm_loss(model, batch).backward()


def resident_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def reset_high_water_mark():
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # Linux >= 4.0


def measure_peak(args):
    """Child process: peak memory of one forward + backward above the memory held before it
    (``--run-steps`` > 0: of that many steps from the first, above the memory held before them)."""
    torch.set_num_threads(1)
    if args.run_steps:
        importlib.import_module("torch._dynamo")  # the first checkpoint call's import: see the module docstring
    model, batch = make(args, args.worker)
    if not args.run_steps:
        step(model, batch)  # warm-up; with a budget, the calibration step
        model.zero_grad(set_to_none=True)
    reset_high_water_mark()
    before = resident_kib("VmRSS:")
    for _ in range(args.run_steps or 1):
        step(model, batch)
    peak = (resident_kib("VmHWM:") - before) * 1024
    plan = getattr(model, "checkpoint_plan", None)
    modes = plan.modes if plan else []
    print(json.dumps({
        "peak": peak,
        "plan": f"{len(modes) - modes.count('plain')} ({modes.count('full')} full)" if plan else "0",
        "estimated": plan.estimated_ratio if plan else None,
    }))


def peak_in_subprocess(args, budget, run_steps=0, mmap_threshold="65536"):
    """The worker's figures; ``mmap_threshold`` None leaves glibc's default (dynamic) threshold."""
    env = {name: value for name, value in os.environ.items() if name != "MALLOC_MMAP_THRESHOLD_"}
    if mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = mmap_threshold
    command = [sys.executable, __file__, "--worker", str(budget), f"--run-steps={run_steps}",
               *(f"--{name}={getattr(args, name)}" for name in ("model", "blocks", "dim", "seq", "batch"))]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_peaks(args, budget):
    """Whole-run peaks: glibc's default allocator, then the 64 KiB mmap threshold."""
    return [peak_in_subprocess(args, budget, args.run_steps, threshold)["peak"] for threshold in (None, "65536")]


def step_times(args, repeats, budgets):
    """``{name: (median step seconds, median ratio to the plain step of the same round)}`` for
    the plain model, every block checkpointed and each budget, their steps alternating."""
    torch.set_num_threads(1)  # as the children: two threads on a shared, loaded machine thrash
    plain, batch = make(args, "plain")
    models = {"plain": plain,
              "selective": auto_checkpoint(copy.deepcopy(plain)),
              "full": auto_checkpoint(copy.deepcopy(plain), selective=False),
              **{budget: auto_checkpoint(copy.deepcopy(plain), budget=budget) for budget in budgets}}
    times = {name: [] for name in models}
    for _ in range(repeats + 1):  # the first round warms up
        for name, model in models.items():
            start = time.perf_counter()
            step(model, batch)
            times[name].append(time.perf_counter() - start)
    plain_times = times["plain"][1:]
    return {name: (statistics.median(values[1:]),
                   statistics.median(value / plain for value, plain in zip(values[1:], plain_times)))
            for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budgets", default="0.3,0.4,0.6")
    parser.add_argument("--run-steps", type=int, default=3, help="steps of the whole-run measure")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return measure_peak(args)

    print(f"{args.model}: {args.blocks} blocks, dim {args.dim}, seq {args.seq}, batch {args.batch}, fp32, CPU")
    budgets = [float(budget) for budget in args.budgets.split(",")]
    times = step_times(args, args.repeats, budgets)
    rows = [("no checkpointing", "plain", None),
            *((f"every block, {name}", name, (0.40, 1.25)) for name in ("selective", "full")),
            *((f"budget {budget:.2f}", budget, (budget + 0.04, 1.3)) for budget in budgets)]
    print(f"{'configuration':<26}{'checkpointed':>13}{'peak MiB':>10}{'ratio':>7}{'estimated':>10}"
          f"{'run':>6}{'run mmap':>9}{'step ms':>9}{'time':>7}  goal (ratio and run mmap; time)")
    for label, name, goal in rows:
        result, run = peak_in_subprocess(args, name), run_peaks(args, name)
        if name == "plain":
            plain, plain_run = result, run
        ratio = result["peak"] / plain["peak"]
        run_ratios = [peak / plain_peak for peak, plain_peak in zip(run, plain_run)]
        seconds, slowdown = times[name]
        estimated = "" if result["estimated"] is None else f"{result['estimated']:.2f}"
        line = (f"{label:<26}{result['plan']:>13}{result['peak'] / 2**20:>10.1f}{ratio:>7.2f}{estimated:>10}"
                f"{run_ratios[0]:>6.2f}{run_ratios[1]:>9.2f}{seconds * 1e3:>9.0f}{slowdown:>7.2f}")
        if goal:
            within = max(ratio, run_ratios[1]) <= goal[0] and slowdown <= goal[1]
            line += f"  <= {goal[0]:.2f}, <= {goal[1]}x {'ok' if within else 'MISSED'}"
        print(line)
    print(f"run: the peak over {args.run_steps} steps from the first, glibc's default allocator; run mmap: "
          f"allocations over 64 KiB mmap'd; no checkpointing: {plain_run[0] / 2**20:.1f} and "
          f"{plain_run[1] / 2**20:.1f} MiB")

if __name__ == "__main__":
    main()
