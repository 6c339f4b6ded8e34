"""The cost guard and solver="auto": MGRIT pays or stops, and the faster solver is chosen."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import make_ref

import mgrit_gru
from mgrit_gru import cost
from mgrit_gru.core.cycle import ProgressGuard


@pytest.fixture
def mgrit_step_costs(monkeypatch):
    """Inject a cost: every step a solve runs is charged ``factor`` times the model's (the
    serial alternative it is compared with keeps the model's price)."""
    add = cost.Meter.add

    def set_factor(factor: float) -> None:
        def scaled(self, kind, rows, calls=1, level=0, cost_kind=""):
            add(self, kind, rows, calls, level, cost_kind)
            step = cost.step_us(cost_kind or kind, rows, self.hidden, dtype=self.dtype)
            self.spent += (factor - 1) * calls * step

        monkeypatch.setattr(cost.Meter, "add", scaled)

    return set_factor


def _call(gru, x, ref=None):
    y, h = gru(x)
    (y.sum() + h.sum()).backward()
    if ref is not None:
        with torch.no_grad():
            y_ref, _ = ref(x)
        assert (y - y_ref).abs().max() < 1e-4  # MGRIT's tolerance, or the serial solve
    return gru.last_stats


def _pattern(fwd) -> str:
    """m: solved by MGRIT, f: MGRIT tried and fell back, s: the choice skipped MGRIT."""
    if fwd.skipped:
        assert fwd.reason.startswith("auto: serial (MGRIT cost") and not fwd.fell_back
        return "s"
    return "m" if fwd.by_mgrit else "f"


def test_auto_switches_to_serial_when_mgrit_costs_more_and_back(mgrit_step_costs):
    """Made 1.1x dearer than the serial solve, MGRIT loses its call and the next calls go
    serial, with MGRIT retried after 4, 8, 16 ... calls; made cheap again, the next retry
    wins and it stays."""
    ref = make_ref(3, 8)
    # the PyTorch steps, where a random-init GRU makes MGRIT pay (the compiled sweeps cost
    # what their rows do: there the serial solve wins; see test_auto_with_compiled_sweeps)
    gru = mgrit_gru.GRU.from_torch(ref, kernels="pytorch")  # solver="auto"
    x = torch.randn(2000, 2, 3)
    first = _call(gru, x, ref).forward[0]
    assert first.by_mgrit  # a random-init GRU: MGRIT pays
    mgrit_step_costs(1.1 * first.serial_cost / first.cost)
    pattern = "".join(_pattern(_call(gru, x, ref).forward[0]) for _ in range(8))
    assert pattern == "mssssmss"  # lost (by_mgrit, dearer), wait 4, lost, wait 8 (cut)
    assert gru.last_stats.forward[0].reason.startswith("auto: serial (MGRIT cost 1.10x")
    mgrit_step_costs(0.001)  # MGRIT is now nearly free
    pattern = "".join(_pattern(_call(gru, x, ref).forward[0]) for _ in range(8))
    assert pattern == "ssssssmm"  # the rest of the wait, then MGRIT for good
    assert sum(stats.by_mgrit for stats in gru.last_stats.solves) == 2


def test_auto_waits_long_enough_that_losing_tries_stay_cheap(mgrit_step_costs):
    """The wait after a losing try is at least the try's excess over the serial solve divided
    by TRY_SHARE (here more than the doubling's first 4), so the tries that lose add at most
    about TRY_SHARE to the serial work between them."""
    from mgrit_gru.layer.control import AutoChoice

    ref = make_ref(3, 8)
    gru = mgrit_gru.GRU.from_torch(ref, kernels="pytorch")
    x = torch.randn(2000, 2, 3)
    first = _call(gru, x, ref).forward[0]
    mgrit_step_costs(1.4 * first.serial_cost / first.cost)  # MGRIT now loses by 40%
    tries, pattern = [], ""
    while len(tries) < 3:
        fwd = _call(gru, x, ref).forward[0]
        pattern += _pattern(fwd)
        if not fwd.skipped:
            tries.append(fwd.cost / fwd.serial_cost - 1.0)  # the excess, in serial solves
    waits = [len(run) for run in pattern.split("m")[1:-1]]
    expected = [
        max(4 * 2**k, math.ceil(excess / AutoChoice.TRY_SHARE))
        for k, excess in enumerate(tries[:2])
    ]
    assert waits == expected and waits[0] > 4
    assert sum(tries[:2]) <= AutoChoice.TRY_SHARE * (len(pattern) - 1) * 1.0001


