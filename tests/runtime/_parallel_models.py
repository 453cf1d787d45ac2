"""Models of standard modules that hold parameters of their own at the top, for the
parallel runs (``test_accelerate_pipeline.py``), each with its batches and its training loop:

- ``GPT``: token embedding, a learned positional embedding as an ``nn.Parameter`` of the top
  module, pre-norm blocks of q/k/v/o projections and an MLP, final norm and head; the loss in
  its forward; ``CausalMHAGPT``, the same with causal ``nn.MultiheadAttention`` blocks;
  ``LogitsGPT``, the same returning its logits, for a loss outside the model;
- ``Llama``: ``nn.RMSNorm``, rotary positions from a buffer of the top module passed to every
  block, SwiGLU MLP, no biases;
- ``ViT``: a patch-embedding convolution, ``cls_token`` and ``pos_embed`` parameters, blocks of
  ``nn.MultiheadAttention``; the loss in its forward.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, HEADS, CONTEXT, BLOCKS = 32, 16, 4, 8, 4
IMAGE, PATCH, CLASSES = 12, 4, 5  # 9 patches and the class token: a sequence of 10
STEPS, GLOBAL_BATCH = 10, 8


class Attention(nn.Module):
    causal = True

    def __init__(self, bias=True):
        super().__init__()
        self.num_heads, self.head_dim = HEADS, WIDTH // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(4))

    def forward(self, x, rotation=None):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if rotation is not None:
            q, k = q * rotation, k * rotation
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(y.transpose(1, 2).reshape(*x.shape[:-1], -1))


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH)
        self.up_proj, self.down_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.down_proj(F.gelu(self.up_proj(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        self.h = nn.ModuleList(GPTBlock() for _ in range(BLOCKS))
        self.ln_f, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.pos[:tokens.shape[1]]
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class EncoderGPT(GPT):
    """The GPT with attention that is not causal: every token sees the whole sequence."""

    def __init__(self):
        super().__init__()
        for block in self.h:
            block.attn.causal = False


class LogitsGPT(GPT):
    """The GPT whose forward returns the logits, classes along dim 1, for a loss computed
    outside the model (``criterion(model(tokens), targets)``)."""

    def forward(self, tokens):
        x = self.wte(tokens) + self.pos[:tokens.shape[1]]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)).transpose(1, 2)


class CausalMHABlock(GPTBlock):
    """The block with ``nn.MultiheadAttention``, called as a causal GPT calls it: a mask and the
    ``is_causal`` hint."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)

    def forward(self, x):
        h = self.ln_1(x)
        mask = torch.ones(h.shape[1], h.shape[1], dtype=torch.bool).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, is_causal=True, need_weights=False)[0]
        return x + self.down_proj(F.gelu(self.up_proj(self.ln_2(x))))


class CausalMHAGPT(GPT):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(CausalMHABlock() for _ in range(BLOCKS))


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = nn.RMSNorm(WIDTH), Attention(bias=False)
        self.post_attention_layernorm = nn.RMSNorm(WIDTH)
        self.gate_proj, self.up_proj = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.down_proj = nn.Linear(3 * WIDTH, WIDTH, bias=False)

    def forward(self, x, rotation):
        x = x + self.self_attn(self.input_layernorm(x), rotation)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.register_buffer("rotation", torch.cos(torch.arange(CONTEXT)[:, None] / (1 + torch.arange(WIDTH // HEADS))))
        self.layers = nn.ModuleList(LlamaBlock() for _ in range(BLOCKS))
        self.norm, self.lm_head = nn.RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, targets):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.rotation)  # the sequences are CONTEXT long
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ViTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        patches = (IMAGE // PATCH) ** 2
        self.patch_embed = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, WIDTH) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock() for _ in range(BLOCKS)))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES)

    def forward(self, images, labels):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return F.cross_entropy(self.head(x[:, 0]), labels)


MODELS = {"gpt": GPT, "gpt_encoder": EncoderGPT, "gpt_logits": LogitsGPT, "gpt_mha": CausalMHAGPT, "llama": Llama,
          "vit": ViT}


def build(name):
    torch.manual_seed(0)
    return MODELS[name]()


def dataset(name, batches=STEPS, batch=GLOBAL_BATCH):
    generator = torch.Generator().manual_seed(1)
    if name == "vit":
        images = torch.randn(batches * batch, 3, IMAGE, IMAGE, generator=generator)
        return TensorDataset(images, torch.randint(CLASSES, (batches * batch,), generator=generator))
    tokens = torch.randint(VOCAB, (batches * batch, CONTEXT + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def loader(name, batch=GLOBAL_BATCH):
    return DataLoader(dataset(name), batch_size=batch)


def train(model, batches, step, lr=0.1):
    """Per-step losses of SGD with momentum, ``step(model, inputs)`` giving a step's loss after
    its backward."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for inputs in batches:
        optimizer.zero_grad()
        losses.append(step(model, inputs))
        optimizer.step()
    return losses


def backward_step(model, inputs):
    loss = model(*inputs)
    loss.backward()
    return loss.detach()


def reference(name):
    """One process's losses, final parameters and loss on the first batch after training."""
    model = build(name)
    losses = train(model, loader(name), backward_step)
    with torch.no_grad():
        evaluated = model(*next(iter(loader(name)))).item()
    return [loss.item() for loss in losses], model.state_dict(), evaluated
