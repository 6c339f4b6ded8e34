"""Ground truth: torch.nn.GRU + autograd in float64, for outputs, h_n and every gradient."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import grads_of, make_ref, max_errors, tight

import mgrit_gru


@pytest.mark.parametrize(
    "layers,bidirectional,batch_first,with_h0,bias",
    [
        (1, False, False, False, True),
        (1, False, True, True, True),
        (2, False, False, True, True),
        (3, True, False, True, True),
        (2, True, True, False, False),
    ],
)
def test_serial_equals_torch(layers, bidirectional, batch_first, with_h0, bias):
    ref = make_ref(3, 5, layers, bidirectional, batch_first, bias=bias)
    ours = mgrit_gru.GRU.from_torch(ref, solver="serial")
    B, T = 4, 23
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    h0 = torch.randn((2 if bidirectional else 1) * layers, B, 5) if with_h0 else None
    assert max(max_errors(ref, ours, x, h0)) < 1e-12


def test_serial_survives_a_cudnn_refusal(monkeypatch):
    """cuDNN refuses some shapes outright (T = 65536 on an H200, where torch.nn.GRU fails):
    the serial forward then runs the library's own loop, with the same result."""
    ref = make_ref(3, 5)
    x, h0 = torch.randn(31, 2, 3), torch.randn(1, 2, 5)
    ours = mgrit_gru.GRU.from_torch(ref, solver="serial")
    real = torch._VF.gru

    def refuse(*args, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")

    monkeypatch.setattr(torch._VF, "gru", refuse)
    try:
        ours_y, ours_h = ours(x, h0)
    finally:
        monkeypatch.setattr(torch._VF, "gru", real)
    ref_y, ref_h = ref(x, h0)
    assert (ours_y - ref_y).abs().max() < 1e-12 and (ours_h - ref_h).abs().max() < 1e-12
    assert max(max_errors(ref, ours, x, h0)) < 1e-12


MGRIT_CASES = [
    # (relax, levels, cfactor, T)
    ("F", 2, 2, 1),
    ("FCF", 2, 2, 2),
    ("F", 3, 2, 7),
    ("FCF", 4, 2, 7),
    ("FCF", 2, 4, 100),
    ("F", 3, 4, 100),
    ("FCF", 4, 3, 1000),
    ("F", 2, 32, 1000),
    ("FCF", 3, 8, 1459),
    ("F", 3, 16, 1459),
    ("FCF", 2, 32, 1459),
    ("FCF", 4, 5, 1459),
]


@pytest.mark.parametrize("relax,levels,cfactor,T", MGRIT_CASES)
def test_mgrit_to_tolerance_equals_torch(relax, levels, cfactor, T):
    ref = make_ref(3, 6)
    opts = tight(relax=relax, levels=levels, cfactor=cfactor)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x, h0 = torch.randn(T, 2, 3), torch.randn(1, 2, 6)
    assert max(max_errors(ref, ours, x, h0)) < 1e-8
    stats = ours.last_stats
    assert stats.converged and not stats.fell_back
    assert len(stats.forward) == len(stats.backward) == 1


COARSE = [
    mgrit_gru.Implicit("average"),
    mgrit_gru.Implicit("inject"),
    "frozen",
    "secant",
    mgrit_gru.Secant(depth=1),
]


@pytest.mark.parametrize(
    "relax,cfactor,levels", [("FCF", 16, "auto"), ("FCF", 4, 4), ("F", 8, 2), ("FCFCF", 8, 3)]
)
@pytest.mark.parametrize("coarse", COARSE)
def test_mgrit_long_memory_equals_torch(relax, cfactor, levels, coarse):
    ref = make_ref(3, 6, zbias=4.0)
    opts = tight(relax=relax, cfactor=cfactor, levels=levels, coarse=coarse)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x, h0 = torch.randn(1459, 2, 3), torch.randn(1, 2, 6)
    assert max(max_errors(ref, ours, x, h0)) < 1e-8
    stats = ours.last_stats
    assert stats.converged and not stats.fell_back
    assert stats.forward_iterations >= 2  # the hard case needs real cycles


def test_auto_cfactor_is_resolved_per_call_and_exact_to_tolerance():
    ref = make_ref(3, 6)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor="auto", levels="auto"))
    x, h0 = torch.randn(5000, 2, 3), torch.randn(1, 2, 6)
    assert max(max_errors(ref, ours, x, h0)) < 1e-8
    # the model picks m = 32 for the PyTorch steps here (5000 * 2 rows are few): 5000 -> 157 ->
    # 5 steps, 3 levels; longer chunks for the compiled sweeps (less fixed cost a step):
    # 5000 -> 5000 / m <= m steps, 2 levels
    m = ours.time_cfactor(5000, 2)
    compiled = ours.last_stats.forward[0].kernels == "compiled"
    assert m > 32 if compiled else m == 32
    assert [s.levels for s in ours.last_stats.forward] == [2 if compiled else 3]
    assert ours.solver.cfactor == "auto"  # the module keeps the request, not one call's pick