def test_an_explicit_mgrit_is_never_switched(mgrit_step_costs):
    """solver=MGRIT(...) runs MGRIT on every call, however dear (its cost guard is off unless
    asked for); with the cost guard asked for, a solve stops when dear and the result is the
    serial one, exactly."""
    ref = make_ref(3, 8)
    # chunks of 32 (three levels, a V-cycle to run): the compiled sweeps' own rule takes 128
    # here, where the first relaxation and the coarse solve leave no cycle to stop
    gru = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=32))
    mgrit_step_costs(1000.0)
    x = torch.randn(2000, 2, 3)
    for _ in range(4):
        for s in _call(gru, x, ref).solves:
            assert s.by_mgrit and not s.skipped and not s.fell_back
    gru.solver = mgrit_gru.MGRIT(cfactor=32, guard=mgrit_gru.Guard(cost=True))
    for _ in range(4):
        stats = _call(gru, x, ref)
        assert stats.forward[0].stopped == "cost" and stats.forward[0].fell_back
        for s in stats.solves:  # a solve done after its first relaxation has no cycle to stop
            assert not s.skipped and (s.stopped == "cost" or (s.by_mgrit and s.iterations == 0))
    with torch.no_grad():
        assert (gru(x)[0] - ref(x)[0]).abs().max() < 1e-12  # the exact serial result
    assert mgrit_gru.Auto(mgrit_gru.MGRIT()).mgrit.guard.cost  # auto always stops when dear


def test_the_cost_guard_stops_a_slow_solve_and_the_result_is_exact():
    """A long-memory GRU that needs many cycles: with the cost guard the solve stops once
    finishing it would cost more than the serial solve (earlier than without the guard)
    and returns the serial solve's result."""
    ref = make_ref(3, 16, zbias=3.0)
    with torch.no_grad():
        ref.weight_hh_l0.mul_(2.5)
    x = torch.randn(4096, 2, 3)
    opts = mgrit_gru.MGRIT(
        cfactor=16, max_iters=40, coarse="implicit", guard=mgrit_gru.Guard(cost=True)
    )
    guarded = mgrit_gru.GRU.from_torch(ref, solver=opts)
    free = mgrit_gru.GRU.from_torch(ref, solver=opts.replace(guard=mgrit_gru.Guard(40, cost=False)))
    with torch.no_grad():
        y, _ = guarded(x)
        free(x)
        y_ref, _ = ref(x)
    stats, unguarded = guarded.last_stats.forward[0], free.last_stats.forward[0]
    assert stats.stopped == "cost" and stats.fell_back and stats.converged
    assert stats.iterations < unguarded.iterations
    assert stats.cost < stats.serial_cost + unguarded.cost
    assert (y - y_ref).abs().max() < 1e-6


def test_progress_guard_verdicts():
    """Patience counts relaxations without a new smallest residual; growth at round-off
    level is not judged; the cost part predicts the cycles still needed from the last rate."""
    guard = ProgressGuard(1e-5, patience=2, floor=1e-12)
    assert guard([1.0, 2.0]) is None  # one relaxation without progress: wait
    assert guard([1.0, 2.0, 0.5]) is None  # then it fell below the best
    assert guard([1.0, 2.0, 3.0]) == "diverged"
    assert guard([1e-13, 2e-13, 3e-13]) is None  # round-off
    spent = iter([10.0, 20.0, 30.0])
    cheap = ProgressGuard(1e-5, patience=2, spent=lambda: next(spent), alternative=100.0)
    assert cheap([1.0]) is None  # a cycle (10) is cheaper than the alternative
    assert cheap([1.0, 0.1]) is None  # 4 more cycles x 10 < 100
    spent = iter([10.0, 20.0])
    slow = ProgressGuard(1e-5, patience=2, spent=lambda: next(spent), alternative=100.0)
    slow([1.0])
    assert slow([1.0, 0.8]) == "cost"  # 52 more cycles x 10 > 100
    spent = iter([120.0])
    assert ProgressGuard(1e-5, 2, lambda: next(spent), 100.0)([1.0]) == "cost"  # spent it all


