"""FSDP2 through ``accelerate`` vs DDP on a 12-block GPT: per-rank memory of parameters,
gradients and optimizer state, and step time, at 2 and 4 gloo ranks side by side.

    python benchmarks/fsdp_memory.py [--blocks 12] [--dim 256] [--vocab 2048] [--seq 128]
                                     [--batch 4] [--steps 5] [--worlds 2,4]

Goals: FSDP's per-rank peak at most 0.6x DDP's at 2 ranks and 0.35x at 4.

Memory is counted, not sampled: the bytes of each rank's parameters, gradients and AdamW state
after a step (the local shards under FSDP), plus, for FSDP, what a step holds unsharded on top:
the root's parameters (embeddings, head), the all-gathered parameters of the computing layer
and of the ``prefetch`` layers gathered ahead, and one layer's unsharded gradients before their
reduce-scatter. DDP's gradient buckets (another copy of the gradients) are not counted, which
favours DDP. Step time is the median of ``--steps`` timed steps after a warm-up, each started
after a barrier; on gloo it is dominated by the CPU collectives, not by what a GPU would see.

The figures a GPU machine must give (NCCL; overlap of all-gathers with compute; step time vs
DDP) come from the same script:

    CUDA_VISIBLE_DEVICES=0,1,2,3 python benchmarks/fsdp_memory.py --worlds 2,4 --dim 1024 --seq 1024 --batch 8

where each rank takes GPU ``rank`` (NCCL) and the peak is also read from
``torch.cuda.max_memory_allocated``.
"""

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from accrewrite.runtime import Config, accelerate


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.up_proj, self.down_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.ln_1(x)
        shape = (*h.shape[:-1], -1, self.head_dim)
        q, k, v = (p(h).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.o_proj(y)
        return x + self.down_proj(F.gelu(self.up_proj(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(args.vocab, args.dim), nn.Embedding(args.seq, args.dim)
        self.h = nn.ModuleList(Block(args.dim, 8) for _ in range(args.blocks))
        self.ln_f, self.lm_head = nn.LayerNorm(args.dim), nn.Linear(args.dim, args.vocab)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        return F.cross_entropy(self.lm_head(self.ln_f(x)).flatten(0, 1), targets.flatten())


def _bytes(tensor) -> int:
    tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return tensor.numel() * tensor.element_size()


def _full_bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)  # numel of a DTensor is the full one


def model_state_bytes(model, optimizer) -> dict:
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return {"parameters": sum(map(_bytes, params)),
            "gradients": sum(_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(map(_bytes, state))}


def fsdp_transient_bytes(model, prefetch: int) -> int:
    layers = [_full_bytes(block.parameters()) for block in model.h]
    root = _full_bytes(model.parameters()) - sum(layers)
    return root + (1 + prefetch) * max(layers) + max(layers)  # + one layer's unsharded gradients


def run(rank, world, port, args, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    results = {}
    for method in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = GPT(args).to(device)
        if method == "ddp":
            wrapped = DistributedDataParallel(model)
        else:
            config = Config()
            config.dist.fsdp.size = world
            wrapped = model = accelerate(model, config=config)
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(args.steps + 1):
            dist.barrier()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            wrapped(tokens[:, :-1], tokens[:, 1:]).backward()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            if step:  # the first is the warm-up
                times.append(time.perf_counter() - start)
        states = model_state_bytes(model, optimizer)
        at_rest = sum(states.values())
        transient = fsdp_transient_bytes(model, config.dist.fsdp.prefetch) if method == "fsdp" else 0
        results[method] = {**states, "at_rest": at_rest, "peak": at_rest + transient,
                           "step_s": statistics.median(times),
                           "cuda_peak": torch.cuda.max_memory_allocated() if cuda else None}
        del wrapped, model, optimizer
    if rank == 0:
        torch.save(results, os.path.join(outdir, f"{world}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4, help="per rank")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worlds", default="2,4")
    args = parser.parse_args(argv)
    goals = {2: 0.6, 4: 0.35}
    mib = 1 << 20
    print(f"{args.blocks}-block GPT, dim {args.dim}, vocab {args.vocab}, seq {args.seq}, batch {args.batch}/rank, "
          f"AdamW; {'NCCL' if torch.cuda.is_available() else 'gloo (CPU)'}")
    print(f"{'ranks':>5} {'method':>6} {'params':>9} {'grads':>9} {'optim':>9} {'at rest':>9} {'peak':>9} "
          f"{'step s':>8}   MiB per rank")
    with tempfile.TemporaryDirectory() as outdir:
        for world in map(int, args.worlds.split(",")):
            mp.spawn(run, args=(world, _free_port(), args, outdir), nprocs=world)
            results = torch.load(os.path.join(outdir, f"{world}.pt"))
            for method, r in results.items():
                print(f"{world:>5} {method:>6} {r['parameters'] / mib:9.2f} {r['gradients'] / mib:9.2f} "
                      f"{r['optimizer'] / mib:9.2f} {r['at_rest'] / mib:9.2f} {r['peak'] / mib:9.2f} "
                      f"{r['step_s']:8.3f}" + (f"   cuda peak {r['cuda_peak'] / mib:.1f}" if r["cuda_peak"] else ""))
            ddp, fsdp = results["ddp"], results["fsdp"]
            ratio = fsdp["peak"] / ddp["peak"]
            goal = goals.get(world)
            verdict = "" if goal is None else f" (goal <= {goal}x: {'met' if ratio <= goal else 'NOT met'})"
            print(f"      {world} ranks: FSDP/DDP peak {ratio:.2f}x{verdict}, at rest "
                  f"{fsdp['at_rest'] / ddp['at_rest']:.2f}x, step time {fsdp['step_s'] / ddp['step_s']:.2f}x")


if __name__ == "__main__":
    main()