@pytest.mark.parametrize("coarse", ["implicit", "frozen", "secant"])
def test_mgrit_multilayer_bidirectional_batch_first_unbatched(coarse):
    ref = make_ref(3, 5, layers=2, bidirectional=True, batch_first=True, zbias=2.0)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=4, coarse=coarse))
    x, h0 = torch.randn(3, 130, 3), torch.randn(4, 3, 5)
    assert max(max_errors(ref, ours, x, h0)) < 1e-8
    assert len(ours.last_stats.forward) == 4
    # unbatched input: (T, I) and h0 (D * layers, H)
    y_r, h_r = ref(x[0], h0[:, 0])
    y_o, h_o = ours(x[0], h0[:, 0])
    assert y_o.shape == y_r.shape == (130, 10) and h_o.shape == (4, 5)
    assert (y_o - y_r).abs().max() < 1e-8 and (h_o - h_r).abs().max() < 1e-8


def test_default_mgrit_options_are_accurate_in_float32():
    """MGRIT() as it comes (the automatic choice may take the serial solve for so small a
    layer: the cost model prices MGRIT's first relaxation above the serial solve)."""
    ref = make_ref(8, 16, dtype=torch.float32)
    ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT())
    x = torch.randn(3000, 2, 8, dtype=torch.float32)
    with torch.no_grad():
        err = (ours(x)[0] - ref(x)[0]).abs().max().item()
    assert err < 1e-4
    assert ours.last_stats.forward[0].levels >= 2


@pytest.mark.parametrize("coarse", ["implicit", "secant"])
def test_gradcheck_through_mgrit(coarse):
    ref = make_ref(2, 3)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=3, levels=3, coarse=coarse))
    x = torch.randn(20, 2, 2, requires_grad=True)
    h0 = torch.randn(1, 2, 3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ours(a, b), (x, h0))