def test_auto_choice_state_round_trips():
    gru = mgrit_gru.GRU(3, 8)
    x = torch.randn(500, 2, 3)
    for _ in range(3):
        _call(gru, x)
    state = gru.solver_state()
    other = mgrit_gru.GRU(3, 8)
    other.load_solver_state(state)
    assert other.solver_state() == state
    assert set(state["auto"]) == {"forward/0/False", "backward/0/False"}


def test_auto_with_compiled_sweeps_prices_them():
    """With the compiled sweeps both sides of the choice are priced as those steps (next to
    no overhead per step: a serial sweep costs about what its rows do), and what ran says so."""
    ref = make_ref(3, 8)
    gru = mgrit_gru.GRU.from_torch(ref, kernels="compiled")
    x = torch.randn(2000, 2, 3)
    stats = _call(gru, x, ref)
    assert {s.kernels for s in stats.solves} == {"compiled"}
    fwd, bwd = stats.forward[0], stats.backward[0]
    sweep, adjoint = (cost.step_us(k, 2, 8, dtype=x.dtype) for k in ("sweep", "sweep_adjoint"))
    assert fwd.serial_cost == pytest.approx(2000 * sweep, rel=1e-9)
    assert bwd.serial_cost == pytest.approx(2000 * adjoint, rel=1e-9)
    assert fwd.row_steps >= 2000 * 2 and bwd.row_steps >= 2000 * 2  # at least a sweep each


@pytest.mark.parametrize(
    "hidden, steps, dtype",
    [(8, 100_000, torch.float64), (1, 20_000, torch.float32), (24, 30_000, torch.float64)],
)
def test_auto_does_not_try_mgrit_that_the_model_rules_out(hidden, steps, dtype):
    """Issue 39, item 3: at long T, one sequence and a small hidden size MGRIT's first
    relaxation alone (m - 1 steps over all T / m chunks) costs about the whole serial sweep,
    which the model now prices (a row's cost at small H is mostly its gate math, not the
    GEMM's H^2): auto solves serially without trying MGRIT, and says why. (The built-in
    table, not a clock.)"""
    torch.manual_seed(0)
    gru = mgrit_gru.GRU(1, hidden, dtype=dtype, kernels="compiled")  # solver="auto"
    with torch.no_grad():
        gru(torch.randn(steps, 1, 1, dtype=dtype))
    fwd = gru.last_stats.forward[0]
    assert fwd.skipped and not fwd.by_mgrit and fwd.levels == 1 and not fwd.fell_back
    assert fwd.reason.startswith("auto: serial (the model prices MGRIT's first relaxation")
    assert fwd.cost == pytest.approx(fwd.serial_cost)  # nothing was spent on MGRIT
    m = mgrit_gru.MGRIT().resolve(steps, 1, hidden).cfactor
    least = cost.first_relaxation_us("sweep", m, -(-steps // m), 1, hidden, dtype=dtype, levels=2)
    assert cost.mgrit_hopeless(least, fwd.serial_cost)


def test_a_serial_choice_makes_no_forcing_pass(monkeypatch):
    """Where auto solves the backward serially without trying MGRIT, the adjoint's right-hand
    side in reversed time (a pass over every step's gradient, only MGRIT reads it) is not made:
    the gradients are the serial solver's bit for bit. A NaN or Inf gradient still goes to the
    serial solve without a try or a fallback, as in autograd, NaN where torch has it."""
    from mgrit_gru.layer import solve as layer_solve

    calls = []
    forcing = layer_solve.reversed_forcing

    def counting(*args, **kw):
        calls.append(1)
        return forcing(*args, **kw)

    monkeypatch.setattr(layer_solve, "reversed_forcing", counting)
    torch.manual_seed(0)
    ref = torch.nn.GRU(1, 8, dtype=torch.float64)
    x = torch.randn(100_000, 1, 1, dtype=torch.float64)
    grads = []
    for solver in ("auto", "serial"):
        gru = mgrit_gru.GRU.from_torch(ref, solver=solver, kernels="compiled")
        y, _ = gru(x)
        y.sum().backward()
        bwd = gru.last_stats.backward[0]
        assert bwd.levels == 1 and not bwd.fell_back
        assert bwd.skipped == (solver == "auto")
        grads.append([p.grad for p in gru.parameters()])
    assert not calls
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # a NaN in the output's gradient: MGRIT (asked for) is not tried, nothing falls back
    gru = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=16), kernels="compiled")
    y, _ = gru(x[:2000])
    seed = torch.ones_like(y)
    seed[1500] = math.nan
    y.backward(seed)
    bwd = gru.last_stats.backward[0]
    assert bwd.levels == 1 and not bwd.fell_back and not bwd.skipped and calls
    torch_gru = copy.deepcopy(ref)
    y_t, _ = torch_gru(x[:2000])
    y_t.backward(seed)
    for a, b in zip(gru.parameters(), torch_gru.parameters()):
        assert torch.equal(torch.isnan(a.grad), torch.isnan(b.grad))


