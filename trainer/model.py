"""A small modern GPT (nanochat-like): rotary positions, parameter-free RMSNorm, QK-norm, ReLU^2 MLP,
no biases, untied input embedding and output head.

Untied embeddings (as nanochat) cost 2*V*C parameters instead of V*C, which is nothing at the
byte-level vocab (V = 257) and keeps the two matrices free to differ. Sized by `depth`: width
`n_embd = 64*depth`, heads of 64 (see TrainConfig).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# the sizes live in trainer/sizes.py (no torch there, for preflight); imported from here as before
from trainer.sizes import GPTConfig, estimate_train_memory, flops_per_token, param_count  # noqa: F401


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]  # (1, T, 1, D/2)


def apply_rotary(x, cos, sin):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = c.n_head, c.n_embd // c.n_head
        self.c_q = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.c_k = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.c_v = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(rms_norm(x), cos, sin)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        cos, sin = rotary_tables(c.seq_len, c.n_embd // c.n_head)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        c = self.config
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        for name, p in self.blocks.named_parameters():
            std = 0.02 / math.sqrt(2 * c.n_layer) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.size(1)
        x = rms_norm(self.wte(idx))
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(rms_norm(x)).float()
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
