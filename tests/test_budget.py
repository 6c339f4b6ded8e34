"""Fixed-budget MGRIT (Moon & Cyr's training): exact cycle counts, no fallback, both gradients."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import APP_SMALL, flags, make_ref

import mgrit_gru
from mgrit_gru import MGRIT, Budget
from mgrit_gru.app.config import TrainConfig
from mgrit_gru.app.train import evaluate_run, train
from mgrit_gru.cli import main


def _budget(forward=2, backward=1, **kw):
    gradient = kw.pop("gradient", "adjoint")
    relax = kw.pop("backward_relax", None)
    return MGRIT(budget=Budget(forward, backward, relax, gradient), **kw)


@pytest.mark.parametrize("gradient", ["adjoint", "unrolled"])
def test_budget_runs_exactly_its_cycles_and_never_falls_back(gradient):
    """Even on a GRU that MGRIT cannot solve (expanding), the budget runs its cycles and the
    result stands: no guard, no fallback, no warning."""
    ref = make_ref(3, 16)
    with torch.no_grad():
        ref.weight_hh_l0.mul_(5.0)
    opts = _budget(3, 2, cfactor=8, gradient=gradient, backward_relax="F")
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x = torch.randn(400, 2, 3, requires_grad=True)
    y, h = ours(x)
    (y.sum() + h.sum()).backward()
    fwd = ours.last_stats.forward[0]
    assert fwd.iterations == 3 and len(fwd.residuals) == 4 and not fwd.fell_back
    assert not fwd.converged and fwd.levels > 1
    if gradient == "adjoint":
        bwd = ours.last_stats.backward[0]
        assert bwd.iterations == 2 and len(bwd.residuals) == 3 and not bwd.fell_back
    with torch.no_grad():
        assert (y - ref(x)[0]).abs().max() > 1e-3  # the budget's function, not the GRU's


def test_budget_is_deterministic_and_a_large_one_is_serial():
    ref = make_ref(3, 6, zbias=2.0)
    x = torch.randn(300, 2, 3)
    small = mgrit_gru.GRU.from_torch(ref, solver=_budget(1, 1, cfactor=8))
    with torch.no_grad():
        assert torch.equal(small(x)[0], small(x)[0])
    # F-relaxation on two levels is exact after (intervals - 1) cycles (Parareal)
    big = _budget(300 // 8, 300 // 8, cfactor=8, levels=2, relax="F")
    ours = mgrit_gru.GRU.from_torch(ref, solver=big)
    xg = x.clone().requires_grad_()
    y, h = ours(xg)
    (y.sum() + h.sum()).backward()
    xr = x.clone().requires_grad_()
    yr, hr = ref(xr)
    (yr.sum() + hr.sum()).backward()
    assert (y - yr).abs().max() < 1e-12 and (xg.grad - xr.grad).abs().max() < 1e-10


def test_a_non_finite_state_under_a_budget_is_an_error():
    """Weights that training has blown up to Inf: a budget reports it, no silent NaN."""
    ref = make_ref(3, 8)
    with torch.no_grad():
        ref.weight_hh_l0[0, 0] = float("inf")
    ours = mgrit_gru.GRU.from_torch(ref, solver=_budget(2, 1, cfactor=4, levels=3))
    with pytest.raises(mgrit_gru.DivergenceError, match="non-finite state"):
        ours(torch.randn(64, 2, 3))


@pytest.mark.parametrize("coarse", ["implicit", "frozen", "secant"])
@pytest.mark.parametrize("cell", ["classic", "implicit"])
def test_unrolled_forward_is_the_budgeted_forward(coarse, cell):
    """The differentiable (unrolled) budget computes what the in-place one does, with
    variable lengths and both directions."""
    ref = make_ref(3, 5, bidirectional=True)
    kw = dict(cfactor=4, levels=3, coarse=coarse)
    adjoint = mgrit_gru.GRU.from_torch(ref, solver=_budget(2, 1, **kw), cell=cell)
    unrolled = mgrit_gru.GRU.from_torch(ref, solver=_budget(2, 1, gradient="unrolled", **kw))
    unrolled.cell = cell
    x = torch.randn(57, 2, 3, requires_grad=True)
    lengths = torch.tensor([57, 30])
    with torch.no_grad():
        y_a, h_a = adjoint(x, lengths=lengths)
    y_u, h_u = unrolled(x, lengths=lengths)
    assert (y_a - y_u).abs().max() < 1e-12 and (h_a - h_u).abs().max() < 1e-12
    assert adjoint.last_stats.forward[0].residuals == pytest.approx(
        unrolled.last_stats.forward[0].residuals, rel=1e-9, abs=1e-14
    )


def _literal_parareal(x, h0, w_ih, w_hh, b_ih, b_hh, m, cycles):
    """Two-level MGRIT with FCF relaxation written out literally: C-points every m steps,
    the coarse step an implicit GRU step of size m with the interval's averaged input gates,
    the FAS correction V_{c+1} = G(V_c) + P_c - G(U_c); then a final F- and C-relaxation."""
    T, H = x.shape[0], w_hh.shape[1]
    n = T // m
    gx = x @ w_ih.t() + b_ih

    def step(h, g, dt=1.0, implicit=False):
        gh = h @ w_hh.t() + b_hh
        r = torch.sigmoid(g[..., :H] + gh[..., :H])
        z = torch.sigmoid(g[..., H : 2 * H] + gh[..., H : 2 * H])
        nn = torch.tanh(g[..., 2 * H :] + r * gh[..., 2 * H :])
        w = dt * (1 - z)
        theta = w / (1 + w) if implicit else w
        return h + theta * (nn - h)

    coarse_gx = [gx[c * m : (c + 1) * m].mean(0) for c in range(n)]

    def G(h, c):
        return step(h, coarse_gx[c], dt=float(m), implicit=True)

    U = [h0] * (n + 1)  # C-points 0..n
    F = [[None] * m for _ in range(n)]  # F[c][j]: point c*m + j, j >= 1

    def f_relax():
        for c in range(n):
            h = U[c]
            for j in range(1, m):
                h = step(h, gx[c * m + j - 1])
                F[c][j] = h

    def propagate(c):
        return step(F[c][m - 1], gx[c * m + m - 1])

    for _ in range(cycles):
        f_relax()
        U = [U[0]] + [propagate(c) for c in range(n)]
        f_relax()
        P = [propagate(c) for c in range(n)]
        V = [U[0]]
        for c in range(n):
            V.append(G(V[c], c) + P[c] - G(U[c], c))
        U = V
    f_relax()
    U = [U[0]] + [propagate(c) for c in range(n)]
    return torch.stack([F[c][j] if j else U[c] for c in range(n) for j in range(m)] + [U[n]])


def test_unrolled_gradient_is_autograd_through_the_literal_cycles():
    """Budget(gradient="unrolled") gives the exact gradient of the budgeted forward:
    autograd through a literal two-level FCF implementation of the same cycles agrees."""
    torch.manual_seed(3)
    ref = make_ref(2, 4, zbias=1.0)
    T, m, cycles = 24, 4, 2
    x = torch.randn(T, 2, 2, requires_grad=True)
    h0 = torch.randn(2, 4) * 0.5
    w = torch.randn(T, 2, 4)
    opts = _budget(cycles, 1, cfactor=m, levels=2, coarse="implicit", gradient="unrolled")
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    y, _ = ours(x, h0[None])
    grads = torch.autograd.grad((y * w).sum(), [x, *ours.parameters()])
    w_ih, w_hh, b_ih, b_hh = (p.detach().clone().requires_grad_() for p in ref.parameters())
    xr = x.detach().clone().requires_grad_()
    points = _literal_parareal(xr, h0, w_ih, w_hh, b_ih, b_hh, m, cycles)
    assert (points[1:] - y).abs().max() < 1e-12
    expected = torch.autograd.grad((points[1:] * w).sum(), [xr, w_ih, w_hh, b_ih, b_hh])
    for a, b in zip(grads, expected):
        assert (a - b).abs().max() < 1e-11
    # the adjoint gradient (the paper's) is another: the exact GRU's at the budget's states
    adjoint = mgrit_gru.GRU.from_torch(ref, solver=_budget(cycles, 1, cfactor=m, levels=2))
    y_a, _ = adjoint(x, h0[None])
    g_a = torch.autograd.grad((y_a * w).sum(), [x])[0]
    assert (g_a - grads[0]).abs().max() > 1e-6


SMALL = {k: v for k, v in APP_SMALL.items() if k != "cfactor"}


def test_a_budget_run_evaluates_with_its_budget_and_serially(f32, tmp_path, capsys):
    """--recipe torchbraid: the paper's budget; its test accuracy is the budget's, the serial
    figure beside it (metrics, report, eval), and resume is exact."""
    run = tmp_path / "tb"
    assert main(["train", *flags(SMALL), "--recipe", "torchbraid", "--out", str(run)]) == 0
    cfg = TrainConfig(**json.loads((run / "config.json").read_text()))
    assert cfg.cell == "implicit" and cfg.cfactor == 4 and cfg.levels == 3
    assert cfg.budget == Budget(2, 1, "F", "adjoint") and cfg.recipe == "torchbraid"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("test_acc_serial" in r for r in rows)
    assert rows[-1]["fallbacks"] == 0 and rows[-1]["fwd_iters_max"] == 2
    report = (run / "report.md").read_text()
    assert "with the same weights solved exactly (serial)" in report
    result = evaluate_run(run, log=lambda *a: None)
    assert result["test_acc"] == pytest.approx(rows[-1]["test_acc"])
    assert result["test_acc_serial"] == pytest.approx(rows[-1]["test_acc_serial"])
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "solved exactly: loss" in capsys.readouterr().out
    # resume: the same metrics as the uninterrupted run (a constant rate: the run is stopped by
    # asking for 1 epoch, and a cosine schedule would stretch when it is extended)
    constant = tmp_path / "constant"
    assert main(["train", *flags(SMALL), "--recipe", "torchbraid", "--schedule", "constant",
                 "--out", str(constant)]) == 0  # fmt: skip
    rows = [json.loads(x) for x in (constant / "metrics.jsonl").read_text().splitlines()]
    cfg = TrainConfig(**json.loads((constant / "config.json").read_text()))
    half = tmp_path / "half"
    cfg1 = cfg.replace(epochs=1)
    train(cfg1, half, progress=False, log=lambda *a: None)
    assert main(["train", "--resume", str(half), "--epochs", "2", "--no-speed-check"]) == 0
    resumed = [json.loads(x) for x in (half / "metrics.jsonl").read_text().splitlines()]
    keys = ("train_loss", "test_acc", "test_acc_serial")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in rows]


def test_recipe_combines_with_otherflags(f32, tmp_path, capsys):
    run = tmp_path / "b"
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--recipe", "budget", "--pool", "mean"]
    # the recipe's budget is adaptive, which solves the adjoint
    assert main([*argv, "--budget-gradient", "unrolled", "--out", str(run)]) != 0
    assert "add --budget-theta none" in capsys.readouterr().err
    argv += ["--budget-theta", "none"]  # the fixed 2/1
    assert main([*argv, "--budget-gradient", "unrolled", "--out", str(run)]) == 0
    cfg = TrainConfig(**json.loads((run / "config.json").read_text()))
    assert cfg.pool == "mean" and cfg.budget == Budget(2, 1, None, "unrolled")
    assert cfg.cell == "classic" and cfg.coarse == "secant"
