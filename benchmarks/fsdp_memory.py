"""Per-rank peak memory and step time of ``accelerate``'s parallelisms against DDP at 2 and 4 ranks.

FSDP, tensor parallel (TP), FSDP x TP, context parallel (SP) and pipeline parallel (PP), on a GPT
built from standard PyTorch modules (``nn.MultiheadAttention``, an ``nn.Sequential`` MLP) and on
a Llama-shaped model (RMSNorm, grouped-query attention with rotary embeddings, a gated SiLU
MLP). TP's plans are the ones ``accelerate`` derives from the blocks' structure. Context parallel (Ulysses) runs on the GPT
only: the Llama's layers hold rotary tables for the whole sequence, which do not broadcast
against a part of it.

    python benchmarks/fsdp_memory.py [--models gpt,llama] [--blocks 4] [--dim 256] [--heads 8]
                                     [--vocab 2048] [--seq 64] [--batch 2] [--steps 3] [--worlds 2,4]
                                     [--setups "DDP,SP 2"]

Every setup trains on the same global batch: ``--batch`` sequences per data-parallel rank of
DDP and FSDP, ``--batch * tp * sp * pp`` per tensor-, context- or pipeline-parallel group (its
ranks read the same batch; a pipeline splits it into one micro-batch per stage, of ``--batch``
sequences, with the 1F1B schedule). At 2 ranks: DDP, FSDP over 2, TP over 2, SP over 2, PP over
2; at 4: DDP, FSDP over 4, TP over 4, FSDP over 2 x TP over 2, SP over 4, FSDP over 2 x SP over
2, PP over 4, FSDP over 2 x PP over 2; ``--setups`` keeps the named ones and DDP.

Peak memory, on the CPU: each rank's resident-set high-water mark during the steps (warm-up
included), above its resident set before the model was built, after one untimed round of every
setup has loaded what a first use loads; glibc serves allocations over
64 KiB by mmap, so freed tensors leave the resident set at once. It is what the step holds:
parameters, gradients, AdamW state, activations, temporaries and communication buffers (DDP's
gradient buckets, FSDP's all-gathers). The largest over the ranks is reported. With CUDA:
``torch.cuda.max_memory_allocated``. "At rest": the bytes of a rank's own parameters,
gradients and AdamW state after a step. Step time: the median of ``--steps`` steps after a
warm-up, each started after a barrier; on gloo it is dominated by the CPU collectives and by
the ranks sharing the cores, not by what a GPU would see.

On GPUs (one per rank, NCCL), the same script:

    CUDA_VISIBLE_DEVICES=0,1,2,3 python benchmarks/fsdp_memory.py --worlds 2,4 --blocks 12 --dim 1024 \
        --heads 16 --seq 1024 --batch 4
"""

import argparse
import gc
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