def test_the_model_prices_small_hidden_sizes_and_float64():
    """The cause of item 3: the former model scaled a row's cost by (H / 64)^1.75, which at
    H = 8 is 0.026 of H = 64's (measured: 0.11-0.13) and at H = 1 7e-4 (measured 0.02-0.04);
    float64 was priced as float32 (measured 1.3-2x a row, 4x the pass over W_hh)."""
    rows = 4096
    wide = {h: cost.step_us("sweep", rows, h) for h in (1, 8, 64, 256)}
    assert 0.02 < wide[1] / wide[64] < 0.06 and 0.09 < wide[8] / wide[64] < 0.16
    assert 6 < wide[256] / wide[64] < 10
    assert cost.row_scale(64) == 1.0 and cost.step_us("sweep", 12, 64) == pytest.approx(
        sum(cost.BUILTIN["cpu"]["sweep"][i] * (1, 12)[i] for i in (0, 1))
    )
    # the compiled sweeps' GEMM runs groups of four rows: its share of a row (the H^2 term,
    # 0.34 of a row at H = 64) is paid for four at 1-3 rows; the PyTorch steps' is not grouped
    o, c = cost.BUILTIN["cpu"]["sweep"]
    gemm = cost.ROW_SHAPE[2] / sum(cost.ROW_SHAPE)
    for few in (1, 2, 3):
        assert cost.step_us("sweep", few, 64) == pytest.approx(o + c * (few + (4 - few) * gemm))
    assert cost.step_us("step", 1, 64) == pytest.approx(sum(cost.BUILTIN["cpu"]["step"]))
    assert cost.step_us("sweep", 1, 8) / cost.step_us("sweep", 4, 8) < 0.3  # little GEMM at H = 8
    for h in (1, 8, 64, 256):
        f32 = cost.step_us("sweep", rows, h, dtype=torch.float32)
        f64 = cost.step_us("sweep", rows, h, dtype=torch.float64)
        assert f64 == pytest.approx(2 * f32, rel=0.05)
    # a step's pass over W_hh: at one row H = 256 costs far more than its row
    assert cost.step_us("sweep", 1, 256) > 10 * cost.step_us("sweep", 1, 64) / 2
    # the a-priori test: MGRIT that cannot win by more than the model's error is not tried
    assert cost.mgrit_hopeless(60.0, 100.0) and not cost.mgrit_hopeless(40.0, 100.0)
    assert not cost.mgrit_hopeless(1.0, 0.0)
