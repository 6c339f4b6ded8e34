"""Residual histories and the divergence guard."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_ref, max_errors, tight

import mgrit_gru


def expanding_ref():
    """Large recurrent weights: chaotic dynamics that MGRIT with cfactor 8 cannot resolve."""
    ref = make_ref(3, 16)
    with torch.no_grad():
        ref.weight_hh_l0.mul_(5.0)
    return ref


@pytest.mark.parametrize("zbias", [0.0, 3.0])
def test_residuals_decrease_for_contractive_gru(zbias):
    ref = make_ref(4, 8, zbias=zbias)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=8, tol=1e-12, max_iters=30))
    x = torch.randn(2000, 3, 4, requires_grad=True)
    y, hn = ours(x)
    (y.sum() + hn.sum()).backward()
    for stats in ours.last_stats.forward + ours.last_stats.backward:
        hist = stats.residuals
        assert stats.converged and hist[-1] <= 1e-12
        assert all(b < a for a, b in zip(hist, hist[1:])), hist


NO_COST = mgrit_gru.Guard(cost=False)  # patience alone judges


def test_guard_falls_back_to_serial_and_says_so():
    ref = expanding_ref()
    opts = mgrit_gru.MGRIT(cfactor=8, max_iters=15, tol=1e-12, guard=NO_COST)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x, h0 = torch.randn(2000, 2, 3), torch.randn(1, 2, 16)
    with pytest.warns(mgrit_gru.DivergenceWarning, match="diverged; falling back to the exact"):
        errors = max_errors(ref, ours, x, h0)
    assert max(errors[:2]) < 1e-12
    assert errors[2] < 1e-6  # gradients of a chaotic GRU are large: |grad| up to ~1e4 here
    stats = ours.last_stats.forward[0]
    assert stats.fell_back and stats.converged and stats.stopped == "diverged"
    history = stats.residuals  # the history that triggered it is kept: no new minimum
    assert len(history) == 1 + history.index(min(history)) + NO_COST.patience
    assert ours.last_stats.fell_back


def test_guard_waits_for_a_residual_that_grows_then_converges():
    """Trained networks' residuals may grow for a cycle or two before they fall (seen on the
    trained checkpoints: up to 3 cycles without a new minimum). Here the second relaxation's
    residual grows (5.4e-1, 8.1e-1, 5.5e-1, then 4.6e-1 ...; relative to the states, so the
    first, from the zero guess, is 1) and the solve then converges: the default patience waits;
    "diverged at the first growth" (patience 1), or the old rule "above the first
    residual", would have abandoned it."""
    torch.manual_seed(3)
    ref = make_ref(3, 6, zbias=2.5)
    kw = dict(relax="F", cfactor=8, levels=3, coarse="implicit", tol=1e-10, max_iters=60)
    ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(**kw, guard=NO_COST))
    x = torch.randn(1000, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x)
    stats = ours.last_stats.forward[0]
    h = stats.residuals
    assert stats.converged and not stats.fell_back and h[3] > h[1] < h[2]
    impatient = mgrit_gru.MGRIT(**kw, guard=mgrit_gru.Guard(patience=1, cost=False))
    ours.solver = impatient
    with pytest.warns(mgrit_gru.DivergenceWarning):
        ours(x)
    assert ours.last_stats.forward[0].stopped == "diverged"


def test_guard_can_raise_instead():
    opts = mgrit_gru.MGRIT(cfactor=8, max_iters=15, on_divergence="raise", guard=NO_COST)
    ours = mgrit_gru.GRU.from_torch(expanding_ref(), solver=opts)
    with pytest.raises(mgrit_gru.DivergenceError, match="forward solve diverged"):
        ours(torch.randn(2000, 2, 3))