def test_parareal_property_through_the_gru():
    """Two levels, F-relaxation: exact after (coarse intervals - 1) cycles, not before."""
    ref = make_ref(3, 6, zbias=3.0)
    T, m = 60, 6  # 10 coarse intervals
    x = torch.randn(T, 2, 3)
    with torch.no_grad():
        y_ref = ref(x)[0]

    def error(iters):
        guard = mgrit_gru.Guard(patience=100, cost=False)
        opts = mgrit_gru.MGRIT(
            relax="F", levels=2, cfactor=m, tol=0.0, max_iters=iters, guard=guard, coarse="implicit"
        ).replace(on_unconverged="warn")  # keep what the capped cycles computed
        with torch.no_grad(), pytest.warns(mgrit_gru.ConvergenceWarning):
            return (mgrit_gru.GRU.from_torch(ref, solver=opts)(x)[0] - y_ref).abs().max().item()

    assert error(T // m - 1) < 1e-13
    assert error(T // m - 2) > 1e-10


def test_dropout_between_layers_matches_manual_composition():
    ours = mgrit_gru.GRU(3, 4, num_layers=2, dropout=0.5, solver=tight(cfactor=4)).train()
    x = torch.randn(50, 2, 3)
    torch.manual_seed(7)
    y, _ = ours(x)
    first = mgrit_gru.GRU(3, 4, solver="serial")
    second = mgrit_gru.GRU(4, 4, solver="serial")
    first.load_state_dict(
        {k.replace("_l0", "_l0"): v for k, v in ours.state_dict().items() if k.endswith("_l0")}
    )
    second.load_state_dict(
        {k.replace("_l1", "_l0"): v for k, v in ours.state_dict().items() if k.endswith("_l1")}
    )
    torch.manual_seed(7)
    y_manual = second(torch.nn.functional.dropout(first(x)[0], 0.5, training=True))[0]
    assert (y - y_manual).abs().max() < 1e-8
    ours.eval()
    y_eval = ours(x)[0]
    assert (y_eval - second(first(x)[0])[0]).abs().max() < 1e-8


@pytest.mark.parametrize("solver", ["serial", "implicit", "frozen", "secant"])
def test_implicit_cell_serial_and_mgrit_agree_with_literal_loop(solver):
    from test_cell import implicit_reference

    opts = "serial" if solver == "serial" else tight(cfactor=4, coarse=solver)
    ours = mgrit_gru.GRU(3, 5, cell="implicit", solver=opts)
    x = torch.randn(90, 2, 3, requires_grad=True)
    w_ih, w_hh = ours.weight_ih_l0, ours.weight_hh_l0
    b_ih, b_hh = ours.bias_ih_l0, ours.bias_hh_l0
    h, outs = torch.zeros(2, 5), []
    for t in range(90):
        h = implicit_reference(h, x[t] @ w_ih.t() + b_ih, w_hh, b_hh, 1.0)
        outs.append(h)
    y_ref = torch.stack(outs)
    y, _ = ours(x)
    assert (y - y_ref).abs().max() < 1e-10
    w = torch.randn_like(y)
    g_ref = torch.autograd.grad((y_ref * w).sum(), [x] + list(ours.parameters()))
    g = torch.autograd.grad((y * w).sum(), [x] + list(ours.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(g, g_ref)) < 1e-9


def test_state_dict_round_trip_with_torch():
    ours = mgrit_gru.GRU(3, 5, num_layers=2, bidirectional=True)
    ref = torch.nn.GRU(3, 5, num_layers=2, bidirectional=True)
    ref.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    back = mgrit_gru.GRU(3, 5, num_layers=2, bidirectional=True)
    back.load_state_dict(ref.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), ours.parameters()))


def test_two_calls_before_backward_keep_their_own_results():
    """Work buffers are pooled across calls: nothing returned or saved may alias them."""
    ref = make_ref(3, 6, zbias=2.0)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=8))
    xa, xb = torch.randn(300, 2, 3), torch.randn(300, 2, 3)
    ha, hb = torch.randn(1, 2, 6), torch.randn(1, 2, 6)
    wa, wb = torch.randn(300, 2, 6), torch.randn(300, 2, 6)
    results = []
    for module in (ref, ours):
        leaves = [t.clone().requires_grad_() for t in (xa, ha, xb, hb)]
        ya, hna = module(leaves[0], leaves[1])
        yb, hnb = module(leaves[2], leaves[3])
        loss = (ya * wa).sum() + (yb * wb).sum() + hna.sum() - hnb.sum()
        results.append([ya, yb, hna, hnb, *torch.autograd.grad(loss, leaves)])
    for a, b in zip(*results):
        assert (a - b).abs().max() < 1e-8


