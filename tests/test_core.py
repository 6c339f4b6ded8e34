"""The MGRIT core on linear problems whose answer is known (no GRU involved)."""

from __future__ import annotations

import pytest
import torch

from mgrit_gru.core import Grid, build_grids, flat_points, pad_steps, solve
from mgrit_gru.core.grid import chunk_view, to_chunks


class Scalar:
    """u_{k+1} = a_k u_k on a level whose steps have factors ``a`` (M,); state shape (1,)."""

    def __init__(self, grid, a):
        self.a = chunk_view(a, grid)

    def __call__(self, u, j, out=None):
        a = self.a if j is None else self.a[j]
        return torch.mul(u, a.unsqueeze(-1), out=out)


def scalar_ops(grids, a_fine, coarse):
    """Ops for a scalar problem; coarse steps are ``coarse(product of fine factors)``."""
    ops, a = [], a_fine
    for i, g in enumerate(grids):
        ops.append(Scalar(g, pad_steps(a, g, 1.0)))
        if i + 1 < len(grids):
            prod = pad_steps(a, g, 1.0).view(g.n, g.m).prod(1)
            a = coarse(prod)
    return ops


def serial(a, u0, f):
    out = [u0]
    for k in range(len(a)):
        out.append(a[k] * out[-1] + f[k])
    return torch.stack(out)


@pytest.mark.parametrize("T,m,levels", [(37, 4, 2), (64, 4, 3), (100, 3, 4), (5, 8, 2)])
def test_grids(T, m, levels):
    grids = build_grids(T, m, levels)
    assert grids[0].N == T
    for fine, coarse in zip(grids, grids[1:]):
        assert fine.M >= fine.N > fine.M - fine.m  # less than one chunk of padding
        assert coarse.N == fine.n
    assert grids[-1].n == 1 and grids[-1].M == grids[-1].N
    front = build_grids(T, m, levels, front=True)
    assert [(g.N, g.m, g.n) for g in front] == [(g.N, g.m, g.n) for g in grids]
    assert all(g.off == g.M - g.N for g in front[:-1])


def test_chunk_layout_round_trip():
    g = Grid(N=10, m=4, n=3)
    flat = torch.arange(13.0).view(13, 1)
    u = to_chunks(flat[:12], g)
    assert u[1, 2].item() == 9.0  # point c*m + j
    assert torch.equal(flat_points(u, flat[12]), flat)


@pytest.mark.parametrize("front", [False, True])
def test_exact_coarse_propagator_converges_in_one_cycle(front):
    """With coarse steps equal to the product of the fine ones, two-level MGRIT is a direct
    solver: one V-cycle gives the answer to round-off."""
    T, m = 47, 5  # 10 chunks, the padded one at the end (or, front=True, at the front)
    a = torch.rand(T) * 0.5 + 0.5
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 2, front=front)
    assert grids[0].M > T
    a_pad, f_pad = pad_steps(a, grids[0], 1.0), pad_steps(f, grids[0])
    ops = scalar_ops(grids, a, lambda p: p)
    res = solve(grids, ops, torch.ones(1), to_chunks(f_pad, grids[0]), relax="F", max_iters=1)
    exact = serial(a_pad, torch.ones(1), f_pad)
    assert res.iterations <= 1
    assert torch.allclose(flat_points(res.u, res.uend), exact, atol=1e-13)


def test_parareal_exact_after_as_many_iterations_as_intervals():
    """F-relaxation, two levels: after k cycles the first k coarse intervals are exact."""
    T, m = 40, 5  # 8 coarse intervals
    a = torch.rand(T) + 0.5  # not contractive, so nothing converges by accident
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 2)
    ops = scalar_ops(grids, a, lambda p: p.sqrt())  # a poor coarse propagator
    exact = serial(a, torch.ones(1), f)
    g = to_chunks(f, grids[0])
    errors = []
    for k in range(grids[0].n):
        r = solve(grids, ops, torch.ones(1), g, relax="F", max_iters=k)
        errors.append((flat_points(r.u, r.uend) - exact).abs().max().item())
    done = solve(grids, ops, torch.ones(1), g, relax="F", max_iters=grids[0].n - 1)
    assert (flat_points(done.u, done.uend) - exact).abs().max().item() < 1e-12
    assert errors[grids[0].n - 2] > 1e-6  # one cycle fewer is not exact


