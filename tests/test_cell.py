"""GRU step math against torch.nn.GRUCell and autograd."""

from __future__ import annotations

import pytest
import torch

from mgrit_gru.gru import cell as gru


def params(H=6, I=4):
    c = torch.nn.GRUCell(I, H)
    return c, c.weight_ih, c.weight_hh, c.bias_ih, c.bias_hh


def implicit_reference(h, gx, w_hh, b_hh, dt):
    """The paper's implicit GRU step written out literally."""
    H = h.shape[-1]
    gh = h @ w_hh.t() + b_hh
    r = torch.sigmoid(gx[..., :H] + gh[..., :H])
    z = torch.sigmoid(gx[..., H : 2 * H] + gh[..., H : 2 * H])
    n = torch.tanh(gx[..., 2 * H :] + r * gh[..., 2 * H :])
    return (h + dt * (1 - z) * n) / (1 + dt * (1 - z))


def test_classic_step_is_torch_gru_cell():
    c, w_ih, w_hh, b_ih, b_hh = params()
    x, h = torch.randn(7, 4), torch.randn(7, 6)
    gx = x @ w_ih.t() + gru.fold_bias(b_ih, b_hh, 6)
    out = gru.step(h, gx, w_hh, b_hh[12:], "classic")
    assert torch.allclose(out, c(x, h), atol=1e-14, rtol=0)


def test_tanh_via_sigmoid_for_large_tensors():
    x = torch.linspace(-30, 30, 100_001)
    assert torch.allclose(gru.tanh_(x.clone()), torch.tanh(x), atol=1e-15, rtol=0)
    x32 = x.float()
    assert torch.allclose(gru.tanh_(x32.clone()), torch.tanh(x32), atol=3e-7, rtol=0)


@pytest.mark.parametrize("dt", [1.0, 0.0, 17.0])
def test_implicit_step_formula(dt):
    _, w_ih, w_hh, b_ih, b_hh = params()
    h, gx = torch.randn(7, 6), torch.randn(7, 18)
    dts = torch.full((7, 1), dt)
    folded = gx + gru.fold_bias(None, b_hh, 6)
    out = gru.step(h, folded, w_hh, b_hh[12:], "implicit", dts)
    assert torch.allclose(out, implicit_reference(h, gx, w_hh, b_hh, dt), atol=1e-14, rtol=0)
    if dt == 0.0:
        assert torch.equal(out, h)


def test_classic_step_with_dt_zero_is_identity():
    _, _, w_hh, _, b_hh = params()
    h, gx = torch.randn(3, 6), torch.randn(3, 18)
    assert torch.equal(gru.step(h, gx, w_hh, b_hh[12:], "classic", torch.zeros(3, 1)), h)


@pytest.mark.parametrize(
    "cell,dt",
    [("classic", None), ("implicit", None), ("implicit", 9.0), ("classic", 0.0), ("implicit", 0.0)],
)
def test_linearisation_matches_autograd(cell, dt):
    _, _, w_hh, _, b_hh = params()
    h = torch.randn(5, 6, requires_grad=True)
    gx = torch.randn(5, 18, requires_grad=True)
    lam = torch.randn(5, 6)
    dts = None if dt is None else torch.full((5, 1), dt)
    b_hn = b_hh[12:]
    out = gru.step(h, gx, w_hh, b_hn, cell, dts)
    w_hh_leaf = w_hh.detach().requires_grad_()
    out2 = gru.step(h, gx, w_hh_leaf, b_hn, cell, dts)
    d_h, d_gx = torch.autograd.grad(out, [h, gx], lam)
    (d_w,) = torch.autograd.grad(out2, [w_hh_leaf], lam)
    lin = gru.linearise(h.detach(), gx.detach(), w_hh.detach(), b_hn.detach(), cell, dts)
    assert torch.allclose(gru.adjoint_step(lam, lin.D, lin.C, w_hh.detach()), d_h, atol=1e-13)
    grads = gru.gate_grads(lam, lin.C, lin.A_n)
    assert torch.allclose(grads.d_gx, d_gx, atol=1e-13)
    assert torch.allclose(grads.d_gh.t() @ h.detach(), d_w, atol=1e-13)


@pytest.mark.parametrize("cell,dt", [("classic", None), ("implicit", 9.0), ("classic", 0.5)])
def test_kept_gates_give_the_same_step_and_linearisation(cell, dt):
    _, w_ih, w_hh, b_ih, b_hh = params()
    w_hh, b_hn = w_hh.detach(), b_hh[12:].detach()
    h, gx = torch.randn(3, 5, 6), torch.randn(3, 5, 18)
    dts = None if dt is None else torch.full((3, 5, 1), dt)
    # a strided destination, as the forward's chunk layout hands it
    keep = torch.full((5, 3, 24), float("nan")).transpose(0, 1)
    out = gru.step(h, gx, w_hh, b_hn, cell, dts, keep=keep)
    assert torch.allclose(out, gru.step(h, gx, w_hh, b_hn, cell, dts), atol=1e-15, rtol=0)
    gh = h @ w_hh.t()
    r = torch.sigmoid(gx[..., :6] + gh[..., :6])
    ghn = gh[..., 12:] + b_hn
    expected = [r, torch.sigmoid(gx[..., 6:12] + gh[..., 6:12]), torch.tanh(gx[..., 12:] + r * ghn)]
    for got, want in zip(keep.split(6, dim=-1), expected + [ghn]):
        assert torch.allclose(got, want, atol=1e-14)
    lin, kept = gru.linearise(h, gx, w_hh, b_hn, cell, dts), gru.linearise_kept(h, keep, cell, dts)
    for a, b in zip(lin, kept):
        assert torch.allclose(a, b, atol=1e-14)
