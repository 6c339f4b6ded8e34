"""Variable-length sequences: PackedSequence and lengths= against torch.nn.GRU (float64)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_ref, tight
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import mgrit_gru

LENGTHS = [97, 5, 160, 160, 1, 64]


def run(module, packed_data, lengths, h0, batch_first, enforce_sorted, weights):
    """Outputs of ``module`` on a PackedSequence built from leaves, and every gradient."""
    x = packed_data.detach().clone().requires_grad_()
    h = h0.detach().clone().requires_grad_()
    packed = pack_padded_sequence(
        x, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted
    )
    y, hn = module(packed, h)
    assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
    y_pad, y_len = pad_packed_sequence(y, batch_first=batch_first)
    assert torch.equal(y_len, torch.as_tensor(lengths))
    loss = (y_pad * weights[: y_pad.numel()].view_as(y_pad)).sum() + (hn**2).sum()
    return [y_pad.detach(), hn.detach(), *torch.autograd.grad(loss, [x, h, *module.parameters()])]


@pytest.mark.parametrize("solver", ["serial", "implicit", "frozen", "secant"])
@pytest.mark.parametrize(
    "layers,bidirectional,batch_first,enforce_sorted",
    [(1, False, False, False), (2, True, True, False), (1, True, False, True)],
)
def test_packed_sequence_equals_torch(solver, layers, bidirectional, batch_first, enforce_sorted):
    ref = make_ref(3, 5, layers, bidirectional, batch_first, zbias=2.0)
    opts = "serial" if solver == "serial" else tight(cfactor=8, coarse=solver)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    B, T = len(lengths), max(lengths)
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    h0 = torch.randn((2 if bidirectional else 1) * layers, B, 5)
    weights = torch.randn(T * B * 10)
    expected = run(ref, x, lengths, h0, batch_first, enforce_sorted, weights)
    got = run(ours, x, lengths, h0, batch_first, enforce_sorted, weights)
    for a, b in zip(expected, got):
        assert a.shape == b.shape
        assert (a - b).abs().max() < (1e-12 if solver == "serial" else 1e-8)


def test_lengths_argument_matches_packed_and_zero_pads():
    ours = mgrit_gru.GRU(3, 4, solver=tight(cfactor=8), bidirectional=True)
    x = torch.randn(160, 6, 3)
    lengths = torch.tensor(LENGTHS)
    y, hn = ours(x, lengths=lengths)
    y_p, hn_p = ours(pack_padded_sequence(x, lengths, enforce_sorted=False))
    y_p, _ = pad_packed_sequence(y_p, total_length=160)
    assert torch.allclose(y, y_p, atol=1e-12) and torch.allclose(hn, hn_p, atol=1e-12)
    for b, n in enumerate(LENGTHS):
        assert torch.all(y[n:, b] == 0)
    # each sequence alone, unpadded, gives the same result
    for b in (0, 4):
        y_b, hn_b = ours(x[: LENGTHS[b], b : b + 1])
        assert torch.allclose(y[: LENGTHS[b], b : b + 1], y_b, atol=1e-9)
        assert torch.allclose(hn[:, b : b + 1], hn_b, atol=1e-9)


@pytest.mark.parametrize(
    "lengths,error,match",
    [
        (torch.tensor([3, 0]), ValueError, r"lengths must lie in \[1, 5\]"),
        (torch.tensor([3, 6]), ValueError, r"lengths must lie in \[1, 5\]"),
        (torch.tensor([3, 2, 1]), ValueError, r"lengths must have shape \(2,\)"),
        (torch.tensor([3.0, 2.0]), TypeError, r"lengths must be integers"),
    ],
)
def test_bad_lengths(lengths, error, match):
    with pytest.raises(error, match=match):
        mgrit_gru.GRU(3, 4)(torch.randn(5, 2, 3), lengths=lengths)