def test_no_warning_when_converging():
    ours = mgrit_gru.GRU(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, _ = ours(torch.randn(500, 2, 3))
        y.sum().backward()
    # nothing fell back but where the cost guard judged the serial solve cheaper (the
    # compiled sweeps make it so; a choice, not a failure: no warning)
    assert all(s.stopped == "cost" for s in ours.last_stats.solves if s.fell_back)


def _capped(on_unconverged):
    """A long-memory GRU that one cycle cannot solve to 1e-12 (and no guard stops earlier)."""
    ref = make_ref(3, 6, zbias=4.0)
    opts = tight(cfactor=16, tol=1e-12, max_iters=1, on_unconverged=on_unconverged)
    return ref, mgrit_gru.GRU.from_torch(ref, solver=opts)


def test_a_capped_solve_falls_back_and_warns():
    """A solve at its cycle cap above tol returns the serial solve's exact result, says so
    once, and keeps the residual history that led there."""
    ref, ours = _capped("fallback")
    x = torch.randn(1000, 2, 3)
    with pytest.warns(mgrit_gru.ConvergenceWarning, match="cycle cap above the tolerance"):
        y, _ = ours(x)
    with torch.no_grad():
        assert (y - ref(x)[0]).abs().max() < 1e-12
    stats = ours.last_stats.forward[0]
    assert stats.fell_back and stats.converged and stats.stopped == "cap"
    assert stats.iterations == 1 and len(stats.residuals) == 2 and stats.residuals[-1] > 1e-12


def test_a_capped_solve_can_keep_its_result_or_raise():
    ref, ours = _capped("warn")
    x = torch.randn(1000, 2, 3)
    with pytest.warns(mgrit_gru.ConvergenceWarning, match="its result is kept"):
        y, _ = ours(x)
    stats = ours.last_stats.forward[0]
    assert not stats.converged and not stats.fell_back and stats.levels > 1
    with torch.no_grad():
        assert (y - ref(x)[0]).abs().max() > 1e-12
    _, ours = _capped("raise")
    with pytest.raises(mgrit_gru.DivergenceError, match="did not reach tol within max_iters=1"):
        ours(x)


def test_backoff_skips_mgrit_after_divergence_and_doubles():
    """on_divergence="backoff": after a divergence the next call of that layer and pass goes
    straight to the serial solve, after a second one in a row the next 2, then 4; results
    stay the serial solve's, and the stats say which calls skipped MGRIT."""
    ref = expanding_ref()
    opts = mgrit_gru.MGRIT(
        cfactor=8, max_iters=15, tol=1e-12, on_divergence="backoff", guard=NO_COST
    )
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x = torch.randn(400, 2, 3, requires_grad=True)
    with torch.no_grad():
        y_ref, _ = ref(x)
    pattern = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mgrit_gru.DivergenceWarning)
        warnings.simplefilter("ignore", mgrit_gru.ConvergenceWarning)  # or the cycle cap
        for _ in range(8):
            y, h_n = ours(x)
            (y.sum() + h_n.sum()).backward()
            fwd, bwd = ours.last_stats.forward[0], ours.last_stats.backward[0]
            assert fwd.fell_back and bwd.fell_back and (y - y_ref).abs().max() < 1e-12
            assert fwd.skipped == bwd.skipped  # both passes diverge on this GRU
            pattern.append("s" if fwd.skipped else "d")
    # tried and diverged (d), then skip 1, try, skip 2, try, skip 4 (cut at 8 calls)
    assert "".join(pattern) == "dsdssdss"
    assert "backing off" in ours.last_stats.summary()


def test_backoff_resets_after_a_converged_solve():
    from mgrit_gru.layer.control import DivergenceMemory, Outcome

    memory, key = DivergenceMemory(), ("forward", 0, False)
    diverged, converged = Outcome(True, 2.0, 1.0, "diverged"), Outcome(True, 0.5, 1.0)
    memory.record(key, diverged)
    memory.record(key, diverged)  # the next 2 calls skip
    assert [bool(memory.skip(key)) for _ in range(3)] == [True, True, False]
    memory.record(key, converged)
    memory.record(key, diverged)  # back to skipping 1
    assert [bool(memory.skip(key)) for _ in range(2)] == [True, False]
    assert not memory.skip(("backward", 0, False))


def test_default_fallback_tries_mgrit_on_every_call():
    ours = mgrit_gru.GRU.from_torch(
        expanding_ref(), solver=mgrit_gru.MGRIT(cfactor=8, max_iters=15, tol=1e-12, guard=NO_COST)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mgrit_gru.DivergenceWarning)
        warnings.simplefilter("ignore", mgrit_gru.ConvergenceWarning)  # or the cycle cap
        for _ in range(3):
            ours(torch.randn(400, 2, 3))
            assert ours.last_stats.fell_back and not ours.last_stats.forward[0].skipped
