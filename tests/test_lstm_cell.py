"""The LSTM step on the stacked state [h, c], its VJP and gate gradients, against
torch.nn.LSTMCell and autograd in float64."""

from __future__ import annotations

import torch

from mgrit_gru.lstm import cell


def _setup(rows=5, I=3, H=4, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.LSTMCell(I, H)
    x = torch.randn(rows, I)
    h, c = torch.randn(rows, H), torch.randn(rows, H)
    gx = x @ ref.weight_ih.t() + cell.fold_bias(ref.bias_ih, ref.bias_hh)
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
    coeffs = cell.linearise(u.detach(), gx.detach(), ref.weight_hh.detach())
    assert coeffs.shape[-1] == cell.COEFFS * H
    got = cell.adjoint_step(lam, coeffs, ref.weight_hh.detach())
    assert (got - du).abs().max() < 1e-13
    assert (cell.gate_grads(lam, coeffs) - dgx).abs().max() < 1e-13


def test_identity_steps_pass_the_adjoint_through():
    ref, x, h, c, gx = _setup()
    u = torch.cat([h, c], -1)
    dt = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0]])
    coeffs = cell.linearise(u, gx, ref.weight_hh.detach(), dt)
    lam = torch.randn(u.shape)
    got = cell.adjoint_step(lam, coeffs, ref.weight_hh.detach(), dt)
    ut = u.clone().requires_grad_()
    (du,) = torch.autograd.grad(cell.step(ut, gx, ref.weight_hh.detach(), dt=dt), ut, lam)
    assert (got - du).abs().max() < 1e-13
    assert torch.equal(got[1], lam[1])