class MHABlock(nn.Module):
    """A pre-norm GPT block of standard modules."""

    def __init__(self, dim, heads, seq):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(args.vocab, args.dim), nn.Embedding(args.seq, args.dim)
        self.h = nn.ModuleList(MHABlock(args.dim, args.heads, args.seq) for _ in range(args.blocks))
        self.ln_f, self.lm_head = nn.LayerNorm(args.dim), nn.Linear(args.dim, args.vocab)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        return F.cross_entropy(self.lm_head(self.ln_f(x)).flatten(0, 1), targets.flatten())


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        repeat = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args):
        super().__init__()
        head_dim = args.dim // args.heads
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(args.dim), nn.RMSNorm(args.dim)
        self.self_attn = LlamaAttention(args.dim, args.heads, kv_heads=max(1, args.heads // 2))
        self.mlp = LlamaMLP(args.dim, 64 * ((8 * args.dim // 3 + 63) // 64))
        angles = torch.outer(torch.arange(args.seq).float(),
                             1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x), self.cos, self.sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab, args.dim)
        self.layers = nn.ModuleList(LlamaDecoderLayer(args) for _ in range(args.blocks))
        self.norm, self.lm_head = nn.RMSNorm(args.dim), nn.Linear(args.dim, args.vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.lm_head(self.norm(x)).flatten(0, 1), targets.flatten())


MODELS = {"gpt": GPT, "llama": Llama}


def setups(world: int, model_name: str, args) -> dict:
    """``{name: {config.dist section: size}}``; DDP is ``{}``."""
    found = {"DDP": {}, f"FSDP {world}": {"fsdp": world}, f"TP {world}": {"tp": world}}
    if world >= 4:
        found[f"FSDP {world // 2} x TP 2"] = {"fsdp": world // 2, "tp": 2}
    found[f"PP {world}"] = {"pp": world}
    if world >= 4:
        found[f"FSDP {world // 2} x PP 2"] = {"fsdp": world // 2, "pp": 2}
    if model_name == "gpt":  # see the module docstring
        found[f"SP {world}"] = {"sp": world}
        if world >= 4:
            found[f"FSDP {world // 2} x SP 2"] = {"fsdp": world // 2, "sp": 2}
    wanted = set(found) if args.setups is None else {"DDP", *args.setups.split(",")}  # DDP: the baseline
    return {name: sizes for name, sizes in found.items() if name in wanted}


def _bytes(tensor) -> int:
    tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return tensor.numel() * tensor.element_size()


def model_state_bytes(model, optimizer) -> dict:
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return {"parameters": sum(map(_bytes, params)),
            "gradients": sum(_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(map(_bytes, state))}


def _resident(field: str) -> int:
    with open("/proc/self/status") as status:
        return 1024 * next(int(line.split()[1]) for line in status if line.startswith(field))


def _reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # Linux >= 4.0


def _step(model, inputs, targets):
    model(inputs, targets).backward()


def _pipeline_step(model, inputs, targets):
    model.forward_backward(inputs, targets)


def _measure(model_name, setup, args, device, rank, steps) -> dict:
    cuda = device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = _resident("VmRSS:")
    _reset_high_water_mark()
    torch.manual_seed(0)
    model = MODELS[model_name](args).to(device)
    group = setup.get("tp", 1) * setup.get("sp", 1) * setup.get("pp", 1)
    if not setup:
        wrapped = DistributedDataParallel(model)
    else:
        config = Config()
        for section, size in setup.items():
            getattr(config.dist, section).size = size
        config.dist.pp.num_micro_batches = setup.get("pp", 1)  # one micro-batch of --batch per stage
        wrapped = model = accelerate(model, config=config)
    train_step = _pipeline_step if "pp" in setup else _step
    generator = torch.Generator().manual_seed(rank // group)  # the ranks of a TP, SP or PP group read one batch
    tokens = torch.randint(args.vocab, (args.batch * group, args.seq + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
    times = []
    for step in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        train_step(wrapped, inputs, targets)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if step:  # the first is the warm-up
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else _resident("VmHWM:") - before
    return {"at_rest": sum(model_state_bytes(model, optimizer).values()), "peak": peak,
            "step_s": statistics.median(times) if times else None}


def run(rank, world, port, args, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    for model_name in args.models.split(","):  # what the first use of each loads or caches stays loaded
        for setup in setups(world, model_name, args).values():
            _measure(model_name, setup, args, device, rank, steps=0)
    results = {}
    for model_name in args.models.split(","):
        for name, setup in setups(world, model_name, args).items():
            measured = _measure(model_name, setup, args, device, rank, args.steps)
            every = [None] * world
            dist.all_gather_object(every, measured)
            results[model_name, name] = {"at_rest": max(m["at_rest"] for m in every),
                                         "peak": max(m["peak"] for m in every),
                                         "step_s": measured["step_s"]}
    if rank == 0:
        torch.save(results, os.path.join(outdir, f"{world}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,llama")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2, help="sequences per data-parallel rank")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--setups", default=None, help="comma-separated setup names, as the table gives them")
    args = parser.parse_args(argv)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # read by the ranks' glibc at start
    mib = 1 << 20
    print(f"{args.blocks} blocks, dim {args.dim}, {args.heads} heads, vocab {args.vocab}, seq {args.seq}, "
          f"batch {args.batch} per data-parallel rank, AdamW, float32; "
          f"{'NCCL, cuda peak' if torch.cuda.is_available() else 'gloo (CPU), resident-set peak'}")
    print("| model | ranks | setup | at rest MiB | peak MiB | peak / DDP | step s | step / DDP |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as outdir:
        for world in map(int, args.worlds.split(",")):
            mp.spawn(run, args=(world, _free_port(), args, outdir), nprocs=world)
            results = torch.load(os.path.join(outdir, f"{world}.pt"))
            for model_name in args.models.split(","):
                ddp = results[model_name, "DDP"]
                for name in setups(world, model_name, args):
                    r = results[model_name, name]
                    print(f"| {model_name} | {world} | {name} | {r['at_rest'] / mib:.1f} | {r['peak'] / mib:.1f} | "
                          f"{r['peak'] / ddp['peak']:.2f}x | {r['step_s']:.3f} | {r['step_s'] / ddp['step_s']:.2f}x |")


if __name__ == "__main__":
    main()
