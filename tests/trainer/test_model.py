"""The GPT: exact parameter count, causality, initial loss, memory estimate."""

import math

import pytest
import torch

from trainer.model import GPT, GPTConfig, estimate_train_memory, param_count


@pytest.mark.parametrize("L, C, H", [(1, 64, 1), (2, 128, 2), (3, 96, 3)])
def test_param_count_is_exact(L, C, H):
    c = GPTConfig(vocab_size=257, seq_len=16, n_layer=L, n_embd=C, n_head=H)
    assert param_count(c) == sum(p.numel() for p in GPT(c).parameters())


def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    m = GPT(GPTConfig(seq_len=16, n_layer=2, n_embd=64, n_head=2)).eval()
    x = torch.randint(0, 257, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 257
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.equal(a[0, :10], b[0, :10])
    assert not torch.equal(a[0, 10:], b[0, 10:])


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    m = GPT(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    x = torch.randint(0, 257, (4, 32))
    loss = m(x, x).item()
    assert abs(loss - math.log(257)) < 0.5


def test_memory_estimate_grows_with_batch_depth_and_covers_adam():
    c = GPTConfig(seq_len=128, n_layer=2, n_embd=128, n_head=2)
    m = estimate_train_memory(c, 8, world_size=2)
    assert m > 20 * param_count(c)  # weights+grads+2 moments+bucket
    assert estimate_train_memory(c, 16, 2) > m
    assert estimate_train_memory(GPTConfig(seq_len=128, n_layer=4, n_embd=128, n_head=2), 8, 2) > m


def test_sharded_memory_estimate_splits_the_state_and_adds_the_gathered_blocks():
    c = GPTConfig(seq_len=128, n_layer=12, n_embd=768, n_head=12)  # ~86M parameters
    n, ddp = param_count(c), estimate_train_memory(c, 8, world_size=2)
    acts = estimate_train_memory(c, 8, 1) - 28 * n  # one process: 16 B a parameter + checkpoint 12, acts
    two, four = (estimate_train_memory(c, 8, w, shard=True) for w in (2, 4))
    whole = 4 * (2 * 2 * 257 * 768 + 3 * 12 * 768 * 768)  # root and its grads, 2 blocks + 1 block's grads
    assert two == 16 * n // 2 + whole + acts and four == 16 * n // 4 + whole + acts
    assert four < two < ddp and ddp - two > 21 * n  # over 2: 8 of DDP's 32 bytes a parameter
    assert estimate_train_memory(c, 8, 1, shard=True) == estimate_train_memory(c, 8, 1)  # nothing to split