def test_autocast_bf16_runs_the_solve_in_the_parameters_dtype():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 8).float()
    gru = mgrit_gru.GRU(8, 16, dtype=torch.float32, solver="mgrit")
    x = torch.randn(300, 2, 4, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        u = lin(x)
        assert u.dtype == torch.bfloat16  # an autocast layer before the GRU
        y, h_n = gru(u)
        y_torch, _ = gru.to_torch()(u)
    assert y.dtype == h_n.dtype == y_torch.dtype == torch.bfloat16  # torch's dtype
    (y.float().sum() + h_n.float().sum()).backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()
    y_fp32, _ = gru(u.detach().float())  # the solve ran in float32
    assert torch.equal(y.detach(), y_fp32.detach().to(torch.bfloat16))


@pytest.mark.parametrize(
    "solver,cell,varlen,bidirectional,B",
    [
        ("serial", "classic", True, False, 64),
        ("serial", "classic", False, False, 64),
        ("serial", "classic", True, False, 3),
        ("FCF", "classic", False, True, 1),
        ("FCF", "classic", False, True, 3),
        ("F", "implicit", False, False, 3),
        ("FCF", "classic", True, True, 3),
    ],
)
def test_kept_gates_equal_recomputed_gates(monkeypatch, solver, cell, varlen, bidirectional, B):
    """keep_gates=True (the default: the backward linearises from the forward's gates) and
    False (recomputes them) give the same outputs and gradients. The gates are kept where the
    fine steps are wide (MGRIT's chunks, or a batch of 64 in the serial sweep), not for a serial
    sweep over 3 sequences, nor where the serial forward runs torch's fused loop. The compiled
    sweeps keep them always (a copy inside their own loop), MGRIT's adjoint linearises from
    them in one compiled pass, and the compiled serial adjoint in its own loop."""
    from mgrit_gru.gru import cell as gru
    from mgrit_gru.layer.solve import FUSED_MAX

    calls = []
    kept_fn = gru.linearise_kept
    monkeypatch.setattr(gru, "linearise_kept", lambda *a: calls.append(1) or kept_fn(*a))
    compiled_fn = gru.GRUCell.kernel_coefficients  # the compiled pass over the kept gates
    monkeypatch.setattr(
        gru.GRUCell,
        "kernel_coefficients",
        lambda *a: calls.append(1) or compiled_fn(*a),
    )
    T = 150
    x = torch.randn(T, B, 3)
    lengths = torch.randint(1, T + 1, (B,)) if varlen else None
    wy = torch.randn(T, B, 10 if bidirectional else 5)
    results = []
    for keep, kernels in ((True, "pytorch"), (False, "pytorch"), (True, "compiled")):
        opts = tight(levels=1) if solver == "serial" else tight(relax=solver, cfactor=4)
        torch.manual_seed(1)
        ours = mgrit_gru.GRU(3, 5, 2, cell=cell, bidirectional=bidirectional, kernels=kernels)
        ours.solver = opts.replace(keep_gates=keep)
        leaf = x.clone().requires_grad_()
        y, h_n = ours(leaf, lengths=lengths)
        loss = (y * wy).sum() + h_n.sum()
        results.append([y, h_n, *torch.autograd.grad(loss, [leaf, *ours.parameters()])])
        rows = B * (1 if solver == "serial" else -(-T // 4))  # per fine step
        fused = solver == "serial" and not varlen and cell == "classic" and B * 5 <= FUSED_MAX
        if kernels == "compiled":  # kept always; a serial adjoint reads them in its own loop
            assert bool(calls) == (keep and solver != "serial")
        else:
            assert bool(calls) == (keep and rows >= 64 and not fused)
        calls.clear()
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert (a - b).abs().max() < 1e-10


def test_second_backward_after_the_kept_gates_were_reused():
    """The kept gates go back to the workspace after the first backward and a later call may
    overwrite them: a second backward (retain_graph) then recomputes the gates."""
    ours = mgrit_gru.GRU(3, 6, solver=tight(cfactor=8))
    x = torch.randn(400, 2, 3, requires_grad=True)  # 50 chunks x 2: wide enough to keep
    y, h_n = ours(x)
    loss = (y * torch.randn_like(y)).sum() + h_n.sum()
    first = torch.autograd.grad(loss, [x, *ours.parameters()], retain_graph=True)
    y2, _ = ours(torch.randn(400, 2, 3))  # takes the pooled gates over
    y2.sum().backward()
    second = torch.autograd.grad(loss, [x, *ours.parameters()])
    for a, b in zip(first, second):
        assert (a - b).abs().max() < 1e-12


def test_inference_keeps_no_gates(monkeypatch):
    from mgrit_gru import workspace

    leased = []
    lease = workspace.lease
    monkeypatch.setattr(workspace, "lease", lambda *a: leased.append(1) or lease(*a))
    ours = mgrit_gru.GRU(3, 6, solver=tight(cfactor=8))
    x = torch.randn(400, 2, 3)
    with torch.no_grad():
        ours(x)
    ours.requires_grad_(False)
    ours(x)
    assert not leased
    ours(x.requires_grad_())
    assert leased


def test_kept_gates_come_from_the_sweep_that_made_the_output():
    """At a loose tolerance one FCF relaxation ends the solve; its first F-sweep started
    from the initial guess, so gates kept from it would be far off. The kept ones must be the
    final sweep's: then they match recomputing at the output to the residual's order."""
    from mgrit_gru.layer import solve

    torch.manual_seed(3)
    ours = mgrit_gru.GRU(3, 6)
    x = torch.randn(2048, 2, 3)  # 64 chunks x 2 rows per step: the gates are kept
    assert solve._worth_keeping([solve.Grid(N=2048, m=32, n=64)] * 2, 2, 2048)
    grads = []
    for keep in (True, False):
        ours.solver = mgrit_gru.MGRIT(cfactor=32, tol=1e-4, keep_gates=keep)
        leaf = x.clone().requires_grad_()
        y, h_n = ours(leaf)
        grads.append(torch.autograd.grad(y.sum() + h_n.sum(), [leaf, *ours.parameters()]))
        assert ours.last_stats.forward[0].iterations == 0
    assert max((a - b).abs().max().item() for a, b in zip(*grads)) < 1e-5


def test_a_full_lease_pool_drops_its_smallest_buffer():
    """With MAX_FREE buffers free and none large enough, a lease drops the smallest (by
    position: comparing tensors with == would fail on unequal sizes) and the call goes on."""
    from mgrit_gru import workspace

    workspace.release()
    like = torch.empty(0)
    out = [workspace.lease((n,), like) for n in (50, 10, 40, 30, 20, 60, 70, 80)]
    for t in out:
        workspace.give_back(t)
    big = workspace.lease((1000,), like)  # fits none: the 10-element buffer goes
    assert big.numel() == 1000
    sizes = sorted(t.numel() for t in workspace._pool()[("lease", like.dtype)])
    assert sizes == [20, 30, 40, 50, 60, 70, 80]
    workspace.release()


def test_leases_are_best_fit_and_never_shared():
    from mgrit_gru import workspace

    workspace.release()
    like = torch.empty(0)
    small, large = workspace.lease((10,), like), workspace.lease((1000,), like)
    workspace.give_back(large)
    workspace.give_back(small)
    again = workspace.lease((5,), like)  # the small one, not the large one
    assert again.untyped_storage().data_ptr() == small.untyped_storage().data_ptr()
    other = workspace.lease((5,), like)  # the large one: never the tensor already out
    assert other.untyped_storage().data_ptr() == large.untyped_storage().data_ptr()
    fresh = workspace.lease((5,), like)  # nothing left in the pool
    assert fresh.untyped_storage().data_ptr() not in {
        small.untyped_storage().data_ptr(),
        large.untyped_storage().data_ptr(),
    }
    workspace.release()


def test_early_exit_keeps_the_first_sweeps_gates_where_it_stops(monkeypatch):
    """FCF's second sweep exits early on an untrained GRU (it forgets a chunk's start in a
    few dozen steps) in both passes; the fine steps after the exit keep the first sweep's
    states, so their kept gates must be the first sweep's too: gradients from kept gates equal
    recomputed ones, and both match torch.nn.GRU to the tolerance."""
    from mgrit_gru.core import cycle

    exits = []
    f_relax = cycle._Solver.f_relax

    def spy(self, level, u, g, provisional=False, exit_tol=None):
        out = f_relax(self, level, u, g, provisional, exit_tol)
        exits.append(out)
        return out

    monkeypatch.setattr(cycle._Solver, "f_relax", spy)
    ref = make_ref(3, 6)
    x = torch.randn(2048, 2, 3)  # 32 chunks of 64 steps x 2 rows: the gates are kept
    wy, wh = torch.randn(2048, 2, 6), torch.randn(1, 2, 6)
    y_r, h_r, g_r = grads_of(ref, x, None, wy, wh)
    results = []
    for keep in (True, False):
        ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=64, tol=1e-9))
        ours.solver = ours.solver.replace(keep_gates=keep)
        exits.clear()
        y, h, g = grads_of(ours, x, None, wy, wh)
        stats = ours.last_stats
        assert stats.forward[0].iterations == 0 and stats.backward[0].iterations == 0
        assert sum(e is not None for e in exits) == 2  # one exit per pass
        assert max((a - b).abs().max().item() for a, b in zip(g, g_r)) < 1e-6
        assert (y - y_r).abs().max() < 1e-8
        results.append(g)
    assert max((a - b).abs().max().item() for a, b in zip(*results)) < 1e-12


def test_secant_after_one_cycle_is_the_frozen_correction():
    """The secant correction needs two iterates: capped at one cycle (one coarse correction
    built from one iterate) it computes what the frozen correction does, bit for bit; with
    more cycles it differs (and converges at least as fast here)."""
    ref = make_ref(3, 6, zbias=3.0)
    x = torch.randn(800, 2, 3, requires_grad=True)
    results, cycles = {}, {}
    for coarse in ("frozen", "secant"):
        for iters in (1, 60):
            opts = tight(cfactor=16, coarse=coarse, max_iters=iters, tol=1e-11)
            ours = mgrit_gru.GRU.from_torch(ref, solver=opts.replace(on_unconverged="warn"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", mgrit_gru.ConvergenceWarning)
                y, _ = ours(x)
            results[coarse, iters] = y.detach()
            cycles[coarse, iters] = ours.last_stats.forward_iterations
    assert torch.equal(results["frozen", 1], results["secant", 1])
    assert not torch.equal(results["frozen", 60], results["secant", 60])
    assert cycles["secant", 60] <= cycles["frozen", 60]
