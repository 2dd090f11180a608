"""The model's sizes without torch: its configuration, parameter count, FLOPs per token and the memory one
rank needs to train it (preflight judges the last on the control host, where importing torch is not needed).
trainer/model.py builds the model from the same GPTConfig."""

from __future__ import annotations

from dataclasses import dataclass

# A rank's memory before any tensor of the model: Python, torch, gloo, pyarrow and the data loader (peak RSS
# of a depth-1 run, torch 2.13 CPU: 387 MiB)
RUNTIME_BYTES = 400 << 20
# a DDP checkpoint on rank 0: the weights and both AdamW moments serialized in memory before the write
# (trainer/checkpoint.py); --shard's DCP writes each rank's shards from the tensors themselves
CHECKPOINT_BYTES_PER_PARAM = 12
# torchrun's agent, once on every node beside its ranks (a Python with torch imported: 249 MiB RSS)
AGENT_BYTES = 256 << 20


@dataclass
class GPTConfig:
    vocab_size: int = 257
    seq_len: int = 128
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 2


def param_count(c: GPTConfig) -> int:
    """Exact number of parameters: embeddings + head (untied) + 12*C^2 per block (attn 4C^2, MLP 8C^2)."""
    return 2 * c.vocab_size * c.n_embd + c.n_layer * 12 * c.n_embd * c.n_embd


def flops_per_token(c: GPTConfig) -> int:
    """nanoGPT's estimate: 6N for the matmuls (N without the input embedding) + 12*L*C*T for attention."""
    n = param_count(c) - c.vocab_size * c.n_embd
    return 6 * n + 12 * c.n_layer * c.n_embd * c.seq_len


def estimate_train_memory(c: GPTConfig, batch_size: int, world_size: int = 2, bytes_per_act: int = 4,
                          shard: bool = False) -> int:
    """Rough bytes one rank needs to train (used by preflight).

    fp32 weights (4) + grads (4) + AdamW moments (8) + communication (4 when world_size > 1: the grads are
    views of DDP's buckets, but a compression hook's buffer or PowerSGD's error feedback take up to that)
    per parameter, plus activations kept for backward: per token and block about 16*C values plus the
    attention rows (n_head*T), and the logits three times (logits, softmax, grad), plus RUNTIME_BYTES and
    the checkpoint serialized in memory (CHECKPOINT_BYTES_PER_PARAM).

    shard (FSDP2 over world_size ranks, trainer/shard.py): the 16 bytes a parameter are split over the
    ranks; on top, the parameters in use whole: the root's (embedding and head, gathered for the whole
    step) and its full gradients, two blocks gathered (the one computing and the next) and one block's full
    gradients before their reduce-scatter. Activations are the same as DDP's.
    """
    n = param_count(c)
    tokens = batch_size * c.seq_len
    acts = tokens * (c.n_layer * (16 * c.n_embd + c.n_head * c.seq_len) + 3 * c.vocab_size)
    if shard and world_size > 1:
        root, block = 2 * c.vocab_size * c.n_embd, 12 * c.n_embd * c.n_embd
        return RUNTIME_BYTES + -(-n * 16 // world_size) + 4 * (2 * root + 3 * block) + acts * bytes_per_act
    per_param = 16 + (4 if world_size > 1 else 0) + CHECKPOINT_BYTES_PER_PARAM
    return RUNTIME_BYTES + n * per_param + acts * bytes_per_act
