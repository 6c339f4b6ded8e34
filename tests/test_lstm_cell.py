"""The LSTM step on the stacked state [h, c], its VJP and gate gradients, against
torch.nn.LSTMCell and autograd in float64."""

from __future__ import annotations

import pytest
import torch

from mgrit_gru.lstm import cell


def _setup(rows=5, I=3, H=4, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.LSTMCell(I, H)
    x = torch.randn(rows, I)
    h, c = torch.randn(rows, H), torch.randn(rows, H)
    gx = (x @ ref.weight_ih.t() + cell.fold_bias(ref.bias_ih, ref.bias_hh)).detach()
    return ref, x, h, c, gx


def test_step_equals_lstm_cell():
    ref, x, h, c, gx = _setup()
    u = torch.cat([h, c], -1)
    got = cell.step(u, gx, ref.weight_hh)
    h_ref, c_ref = ref(x, (h, c))
    assert (got - torch.cat([h_ref, c_ref], -1)).abs().max() < 1e-14
    out = torch.empty_like(u)
    cell.step(u, gx, ref.weight_hh, out=out)
    assert torch.equal(out, got)
    pad = torch.tensor([[1.0], [0.0], [1.0], [0.0], [1.0]])
    padded = cell.step(u, gx, ref.weight_hh, dt=pad)
    assert torch.equal(padded[1], u[1]) and torch.equal(padded[0], got[0])


def test_adjoint_step_and_gate_grads_equal_autograd():
    ref, x, h, c, gx = _setup()
    H = h.shape[1]
    u = torch.cat([h, c], -1).requires_grad_()
    gx = gx.detach().requires_grad_()
    lam = torch.randn(u.shape)
    new = cell.step(u, gx, ref.weight_hh.detach())
    du, dgx = torch.autograd.grad(new, (u, gx), lam)
    lin = cell.linearise(u.detach(), gx.detach(), ref.weight_hh.detach())
    assert lin.C.shape[-1] == cell.COEFFS * H and lin.D.shape == u.shape
    assert torch.equal(lin.D[:, :H], torch.zeros(5, H))  # frozen gates: h' carries no h
    got = cell.adjoint_step(lam, lin.D, lin.C, ref.weight_hh.detach())
    assert (got - du).abs().max() < 1e-13
    assert (cell.gate_grads(lam, lin.C) - dgx).abs().max() < 1e-13
    out = torch.empty_like(lam)
    cell.adjoint_step(lam, lin.D, lin.C, ref.weight_hh.detach(), out=out)
    assert torch.equal(out, got)


def test_kept_gates_give_the_same_coefficients():
    ref, x, h, c, gx = _setup()
    u = torch.cat([h, c], -1)
    keep = torch.empty(5, cell.KEPT * h.shape[1])
    factor = torch.empty(u.shape)
    cell.step(u, gx, ref.weight_hh.detach(), keep=keep, factor=factor)
    a, b = cell.linearise(u, gx, ref.weight_hh.detach()), cell.linearise_kept(u, keep)
    assert (a.C - b.C).abs().max() < 1e-15 and torch.equal(a.D, b.D)
    assert torch.equal(factor, a.D)  # the forward's frozen-gate factor is the adjoint's D


def test_frozen_gate_map_is_the_step_with_its_gates_held():
    """With the gates of a step held, a change d of [h, c] maps to factor * d exactly."""
    ref, x, h, c, gx = _setup()
    H = h.shape[1]
    u = torch.cat([h, c], -1)
    keep, factor = torch.empty(5, 4 * H), torch.empty(u.shape)
    new = cell.step(u, gx, ref.weight_hh.detach(), keep=keep, factor=factor)
    i, f, g, o = keep.split(H, dim=-1)
    d = torch.randn(u.shape)
    c2 = f * (c + d[:, H:]) + i * g
    held = torch.cat([o * torch.tanh(c2), c2], -1)
    # c' is affine in c with factor f; h' depends on c' alone (no h): linear in c to first order
    assert (held[:, H:] - (new[:, H:] + factor[:, H:] * d[:, H:])).abs().max() < 1e-14


def test_identity_steps_pass_the_adjoint_through():
    ref, x, h, c, gx = _setup()
    u = torch.cat([h, c], -1)
    dt = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0]])
    lin = cell.linearise(u, gx, ref.weight_hh.detach(), dt)
    lam = torch.randn(u.shape)
    got = cell.adjoint_step(lam, lin.D, lin.C, ref.weight_hh.detach())
    ut = u.clone().requires_grad_()
    (du,) = torch.autograd.grad(cell.step(ut, gx, ref.weight_hh.detach(), dt=dt), ut, lam)
    assert (got - du).abs().max() < 1e-13
    assert torch.equal(got[1], lam[1])


