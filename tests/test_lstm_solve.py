"""One LSTM layer solved by MGRIT on the core (forward and adjoint) against torch.nn.LSTM and
autograd in float64."""

from __future__ import annotations

import pytest
import torch

import mgrit_gru
from mgrit_gru.lstm import solve


@pytest.mark.parametrize(
    "T,cfactor,relax,coarse",
    [
        (97, 4, "FCF", "secant"),
        (256, 8, "F", "frozen"),
        (61, 4, "FCFCF", "secant"),
        (1, 2, "F", "frozen"),
    ],
)
def test_lstm_layer_equals_torch(T, cfactor, relax, coarse):
    torch.manual_seed(0)
    B, I, H = 3, 2, 5
    ref = torch.nn.LSTM(I, H)
    with torch.no_grad():
        ref.bias_hh_l0[H : 2 * H] += 2.0  # a forget gate near 1: long memory
    x = torch.randn(T, B, I, requires_grad=True)
    h0 = torch.randn(1, B, H, requires_grad=True)
    c0 = torch.randn(1, B, H, requires_grad=True)
    wy, wh, wc = torch.randn(T, B, H), torch.randn(B, H), torch.randn(B, H)
    y, (hn, cn) = ref(x, (h0, c0))
    ((y * wy).sum() + (hn[0] * wh).sum() + (cn[0] * wc).sum()).backward()
    opts = mgrit_gru.MGRIT(cfactor=cfactor, relax=relax, coarse=coarse)
    params = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0]
    with torch.no_grad():
        w = [p.detach() for p in params]
        points, res = solve.forward(x.detach(), h0[0].detach(), c0[0].detach(), *w, opts)
        assert res.converged
        assert (points[1:, :, :H] - y).abs().max() < 1e-10
        assert (points[T, :, H:] - cn[0]).abs().max() < 1e-10
        dx, dh0, dc0, dwi, dwh, db, res_b = solve.backward(points, x.detach(), *w, wy, wh, wc, opts)
    assert res_b.converged
    for got, want in (
        (dx, x.grad),
        (dh0, h0.grad[0]),
        (dc0, c0.grad[0]),
        (dwi, ref.weight_ih_l0.grad),
        (dwh, ref.weight_hh_l0.grad),
        (db, ref.bias_ih_l0.grad),
        (db, ref.bias_hh_l0.grad),
    ):
        assert (got - want).abs().max() < 1e-9
