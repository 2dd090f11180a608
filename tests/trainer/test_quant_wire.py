"""int8/int4 codes with a scale per block (trainer/quant_wire.py): the payload's size, the roundtrip error
bound, exact zeros."""

import math

import pytest
import torch

from trainer import quant_wire
from trainer.quant_wire import BLOCK, decode, encode, levels, payload_bytes


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("numel", [1, 5, BLOCK, BLOCK + 1, 3 * BLOCK - 7, 10_000])
def test_roundtrip_is_within_half_a_step_of_each_blocks_scale(bits, numel):
    g = torch.Generator().manual_seed(numel)
    # blocks of very different magnitudes: each keeps its own scale
    x = torch.randn(numel, generator=g) * torch.logspace(-6, 2, numel)
    payload = encode(x, bits)
    assert payload.dtype == torch.int8 and payload.numel() == payload_bytes(numel, bits)
    y = decode(payload, numel, bits)
    padded = torch.nn.functional.pad(x, (0, -numel % BLOCK)).view(-1, BLOCK)
    step = (padded.abs().amax(dim=1, keepdim=True) / levels(bits)).expand(-1, BLOCK).reshape(-1)[:numel]
    assert torch.all((x - y).abs() <= step / 2 * (1 + 1e-5) + 1e-12)
    assert y.abs().max() <= x.abs().max() * (1 + 1e-6)  # no code beyond the block's largest value


@pytest.mark.parametrize("bits", [8, 4])
def test_zeros_and_the_largest_value_of_each_block_come_back_exactly(bits):
    x = torch.zeros(3 * BLOCK)
    x[BLOCK:2 * BLOCK] = torch.linspace(-2.0, 4.0, BLOCK)
    y = decode(encode(x, bits), x.numel(), bits)
    assert torch.equal(y[:BLOCK], x[:BLOCK]) and torch.equal(y[2 * BLOCK:], x[2 * BLOCK:])
    assert y[2 * BLOCK - 1].item() == pytest.approx(4.0, rel=1e-6)


def test_payload_sizes_are_what_the_bytes_counter_reports():
    n = 459_008  # the 0.46M model of make bench-lowcomm
    assert payload_bytes(n, 8) == n + 4 * math.ceil(n / BLOCK)
    assert payload_bytes(n, 4) == n // 2 + 4 * math.ceil(n / BLOCK)
    assert 3.8 < n * 4 / payload_bytes(n, 8) < 4 and 7.4 < n * 4 / payload_bytes(n, 4) < 8
    assert quant_wire.BITS == {"int8": 8, "int4": 4}
