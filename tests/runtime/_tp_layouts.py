"""Tiny language models whose blocks are laid out as real models lay theirs out, for the
tensor-parallel plans derived from structure: torch.nn's own modules (``nn.MultiheadAttention``
with ``batch_first`` either way, ``nn.Sequential`` MLPs, ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer`` with ``norm_first`` either way), GPT-2's ``Conv1D`` with a fused
q/k/v, Llama's grouped-query attention with rotary embeddings and gated MLP, and BERT's
``attention.self``/``intermediate``/``output``. Projections have names of no known layout where
the real model's names would not be in a table either.

``build(layout)`` gives the model (the same weights for a given layout); ``model(tokens,
targets)`` is the mean cross-entropy.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, CONTEXT, BLOCKS = 32, 16, 4, 8, 2


def _causal(boolean: bool):
    mask = torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).triu(1)  # True: not attended
    return mask if boolean else torch.zeros(CONTEXT, CONTEXT).masked_fill(mask, float("-inf"))


class Conv1D(nn.Module):
    """GPT-2's projection as transformers defines it: weight (in, out), ``y = x @ W + b``."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class MHABlock(nn.Module):
    """A GPT block of standard modules: ``nn.MultiheadAttention`` and an ``nn.Sequential`` MLP."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=batch_first)
        if batch_first:
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        else:
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Dropout(0.0),
                                     nn.Linear(4 * WIDTH, WIDTH))
        self.register_buffer("mask", _causal(boolean=batch_first), persistent=False)

    def forward(self, x):
        h = self.ln_1(x)
        if self.batch_first:  # the weights are not asked for: the attention runs through SDPA
            a = self.attn(h, h, h, attn_mask=self.mask, need_weights=False, is_causal=True)[0]
        else:  # (seq, batch, width), the weights computed and averaged as by default
            h = h.transpose(0, 1)
            a = self.attn(h, h, h, attn_mask=self.mask)[0].transpose(0, 1)
        x = x + a
        return x + self.mlp(self.ln_2(x))


class FusedConv1DBlock(nn.Module):
    """GPT-2's layout (one fused q/k/v ``Conv1D`` split in three, ``split_size`` wide) with
    names no table holds."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.split_size = HEADS, WIDTH
        self.norm_a, self.norm_b = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.mix, self.back = Conv1D(3 * WIDTH, WIDTH), Conv1D(WIDTH, WIDTH)
        self.widen, self.narrow = Conv1D(4 * WIDTH, WIDTH), Conv1D(WIDTH, 4 * WIDTH)

    def forward(self, x):
        q, k, v = self.mix(self.norm_a(x)).split(self.split_size, dim=2)
        B, T, C = q.shape
        q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.back(y.transpose(1, 2).reshape(B, T, C))
        return x + self.narrow(F.gelu(self.widen(self.norm_b(x)), approximate="tanh"))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Llama's: RMSNorm, grouped-query attention (2 k/v heads for 4 q heads) with rotary
    embeddings, and a gated SiLU MLP."""

    def __init__(self, kv_heads=2):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = HEADS, kv_heads, WIDTH // HEADS
        self.attention_norm, self.ffn_norm = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
        self.wq = nn.Linear(WIDTH, WIDTH, bias=False)
        self.wk = nn.Linear(WIDTH, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(WIDTH, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(WIDTH, WIDTH, bias=False)
        self.gate, self.up = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.down = nn.Linear(3 * WIDTH, WIDTH, bias=False)
        frequencies = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2) / self.head_dim)
        angles = torch.outer(torch.arange(CONTEXT).float(), frequencies)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, self.cos, self.sin), _rotate(k, self.cos, self.sin)
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class BertSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = HEADS, WIDTH // HEADS
        self.all_head_size = WIDTH
        self.query, self.key, self.value = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.dropout = nn.Dropout(0.0)

    def heads(self, x):
        return x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)).permute(0, 2, 1, 3)

    def forward(self, hidden, mask):
        q, k, v = self.heads(self.query(hidden)), self.heads(self.key(hidden)), self.heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size) + mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.all_head_size,))


class BertDenseNorm(nn.Module):
    """BERT's ``*Output``: a projection, dropout, and the norm of it plus the residual."""

    def __init__(self, width_in):
        super().__init__()
        self.dense, self.LayerNorm, self.dropout = nn.Linear(width_in, WIDTH), nn.LayerNorm(WIDTH), nn.Dropout(0.0)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.self, self.output = BertSelfAttention(), BertDenseNorm(WIDTH)

    def forward(self, hidden, mask):
        return self.output(self.self(hidden, mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(WIDTH, 4 * WIDTH)

    def forward(self, hidden):
        return F.gelu(self.dense(hidden))


class BertLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.intermediate, self.output = BertAttention(), BertIntermediate(), BertDenseNorm(4 * WIDTH)
        self.register_buffer("mask", _causal(boolean=False), persistent=False)

    def forward(self, hidden):
        hidden = self.attention(hidden, self.mask)
        return self.output(self.intermediate(hidden), hidden)


class LM(nn.Module):
    """Embeddings, ``blocks`` (a ModuleList of one class), a final norm and the head."""

    def __init__(self, block):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(block() for _ in range(BLOCKS))
        self.ln_f, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return F.cross_entropy(self.lm_head(self.ln_f(x)).flatten(0, 1), targets.flatten())


class Seq2Seq(nn.Module):
    """``nn.TransformerEncoder`` over the tokens reversed, ``nn.TransformerDecoder`` over the
    tokens (causal), the decoder's ``norm_first`` the opposite of the encoder's."""

    def __init__(self, encoder_norm_first: bool, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        layer = dict(d_model=WIDTH, nhead=HEADS, dim_feedforward=3 * WIDTH, dropout=0.0, batch_first=batch_first)
        self.embed, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer, norm_first=encoder_norm_first, activation="gelu"), BLOCKS,
            enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer, norm_first=not encoder_norm_first),
                                             BLOCKS)
        self.lm_head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", _causal(boolean=False), persistent=False)

    def forward(self, tokens, targets):
        positions = self.wpe(torch.arange(tokens.shape[1]))
        source, target = self.embed(tokens.flip(1)) + positions, self.embed(tokens) + positions
        if not self.batch_first:
            source, target = source.transpose(0, 1), target.transpose(0, 1)
        y = self.decoder(target, self.encoder(source), tgt_mask=self.mask, tgt_is_causal=True)
        if not self.batch_first:
            y = y.transpose(0, 1)
        return F.cross_entropy(self.lm_head(y).flatten(0, 1), targets.flatten())


LAYOUTS = {
    "mha_batch_first": lambda: LM(lambda: MHABlock(batch_first=True)),
    "mha_seq_first_weights": lambda: LM(lambda: MHABlock(batch_first=False)),
    "conv1d_fused": lambda: LM(FusedConv1DBlock),
    "llama_gqa": lambda: LM(LlamaBlock),
    "bert": lambda: LM(BertLayer),
    "encoder_post_decoder_pre": lambda: Seq2Seq(encoder_norm_first=False, batch_first=True),
    "encoder_pre_decoder_post": lambda: Seq2Seq(encoder_norm_first=True, batch_first=False),
}


def build(layout: str) -> nn.Module:
    torch.manual_seed(0)
    return LAYOUTS[layout]()


def split_packed_attention(state: dict) -> dict:
    """A state dict of ``nn.MultiheadAttention`` modules with their packed q/k/v named as the
    split modules name them (``q_proj.weight``...), to compare with a split model's."""
    split = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        if leaf in ("in_proj_weight", "in_proj_bias"):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                split[f"{prefix}.{name}.{leaf.rpartition('_')[2]}"] = part
        else:
            split[key] = value
    return split