def test_reference_layer_equals_torch_lstm():
    torch.manual_seed(1)
    ref = torch.nn.LSTM(3, 4)
    x, h0, c0 = torch.randn(7, 2, 3), torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    y_ref, (h_ref, c_ref) = ref(x, (h0, c0))
    w = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0]
    states, u_n = cell.reference_layer(x, torch.cat([h0[0], c0[0]], -1), *w)
    assert (states[..., :4] - y_ref).abs().max() < 1e-14
    assert (u_n - torch.cat([h_ref[0], c_ref[0]], -1)).abs().max() < 1e-14


def test_affine_scan_equals_the_sequential_recurrence():
    """c_{t+1} = f_t c_t + b_t in blocks: equal to the step-by-step loop for lengths that are
    and are not whole blocks, factors 0 (an underflowed forget gate) and 1 included."""
    torch.manual_seed(2)
    for T in (1, 2, 3, 16, 17, 99, 1000):
        f, b, c0 = torch.rand(T, 3, 4), torch.randn(T, 3, 4), torch.randn(3, 4)
        f[T // 2] = 0.0
        f[T // 3] = 1.0
        out = torch.empty_like(f)
        cell.affine_scan(f, b, c0, out)
        c, want = c0, []
        for t in range(T):
            c = f[t] * c + b[t]
            want.append(c)
        assert (out - torch.stack(want)).abs().max() < 1e-13, T


def test_fused_forward_then_completed_points_equal_the_steps():
    """torch's kernel gives h at every point and c at the ends; complete_points rebuilds the
    inner c; together they equal the library's steps (float64)."""
    torch.manual_seed(3)
    ref = torch.nn.LSTM(3, 4)
    w = [p.detach() for p in (ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0)]
    x, u0 = torch.randn(300, 2, 3), torch.randn(2, 8)
    points = cell.fused_forward(x, u0, *w)
    assert torch.equal(points[1:-1, :, 4:], torch.zeros(299, 2, 4))  # not rebuilt yet
    full = cell.complete_points(points, x, *w, block=128)  # several blocks
    assert torch.equal(points[1:-1, :, 4:], torch.zeros(299, 2, 4))  # a copy
    u, want = u0, [u0]
    for t in range(300):
        u = cell.step(u, x[t] @ w[0].t() + w[2] + w[3], w[1])
        want.append(u)
    assert (full - torch.stack(want)).abs().max() < 1e-12


def test_the_cost_model_prices_lstm_steps_by_its_multipliers():
    """An LSTM step costs the GRU model's entry of its base kind times the cell's overhead
    and per-row multipliers; the GRU's own costs are unchanged."""
    from mgrit_gru import cost
    from mgrit_gru.gru.cell import GRUCell

    costs = cell.LSTMCell.costs
    row = cost.table()["cpu"]
    for kind, (base, o_times, c_times, *call) in costs.items():
        o, c = row[base]
        assert cost.step_us(kind, 12, 64, "cpu", costs) == o * o_times + c * c_times * 12
        # a serial kernel's fixed cost per call, where the cell states one
        fixed = o * call[0] if call else 0.0
        assert cost.call_us(kind, "cpu", costs) == fixed
        serial = cost.serial_us(kind, 50, 10, 64, "cpu", costs)
        assert serial == pytest.approx(fixed + 50 * cost.step_us(kind, 10, 64, "cpu", costs))
    assert cost.call_us("fused", "cpu", costs) > 0  # torch's LSTM kernel sets itself up
    assert cost.step_us("step", 10, 64, "cpu", GRUCell().costs) == cost.step_us("step", 10, 64)
    meter = cost.Meter(64, "cpu", costs)
    meter.add("fused", 4, 100, cost_kind="fused_adjoint")
    assert meter.spent == 100 * cost.step_us("fused_adjoint", 4, 64, "cpu", costs)
