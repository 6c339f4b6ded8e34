"""Residual histories and the divergence guard."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_ref, max_errors

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
    ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=8, tol=1e-12, max_iters=30))
    x = torch.randn(2000, 3, 4, requires_grad=True)
    y, hn = ours(x)
    (y.sum() + hn.sum()).backward()
    for stats in ours.last_stats.forward + ours.last_stats.backward:
        hist = stats.residuals
        assert stats.converged and hist[-1] <= 1e-12
        assert all(b < a for a, b in zip(hist, hist[1:])), hist


def test_guard_falls_back_to_serial_and_says_so():
    ref = expanding_ref()
    ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=8, max_iters=15, tol=1e-12))
    x, h0 = torch.randn(2000, 2, 3), torch.randn(1, 2, 16)
    with pytest.warns(mgrit_gru.DivergenceWarning, match="diverged; falling back to the exact"):
        errors = max_errors(ref, ours, x, h0)
    assert max(errors[:2]) < 1e-12
    assert errors[2] < 1e-6  # gradients of a chaotic GRU are large: |grad| up to ~1e4 here
    stats = ours.last_stats.forward[0]
    assert stats.fell_back and stats.converged
    assert stats.residuals[-1] > stats.residuals[0]  # the history that triggered it is kept
    assert ours.last_stats.fell_back


def test_guard_can_raise_instead():
    ours = mgrit_gru.GRU.from_torch(
        expanding_ref(), solver=mgrit_gru.MGRIT(cfactor=8, max_iters=15, on_divergence="raise")
    )
    with pytest.raises(mgrit_gru.DivergenceError, match="forward solve diverged"):
        ours(torch.randn(2000, 2, 3))


def test_no_warning_when_converging():
    ours = mgrit_gru.GRU(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, _ = ours(torch.randn(500, 2, 3))
        y.sum().backward()
    assert not ours.last_stats.fell_back


def test_unconverged_is_data_not_an_error():
    ref = make_ref(3, 6, zbias=4.0)
    ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=16, tol=1e-14, max_iters=1))
    ours(torch.randn(1000, 2, 3))
    stats = ours.last_stats.forward[0]
    assert not stats.converged and stats.iterations == 1 and len(stats.residuals) == 2


def test_backoff_skips_mgrit_after_divergence_and_doubles():
    """on_divergence="backoff": after a divergence the next call of that layer and pass goes
    straight to the serial solve, after a second one in a row the next 2, then 4; results
    stay the serial solve's, and the stats say which calls skipped MGRIT."""
    ref = expanding_ref()
    opts = mgrit_gru.MGRIT(cfactor=8, max_iters=15, tol=1e-12, on_divergence="backoff")
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x = torch.randn(400, 2, 3, requires_grad=True)
    with torch.no_grad():
        y_ref, _ = ref(x)
    pattern = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mgrit_gru.DivergenceWarning)
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
    from mgrit_gru.gru.solve import DivergenceMemory

    memory, key = DivergenceMemory(), ("forward", 0, False)
    memory.record(key, diverged=True)
    memory.record(key, diverged=True)  # the next 2 calls skip
    assert [memory.skip(key) for _ in range(3)] == [True, True, False]
    memory.record(key, diverged=False)
    memory.record(key, diverged=True)  # back to skipping 1
    assert [memory.skip(key) for _ in range(2)] == [True, False]
    assert not memory.skip(("backward", 0, False))


def test_default_fallback_tries_mgrit_on_every_call():
    ours = mgrit_gru.GRU.from_torch(
        expanding_ref(), solver=mgrit_gru.MGRIT(cfactor=8, max_iters=15, tol=1e-12)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mgrit_gru.DivergenceWarning)
        for _ in range(3):
            ours(torch.randn(400, 2, 3))
            assert ours.last_stats.fell_back and not ours.last_stats.forward[0].skipped
