"""The adaptive cycle budget (mgrit_gru.AdaptiveBudget): the gradient's error under a bound."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import APP_SMALL, flags, make_ref

import mgrit_gru
from mgrit_gru import MGRIT, AdaptiveBudget, Budget
from mgrit_gru.app.config import TrainConfig, with_recipe
from mgrit_gru.cli import main
from mgrit_gru.layer.control import BudgetMemory, budget_memory


def _hard():
    """A GRU with a long memory (update gates near 1) on 128 steps in chunks of 8: two
    forward / one adjoint cycle leave its max-pooled gradient far from the exact one."""
    torch.manual_seed(0)
    return make_ref(3, 8, zbias=3.0), torch.randn(128, 4, 3, dtype=torch.float64)


def _gradient(module, x):
    xg = x.clone().requires_grad_()
    y, h = module(xg)
    (y.amax(0).pow(2).sum() + h.sum()).backward()  # a max-pooled head reads single steps
    return torch.cat([p.grad.flatten() for p in module.parameters()] + [xg.grad.flatten()])


def _error(solver, ref, x, calls=1):
    module = mgrit_gru.GRU.from_torch(ref, solver=solver)
    exact = _gradient(mgrit_gru.GRU.from_torch(ref, solver="serial"), x)
    for _ in range(calls):
        module.zero_grad()
        g = _gradient(module, x)
    return float((g - exact).norm() / exact.norm()), module


def test_adaptive_budget_meets_theta_where_the_fixed_one_does_not():
    ref, x = _hard()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mgrit_gru.BudgetWarning)
        fixed, _ = _error(MGRIT(cfactor=8, budget=Budget(2, 1)), ref, x)
    theta = 0.05
    # calls 1 (checked: calibrates) and 2 (estimated only), in float64 against the exact solve
    adaptive, module = _error(MGRIT(cfactor=8, budget=AdaptiveBudget(theta=theta)), ref, x, 2)
    assert fixed > 4 * theta and adaptive <= theta
    stats = module.last_stats
    assert stats.forward[0].iterations >= 2 and stats.backward[0].iterations >= 2
    assert max(s.iterations for s in stats.solves) <= 8
    figures = budget_memory(module).take()
    assert figures["fwd_solves"] == 2 and figures["fwd_checks"] == 1
    assert 0 < figures["grad_err_est"] <= theta


def test_adaptive_budget_keeps_its_minimum_where_it_suffices():
    """A GRU that forgets within a chunk (random init): 2 forward / 1 adjoint cycles already
    meet the bound, so the adaptive budget spends exactly those."""
    torch.manual_seed(1)
    ref = make_ref(3, 8)
    x = torch.randn(128, 4, 3, dtype=torch.float64)
    module = mgrit_gru.GRU.from_torch(ref, solver=MGRIT(cfactor=16, budget=AdaptiveBudget()))
    for _ in range(3):
        _gradient(module, x)
        its = [(s.pass_, s.iterations) for s in module.last_stats.solves]
        assert its == [("forward", 2), ("backward", 1)]
    assert budget_memory(module).take()["grad_err_est"] < 0.01


def test_adaptive_budget_is_deterministic_and_its_state_round_trips():
    ref, x = _hard()
    opts = MGRIT(cfactor=8, budget=AdaptiveBudget(theta=0.05, every=2))

    def calls(module, n):
        out = []
        for _ in range(n):
            module.zero_grad()
            out.append((_gradient(module, x), [s.iterations for s in module.last_stats.solves]))
        return out

    a = mgrit_gru.GRU.from_torch(ref, solver=opts)
    b = mgrit_gru.GRU.from_torch(ref, solver=opts)
    first, again = calls(a, 2), calls(b, 2)
    for (ga, ia), (gb, ib) in zip(first, again):
        assert torch.equal(ga, gb) and ia == ib
    state = json.loads(json.dumps(a.solver_state()))  # plain data, as in a checkpoint
    assert state["budget"]["keys"]["forward/0/False"]["calls"] == 2
    c = mgrit_gru.GRU.from_torch(ref, solver=opts)
    c.load_solver_state(state)
    for (ga, ia), (gc, ic) in zip(calls(a, 1), calls(c, 1)):
        assert torch.equal(ga, gc) and ia == ic


def test_the_fixed_budget_warns_once_when_its_estimate_stays_above_the_bound(monkeypatch):
    monkeypatch.setattr(BudgetMemory, "FIXED_EVERY", 1)
    ref, x = _hard()
    module = mgrit_gru.GRU.from_torch(ref, solver=MGRIT(cfactor=8, budget=Budget(2, 1)))
    with pytest.warns(mgrit_gru.BudgetWarning, match="estimated gradient error stays above"):
        for _ in range(BudgetMemory.WARN_CHECKS):
            _gradient(module, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgrit_gru.BudgetWarning)
        _gradient(module, x)  # once per module
    assert [s.iterations for s in module.last_stats.solves] == [2, 1]  # it changes nothing


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(theta=0.0), "theta"),
        (dict(theta=1.5), "theta"),
        (dict(theta=True), "theta"),
        (dict(every=0), "every"),
        (dict(max_forward=1), "max_forward"),
        (dict(backward=3, max_backward=2), "max_backward"),
        (dict(gradient="unrolled"), "gradient"),
    ],
)
def test_adaptive_budget_validation(kwargs, field):
    with pytest.raises(ValueError, match=rf"^AdaptiveBudget: invalid {field}=") as err:
        AdaptiveBudget(**kwargs)
    assert "\n" not in str(err.value)


SMALL = {k: v for k, v in APP_SMALL.items() if k != "cfactor"}


def test_cli_adaptive_budget_flags_report_and_progress(f32, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    group = text[text.index("cycle budget (instead of a tolerance)") :]
    for flag in ("--budget-theta", "--budget-max-cycles", "--budget-check-every"):
        assert flag in group.split("solver details")[0]
    run = tmp_path / "a"
    argv = ["train", *flags(SMALL), "--recipe", "budget", "--budget-theta", "0.2"]
    assert main([*argv, "--cfactor", "4", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "est. gradient error" in out and "cycles" in out
    cfg = TrainConfig(**json.loads((run / "config.json").read_text()))
    assert cfg.budget == AdaptiveBudget(2, 1, theta=0.2)
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["budget_fwd_cycles_mean"] >= 2 and r["budget_grad_err_est"] > 0 for r in rows)
    assert "est. grad err" in (run / "report.md").read_text()
    with pytest.raises(ValueError, match="--budget-theta"):
        TrainConfig(solver="mgrit", budget_theta=0.1)
    # --recipe budget is the adaptive budget at theta 0.1; --budget-theta none the fixed 2/1
    assert TrainConfig(**with_recipe({"recipe": "budget"})).budget == AdaptiveBudget(2, 1)
    fixed = TrainConfig(**with_recipe({"recipe": "budget", "budget_theta": None}))
    assert fixed.budget == Budget(2, 1) and not fixed.budget.adaptive
