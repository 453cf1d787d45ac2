"""A small GPT trained with DistributedDataParallel under torchrun: the script that
``accrewrite migrate --parallel fsdp`` turns into FSDP2 (and ``--parallel tp`` into tensor
parallelism) through ``accrewrite.runtime.accelerate``.

The optimizer is built before the DDP wrap, as many scripts do; the blocks name their
projections as Llama and most transformer code does (q/k/v/o, gate/up/down), so that a
tensor-parallel plan is read off them; gradients are clipped. Synthetic tokens, no downloads;
one process without torchrun, gloo on the CPU. Launch it with torchrun:

    torchrun --standalone --nproc_per_node=2 train.py --steps 20
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import torch_xla.distributed.xla_backend
import torch_xla
import torch_xla.core.xla_model as xm
from torch_xla.amp import syncfree
import atexit
import torch_xla.distributed.parallel_loader as pl

VOCAB, WIDTH, HEADS, CONTEXT = 64, 32, 4, 16


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.q_proj = nn.Linear(WIDTH, WIDTH)
        self.k_proj = nn.Linear(WIDTH, WIDTH)
        self.v_proj = nn.Linear(WIDTH, WIDTH)
        self.o_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(*x.shape[:-1], -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down_proj = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(CONTEXT, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def token_dataset(samples):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (samples, CONTEXT + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


atexit.register(torch_xla.sync)


def main():
    parser = argparse.ArgumentParser(description="a small GPT under DDP")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(backend='xla', init_method='xla://')
    rank = dist.get_rank() if distributed else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch_xla.device()
    torch.manual_seed(0)
    xm.set_rng_state(0)

    dataset = token_dataset(args.steps * args.batch_size * 4)
    sampler = DistributedSampler(dataset, shuffle=False) if distributed else None
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.__future__.set_swap_module_params_on_conversion(True)
    model = GPT(args.layers).to(device)
    optimizer = syncfree.AdamW(model.parameters(), lr=1e-3)
    if distributed:
        xm.broadcast_master_param(model)

    model.train()
    for step, (tokens, targets) in enumerate(pl.MpDeviceLoader(loader, device)):
        if step >= args.steps:
            break
        loss = model(tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        xm.reduce_gradients(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if rank == 0:
            xm.add_step_closure(
                lambda step, loss: print(f"step {step} loss {loss.item():.4f}"),
                args=(step, loss.detach()),
                run_async=False)
    torch_xla.sync()

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
