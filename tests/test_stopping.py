"""Stopping tests scaled to the solution, aware of the precision floor (docs/convergence.md).

The ground truth is the serial solve (and through it torch.nn.GRU + autograd, tested in
test_equivalence): every loss shape a user trains with, in float32 and float64, on a GRU
trained here for a few steps from long memory, converges without a fallback, its adjoint in
at most the forward's cycles + 2, its gradient within 1e-4 (float32) / 1e-8 (float64).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import mgrit_gru
from mgrit_gru import MGRIT
from mgrit_gru.core import build_grids, solve, stopping
from mgrit_gru.core.grid import pad_steps, to_chunks
from mgrit_gru.core.stopping import StopTest

LOSSES = ("last", "mean", "max", "step")
T, B, H, CLASSES = 400, 4, 16, 3


def _loss(kind: str, head, y, h_n, labels):
    if kind == "last":
        return F.cross_entropy(head(h_n[-1]), labels)
    if kind == "step":  # every step has a target (sequence labelling)
        targets = labels[:, None].expand(-1, y.shape[1])
        return F.cross_entropy(head(y).transpose(1, 2), targets)
    return F.cross_entropy(head(y.mean(1) if kind == "mean" else y.amax(1)), labels)


@pytest.fixture(scope="module")
def trained():
    """A GRU with long memory (z-gate bias +3) trained 20 Adam steps (serial solve, float64)
    to tell the sign of the sum of its first 40 inputs, on mean pooling: the adjoint state it
    then has is many times the per-step gradient that drives it."""
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        gru = mgrit_gru.GRU(1, H, batch_first=True, solver="serial", dtype=torch.float64)
        head = torch.nn.Linear(H, CLASSES, dtype=torch.float64)
    with torch.no_grad():
        gru.bias_hh_l0[H : 2 * H] += 3.0
    x = torch.randn(B, T, 1, generator=g, dtype=torch.float64)
    s = x[:, :40, 0].sum(1)
    labels = torch.where(s > 2, 2, torch.where(s < -2, 0, 1))
    opt = torch.optim.Adam([*gru.parameters(), *head.parameters()], lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        y, h_n = gru(x)
        _loss("mean", head, y, h_n, labels).backward()
        opt.step()
    return gru.state_dict(), head.state_dict(), x, labels


def _grad(gru, head, x, labels, kind):
    x = x.detach().clone().requires_grad_()
    gru.zero_grad(set_to_none=True)
    y, h_n = gru(x)
    _loss(kind, head, y, h_n, labels).backward()
    return torch.cat([p.grad.flatten() for p in gru.parameters()] + [x.grad.flatten()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", LOSSES)
def test_every_loss_shape_converges_without_fallback(trained, kind, dtype):
    state, head_state, x, labels = trained
    grus = {}
    for solver in ("serial", MGRIT(cfactor=32)):
        gru = mgrit_gru.GRU(1, H, batch_first=True, solver=solver, dtype=dtype)
        gru.load_state_dict(state)
        grus[str(solver)] = gru
    head = torch.nn.Linear(H, CLASSES, dtype=dtype)
    head.load_state_dict(head_state)
    serial, ours = grus["serial"], grus[str(MGRIT(cfactor=32))]
    ref = _grad(serial, head, x.to(dtype), labels, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning, no raised tolerance
        got = _grad(ours, head, x.to(dtype), labels, kind)
    stats = ours.last_stats
    assert stats.converged and not stats.fell_back, stats.summary()
    assert all(s.by_mgrit for s in stats.solves)
    assert stats.backward_iterations <= stats.forward_iterations + 2, stats.summary()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err <= (1e-4 if dtype == torch.float32 else 1e-8), (kind, err, stats.summary())


def test_adjoint_is_judged_against_its_own_size(trained):
    """With a mean-pooled head the adjoint state dL/dh_t is many times the per-step gradient
    that drives it (1/T of the head's): the residual is judged against the state, so its
    first value is O(1) (against the forcing, the old measure, it was that ratio: hundreds on
    trained sMNIST) and float32 reaches the tolerance."""
    state, head_state, x, labels = trained
    gru = mgrit_gru.GRU(1, H, batch_first=True, solver=MGRIT(cfactor=32), dtype=torch.float32)
    gru.load_state_dict(state)
    head = torch.nn.Linear(H, CLASSES, dtype=torch.float64)
    head.load_state_dict(head_state)
    head.float()
    h0 = torch.zeros(1, B, H, dtype=torch.float32, requires_grad=True)
    y, h_n = gru(x.float(), h0)
    y.retain_grad()
    _loss("mean", head, y, h_n, labels).backward()
    state_size = h0.grad.abs().max().item()  # lam_0
    forcing = y.grad.abs().max().item()
    stats = gru.last_stats.backward[0]
    assert state_size > 5 * forcing  # the state outgrows its forcing
    assert stats.residuals[0] <= 2.0 and stats.converged and stats.residual <= 1e-5


def test_tolerance_below_the_floor_is_raised_with_one_warning():
    torch.manual_seed(0)
    gru = mgrit_gru.GRU(3, 8, solver=MGRIT(cfactor=8, tol=1e-10), dtype=torch.float32)
    x = torch.randn(200, 2, 3, dtype=torch.float32)
    floor = stopping.floor(torch.float32, "cpu", 8)
    with pytest.warns(mgrit_gru.ConvergenceWarning) as caught:
        gru(x)[0].sum().backward()
    texts = {str(w.message) for w in caught}
    assert any("1.0e-10" in t and f"{floor:.1e}" in t and "float32" in t for t in texts), texts
    assert gru.last_stats.converged and not gru.last_stats.fell_back
    gru64 = mgrit_gru.GRU(3, 8, solver=MGRIT(cfactor=8, tol=1e-10), dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 reaches 1e-10: nothing to say
        gru64(x.double())


def test_float64_default_is_as_exact_as_the_dtype():
    """tol="auto" in float64: the rounding floor, so the default MGRIT() answer is the serial
    one to rounding (1e-5 of the old default would leave a 1e-6 drift after a few steps)."""
    torch.manual_seed(1)
    ref = torch.nn.GRU(3, 8, dtype=torch.float64)
    with torch.no_grad():
        ref.bias_hh_l0[8:16] += 2.0
    ours = mgrit_gru.GRU.from_torch(ref, solver=MGRIT(cfactor=16))
    x = torch.randn(500, 4, 3, dtype=torch.float64)
    y, _ = ours(x)
    assert (y - ref(x)[0]).abs().max().item() < 1e-12
    assert ours.last_stats.converged and not ours.last_stats.fell_back


class _Rounded:
    """A linear scalar level ``u' = a u`` that adds float32-sized noise to every step: its
    residual cannot fall below that noise, whatever the cycles."""

    def __init__(self, grid, a, noise):
        self.a = to_chunks(pad_steps(a, grid, 1.0).unsqueeze(-1), grid)
        self.noise = noise
        self.gen = torch.Generator().manual_seed(0)

    def __call__(self, u, j, out=None):
        a = self.a if j is None else self.a[j]
        res = a * u + self.noise * torch.randn(u.shape, generator=self.gen, dtype=u.dtype)
        if out is not None:
            out.copy_(res)
            return out
        return res


def test_a_stall_at_the_floor_is_converged_to_precision_and_far_above_it_is_not():
    T, m = 512, 16
    a = torch.full((T,), 0.9, dtype=torch.float64)
    f = torch.randn(T, 1, dtype=torch.float64)
    grids = build_grids(T, m, 2)
    coarse = _Rounded(grids[1], torch.full((grids[1].N,), 0.9**m, dtype=torch.float64), 0.0)
    noise = 1e-7
    ops = [_Rounded(grids[0], a, noise), coarse]
    g = to_chunks(f, grids[0])
    u0 = torch.ones(1, dtype=torch.float64)
    near = solve(grids, ops, u0, g, stop=StopTest(1e-12, floor=1e-6), max_iters=30)
    assert near.converged and near.at_floor and near.stopped is None
    assert near.residuals[-1] <= 10 * 1e-6 and near.iterations < 30
    far = solve(grids, ops, u0, g, stop=StopTest(1e-12, floor=1e-9), max_iters=30)
    assert not far.converged and not far.at_floor and far.stopped == "cap"


def test_relative_residual_does_not_depend_on_the_loss_scale():
    """Scaling the loss scales the adjoint state and its residuals alike: the cycles and the
    relative residuals stay (the old test, against the incoming gradient's size, did too; the
    scale of the state against its forcing is what changed)."""
    torch.manual_seed(2)
    gru = mgrit_gru.GRU(3, 8, solver=MGRIT(cfactor=16), dtype=torch.float64)
    x = torch.randn(300, 2, 3, dtype=torch.float64)
    runs = []
    for scale in (1.0, 1e6):
        gru(x)[0].mean().mul(scale).backward()
        runs.append(gru.last_stats.backward[0].residuals)
    assert len(runs[0]) == len(runs[1])
    for r0, r1 in zip(*runs):
        assert math.isclose(r0, r1, rel_tol=1e-6, abs_tol=1e-15)