def test_convergence_factor_bound_on_linear_decay():
    """du/dt = -lambda u with forcing: backward-Euler coarse steps for exact fine steps.
    The residual must fall by a factor of at least 5 per FCF cycle."""
    T, m = 512, 8
    a = torch.full((T,), 0.9)
    f = torch.randn(T, 1) * 0.1
    grids = build_grids(T, m, 3)
    lam = 1 - 0.9  # coarse: implicit step with dt = number of fine steps
    ops = []
    dts = torch.ones(T)
    for i, gr in enumerate(grids):
        dt = pad_steps(dts, gr, 0.0)
        ops.append(Scalar(gr, a if i == 0 else 1.0 / (1.0 + lam * dt)))
        dts = dt.view(gr.n, gr.m).sum(1)
    r = solve(
        grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax="FCF", tol=1e-14, max_iters=30
    )
    hist = r.residuals
    assert r.converged and len(hist) >= 3
    for prev, new in zip(hist, hist[1:]):
        assert new < prev / 5
    exact = serial(a, torch.ones(1), f)
    assert (flat_points(r.u, r.uend) - exact).abs().max() < 1e-12


class Counting:
    """A propagator that counts its single-step calls."""

    def __init__(self, op):
        self.op, self.steps = op, 0

    def __call__(self, u, j, out=None):
        self.steps += j is not None
        return self.op(u, j, out=out)


def _true_residual(a, f, u):
    """The largest |u_{k+1} - a_k u_k - f_k| over every step of a trajectory (M + 1, 1)."""
    return (u[1:] - a.unsqueeze(-1) * u[:-1] - f).abs().max().item()


@pytest.mark.parametrize("relax", ["FCF", "F"])
def test_early_exit_keeps_merged_chunks_and_its_residual_counts(relax):
    """A contractive problem forgets a chunk's start within a few steps, so a sweep that
    follows another (FCF's second; F's after a coarse correction) exits early. The
    trajectory's true residual at every step, the exit's included, then stays within tol,
    the solution within tol / (1 - a) of the exact one, and the solve took fewer fine steps
    than without the exit."""
    T, m, tol = 640, 32, 1e-9
    a = torch.full((T,), 0.25)
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 2)
    exact = serial(a, torch.ones(1), f)
    steps, results = [], []
    for early_exit in (False, True):
        ops = scalar_ops(grids, a, lambda p: p.sqrt())  # a poor coarse propagator
        ops[0] = Counting(ops[0])
        r = solve(
            grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax=relax, tol=tol,
            max_iters=8, early_exit=early_exit,
        )  # fmt: skip
        assert r.converged and not r.diverged
        u = flat_points(r.u, r.uend)
        assert _true_residual(a, f, u) <= tol
        assert (u - exact).abs().max().item() <= 2 * tol
        steps.append(ops[0].steps)
        results.append(r)
    assert steps[1] <= steps[0] - 10
    if relax == "FCF":  # converged after one relaxation: a full sweep leaves no residual,
        assert results[0].residuals == [0.0]  # the exit one that the history reports
        assert 0.0 < results[1].residuals[0] <= tol


def test_early_exit_without_merging_changes_nothing():
    """Where trajectories from different starts never merge (|a| = 1: nothing is forgotten),
    every sweep runs to its end and the solve is bit for bit the one without the exit."""
    T, m = 200, 8
    a = torch.where(torch.rand(T) < 0.5, -1.0, 1.0)
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 3)
    runs = []
    for early_exit in (False, True):
        ops = scalar_ops(grids, a, lambda p: 0.5 * p)
        r = solve(
            grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax="FCF", tol=1e-12,
            max_iters=4, early_exit=early_exit,
        )  # fmt: skip
        runs.append(r)
    assert torch.equal(runs[0].u, runs[1].u) and torch.equal(runs[0].uend, runs[1].uend)
    assert runs[0].residuals == runs[1].residuals
