"""A small GPT trained in the shape of nanoGPT's ``train.py``.

``get_batch()`` samples random windows and moves them with ``.pin_memory().to(device,
non_blocking=True)`` on CUDA; mixed precision through ``ctx = nullcontext() if device_type == 'cpu'
else torch.amp.autocast(...)`` and ``torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))``;
gradient accumulation over ``micro_step`` with ``clip_grad_norm_`` after ``scaler.unscale_``;
DistributedDataParallel with ``model.module`` when launched by torchrun. The data is a synthetic
token stream held in memory (no downloads), the model is tiny, and it runs in seconds on a CPU.

    python train.py --steps 20
    torchrun --standalone --nproc_per_node=2 train.py --steps 20
"""
import os


def enable_torchacc_compiler():
    return os.getenv('TORCHACC_COMPILER_OPT') is not None
if enable_torchacc_compiler():
    from torchacc.runtime import hooks
    hooks.enable_fused_layer_norm()

import argparse
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

if enable_torchacc_compiler():
    import torchacc.torch_xla.core.xla_model as xm
    import torchacc.torch_xla.distributed.xla_backend
    from torchacc.torch_xla.amp import autocast
    from torchacc.torch_xla.amp import GradScaler


# -----------------------------------------------------------------------------
# the model: nanoGPT's, scaled down


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0},
        ]
        use_fused = device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)
        return optimizer


# -----------------------------------------------------------------------------
# configuration (nanoGPT reads these from config files and --key=value; argparse here)

parser = argparse.ArgumentParser()
parser.add_argument('--steps', type=int, default=20, help='max_iters')
parser.add_argument('--out_dir', default='', help='write ckpt.pt here when set')
parser.add_argument('--eval_interval', type=int, default=10)
parser.add_argument('--eval_iters', type=int, default=2)
parser.add_argument('--gradient_accumulation_steps', type=int, default=2)
parser.add_argument('--batch_size', type=int, default=8)
parser.add_argument('--learning_rate', type=float, default=1e-3)
parser.add_argument('--compile', action='store_true')
args = parser.parse_args()

out_dir = args.out_dir
eval_interval = args.eval_interval
log_interval = 1
eval_iters = args.eval_iters
gradient_accumulation_steps = args.gradient_accumulation_steps
batch_size = args.batch_size
block_size = 32
learning_rate = args.learning_rate
max_iters = args.steps
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 5
lr_decay_iters = max_iters
min_lr = learning_rate / 10
backend = 'nccl' if torch.cuda.is_available() else 'gloo'
if enable_torchacc_compiler():
    device = xm.xla_device()
    xm.set_replication(device, [device])
else:
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
compile = args.compile

# -----------------------------------------------------------------------------
# various inits, derived attributes, I/O setup

ddp = int(os.environ.get('RANK', -1)) != -1  # is this a ddp run?
if ddp:
    if enable_torchacc_compiler():
        init_process_group(backend='xla', init_method='env://')
    else:
        init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    if enable_torchacc_compiler():
        if True:
            if enable_torchacc_compiler():
                device = xm.xla_device()
            else:
                device = f'cuda:{ddp_local_rank}'
                torch.cuda.set_device(device)
        xm.set_replication(device, [device])
    else:
        if torch.cuda.is_available():
            device = f'cuda:{ddp_local_rank}'
            torch.cuda.set_device(device)
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
    # world_size number of processes will be training simultaneously, so we can scale
    # down the desired gradient accumulation iterations per process proportionally
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    # if not ddp, we are running on a single gpu, and one process
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")

if master_process and out_dir:
    os.makedirs(out_dir, exist_ok=True)
if enable_torchacc_compiler():
    xm.set_rng_state(1337 + seed_offset)
else:
    torch.manual_seed(1337 + seed_offset)
torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul
torch.backends.cudnn.allow_tf32 = True  # allow tf32 on cudnn
if enable_torchacc_compiler():
    device_type = 'cuda' if 'cuda' in str(device) else 'cpu'  # for later use in torch.autocast
else:
    device_type = 'cuda' if 'cuda' in device else 'cpu'  # for later use in torch.autocast
# note: float16 data type will automatically use a GradScaler
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
if enable_torchacc_compiler():
    ctx = nullcontext() if device_type == 'cpu' else autocast(dtype=ptdtype)
else:
    ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# a synthetic "text": a noisy repeating sequence over a 64-token vocabulary
stream = torch.Generator().manual_seed(0)
pattern = torch.randint(0, 64, (97,), generator=stream)
data = pattern.repeat(200)
noise = torch.rand(data.shape, generator=stream) < 0.1
data[noise] = torch.randint(0, 64, (int(noise.sum()),), generator=stream)
train_data, val_data = data[:18000], data[18000:]


# poor man's data loader
def get_batch(split):
    data = train_data if split == 'train' else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    if device_type == 'cuda':
        # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


iter_num = 0
best_val_loss = 1e9

# model init
gptconf = GPTConfig(block_size=block_size)
model = GPT(gptconf)
if enable_torchacc_compiler():
    torch.__future__.set_swap_module_params_on_conversion(True)
model.to(device)

# initialize a GradScaler. If enabled=False scaler is a no-op
if enable_torchacc_compiler():
    scaler = GradScaler(enabled=(dtype == 'float16'))
else:
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))

# optimizer
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)

# compile the model
if compile:
    print("compiling the model... (takes a ~minute)")
    if enable_torchacc_compiler():
        model = torch.compile(model, backend='openxla')  # requires PyTorch 2.0
    else:
        model = torch.compile(model)  # requires PyTorch 2.0

# wrap model into DDP container
if not enable_torchacc_compiler():
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank] if torch.cuda.is_available() else None)


# helps estimate an arbitrarily accurate loss over either split using many batches
@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


# learning rate decay scheduler (cosine with warmup)
def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# training loop
X, Y = get_batch('train')  # fetch the very first batch
t0 = time.time()
if enable_torchacc_compiler():
    raw_model = model  # unwrap DDP container if needed
else:
    raw_model = model.module if ddp else model  # unwrap DDP container if needed
while True:

    # determine and set the learning rate for this iteration
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr

    # evaluate the loss on train/val sets and write checkpoints
    if iter_num % eval_interval == 0 and iter_num > 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses['val'] < best_val_loss and out_dir:
            best_val_loss = losses['val']
            checkpoint = {
                'model': raw_model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'iter_num': iter_num,
                'best_val_loss': best_val_loss,
            }
            print(f"saving checkpoint to {out_dir}")
            torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    # and using the GradScaler if data type is float16
    for micro_step in range(gradient_accumulation_steps):
        if not enable_torchacc_compiler():
            if ddp:
                # in DDP training we only need to sync gradients at the last micro step.
                model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        X, Y = get_batch('train')
        # backward pass, with gradient scaling if training in fp16
        scaler.scale(loss).backward()
    if enable_torchacc_compiler():
        gradients = xm._fetch_gradients(optimizer)
        xm.all_reduce('sum', gradients, scale=1.0 / xm.xrt_world_size())
    # clip the gradient
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    # step the optimizer and scaler if training in fp16
    scaler.step(optimizer)
    scaler.update()
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)

    # timing and logging
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        # get loss as float. note: this is a CPU-GPU sync point
        # scale up to undo the division above, approximating the true total loss (exact would have been a sum)
        lossf = loss.item() * gradient_accumulation_steps
        print(f"step {iter_num} loss {lossf:.4f}, time {dt * 1000:.2f}ms")
    iter_num += 1

    # termination conditions
    if iter_num >= max_iters:
        break
    if enable_torchacc_compiler():
        xm.mark_step()

if ddp:
    destroy_process_group()
