"""The MGRIT core on linear problems whose answer is known (no GRU involved)."""

from __future__ import annotations

import pytest
import torch

from mgrit_gru.core import Grid, build_grids, flat_points, pad_steps, solve
from mgrit_gru.core.grid import chunk_view, to_chunks
from mgrit_gru.core.stopping import StopTest


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
        grids,
        ops,
        torch.ones(1),
        to_chunks(f, grids[0]),
        relax="FCF",
        stop=StopTest(1e-14),
        max_iters=30,
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
    trajectory's true residual at every step, the exit's included, then stays within tol
    (relative to the solution's size), the solution within tol / (1 - a) of the exact one,
    and the solve took fewer fine steps than without the exit."""
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
            grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax=relax, stop=StopTest(tol),
            max_iters=8, early_exit=early_exit,
        )  # fmt: skip
        assert r.converged and not r.diverged
        u = flat_points(r.u, r.uend)
        size = u.abs().max().item()  # the tolerance is relative to the solution's size
        assert _true_residual(a, f, u) <= tol * size
        assert (u - exact).abs().max().item() <= 2 * tol * size
        steps.append(ops[0].steps)
        results.append(r)
    assert steps[1] <= steps[0] - 10
    if relax == "FCF":  # converged after one relaxation: a full sweep leaves no residual,
        assert results[0].residuals == [0.0]  # the exit one that the history reports
        assert 0.0 < results[1].residuals[0] <= tol


@pytest.mark.parametrize("relax,max_iters,levels", [("F", 3, 2), ("FCF", 2, 3), ("FCF", 0, 2)])
@pytest.mark.parametrize("early_exit", [False, True])
def test_only_the_c_points_of_the_work_buffer_are_read_before_written(
    relax, max_iters, levels, early_exit
):
    """``solve`` starts only the C-points at u0: its first F-relaxation writes every F-point
    before anything reads one. A work buffer full of NaN gives what a fresh one gives, bit
    for bit (an F-point read before written would carry the NaN into the result)."""
    T, m = 320, 8
    a = 0.9 * torch.rand(T) + 0.05
    f = torch.randn(T, 1)
    grids = build_grids(T, m, levels)
    runs = []
    for fill in (0.0, float("nan")):
        work = torch.full((grids[0].m, grids[0].n, 1), fill)
        r = solve(
            grids, scalar_ops(grids, a, lambda p: p), torch.ones(1), to_chunks(f, grids[0]),
            relax=relax, stop=StopTest(1e-6), max_iters=max_iters, early_exit=early_exit,
            work=work,
        )  # fmt: skip
        assert r.u is work
        runs.append(r)
    assert torch.equal(runs[0].u, runs[1].u) and torch.equal(runs[0].uend, runs[1].uend)
    assert runs[0].residuals == runs[1].residuals


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
            grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax="FCF", stop=StopTest(1e-12),
            max_iters=4, early_exit=early_exit,
        )  # fmt: skip
        runs.append(r)
    assert torch.equal(runs[0].u, runs[1].u) and torch.equal(runs[0].uend, runs[1].uend)
    assert runs[0].residuals == runs[1].residuals


def test_a_fixed_budget_makes_no_exit_checks(monkeypatch):
    """With tol 0 (a fixed budget) a sweep could exit only where it repeats the previous one
    bit for bit, keeping what it would compute anyway: the solve makes no checks at all, and
    gives what it gives without the early exit, bit for bit, on a problem whose chunks merge
    (a contractive one, where checks with a tolerance would exit)."""
    from mgrit_gru.core import cycle

    T, m = 640, 32
    a = torch.full((T,), 0.9)
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 2)
    checks = []
    advance = cycle.advance

    def counting(op, u, g, j0, j1, stored=None):
        checks.append(stored is not None)
        return advance(op, u, g, j0, j1, stored)

    monkeypatch.setattr(cycle, "advance", counting)
    runs = []
    for early_exit in (False, True):
        ops = scalar_ops(grids, a, lambda p: p.sqrt())
        runs.append(
            solve(
                grids,
                ops,
                torch.ones(1),
                to_chunks(f, grids[0]),
                relax="FCF",
                stop=StopTest(0.0),
                max_iters=2,
                early_exit=early_exit,
            )  # fmt: skip
        )
    assert checks and not any(checks)
    assert torch.equal(runs[0].u, runs[1].u) and torch.equal(runs[0].uend, runs[1].uend)
    assert runs[0].residuals == runs[1].residuals and runs[1].iterations == 2


class ScalarWithFactors(Scalar):
    """A linear diagonal level that knows its chunk factors (the product of its steps)."""

    def chunk_factors(self):
        return self.a.prod(0).unsqueeze(-1)


@pytest.mark.parametrize("levels", [2, 3])
def test_frozen_coarse_correction_is_exact_for_a_diagonal_problem(levels):
    """For u_{k+1} = a_k u_k + f_k the chunk maps are exactly the frozen products, so the
    frozen coarse correction (composed over levels) solves it in one cycle."""
    from mgrit_gru.core.coarse import DiagonalStep

    T, m = 200, 4
    a = torch.rand(T) + 0.5  # not contractive: relaxation alone would not do it
    f = torch.randn(T, 1)
    grids = build_grids(T, m, levels)
    ops = [ScalarWithFactors(grids[0], pad_steps(a, grids[0], 1.0))]
    ops += [DiagonalStep(g) for g in grids[1:]]
    r = solve(grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax="F", max_iters=1)
    exact = serial(a, torch.ones(1), f)
    assert (flat_points(r.u, r.uend) - exact).abs().max() < 1e-10


def test_secant_with_one_iterate_is_the_frozen_map_and_learns_with_more():
    """SecantStep: refreshed once it is the frozen diagonal map; with a pair of iterates it
    maps their difference of starts onto their difference of ends."""
    from mgrit_gru.core.coarse import DiagonalStep, SecantStep

    grid = Grid(N=6, m=3, n=2)
    factors = torch.rand(6, 2, 4)
    U1, P1 = torch.randn(7, 2, 4), torch.randn(6, 2, 4)
    frozen, secant = DiagonalStep(grid), SecantStep(grid, depth=2)
    frozen.refresh(factors, U1, P1)
    secant.refresh(factors, U1, P1)
    v = torch.randn(3, 2, 2, 4)
    assert torch.equal(frozen(v, None), secant(v, None))
    U2, P2 = U1 + torch.randn(7, 2, 4), P1 + torch.randn(6, 2, 4)
    secant.refresh(factors, U2, P2)
    dU = chunk_view(U2[:6] - U1[:6], grid)
    dP = chunk_view(P2 - P1, grid)
    assert torch.allclose(secant(dU, None), dP, atol=1e-8)
    assert not torch.allclose(frozen(dU, None), dP, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("secant", [False, True])
@pytest.mark.parametrize("N", [37, 40])
def test_compiled_chunk_map_sweep_is_the_pytorch_steps(dtype, secant, N):
    """A coarse chunk map's compiled sweep (the kernels' map_sweep) against its own PyTorch
    steps, frozen and secant (coupled), with and without a right-hand side, on a padded grid
    (N = 37) and an unpadded one (its factors and coupling strided views): equal to
    rounding."""
    from mgrit_gru import kernels
    from mgrit_gru.core.coarse import DiagonalStep, SecantStep

    module = kernels.load()
    if module is None:
        pytest.skip(f"no compiled kernels here: {kernels.error()}")
    torch.manual_seed(3)
    grid = Grid(N=N, m=8, n=5)  # M = 40 points
    B, H = 3, 7
    make = (lambda k: SecantStep(grid, 2, k)) if secant else (lambda k: DiagonalStep(grid, k))
    ref, ours = make(None), make(module)
    assert ref.sweep is None and ours.sweep is not None
    factors = (torch.rand(N, B, H) + 0.3).to(dtype)
    for _ in range(3 if secant else 1):  # three iterates: a rank-2 coupling
        U, P = torch.randn(N + 1, B, H, dtype=dtype), torch.randn(N, B, H, dtype=dtype)
        for op in (ref, ours):
            op.refresh(factors, U, P)
    assert (getattr(ref, "coupling", None) is not None) == secant
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for with_g in (False, True):
        u0 = torch.randn(grid.m, grid.n, B, H, dtype=dtype)
        g = torch.randn_like(u0) if with_g else None
        a, b = u0.clone(), u0.clone()
        for j in range(grid.m - 1):  # the PyTorch steps
            ref(a[j], j, out=a[j + 1])
            if g is not None:
                a[j + 1].add_(g[j])
        ours.sweep(b, g, 0, 3)
        ours.sweep(b, g, 3, grid.m - 1)
        assert torch.allclose(a, b, atol=tol, rtol=tol)
        assert torch.equal(b[0], u0[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_chunk_product_is_torchs_product(dtype):
    """The chunk factors' compiled product (the kernels' chunk_product, the frozen and secant
    maps' refresh) against torch's prod over the chunk view of a time-ordered buffer (strided,
    as the sweeps leave it), a contiguous one and one step: equal to rounding where the
    product is a normal number, and zero, never a subnormal, where it underflows; a wrong
    shape is refused by name."""
    from mgrit_gru import kernels
    from mgrit_gru.core.coarse import chunk_product

    module = kernels.load()
    if module is None:
        pytest.skip(f"no compiled kernels here: {kernels.error()}")
    torch.manual_seed(5)
    tiny = torch.finfo(dtype).tiny
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    n, m, B, H = 6, 40, 3, 9
    for low in (0.8, 0.2, 1e-3):  # normal products; some underflow; all underflow
        timed = (torch.rand(n * m, B, H, dtype=dtype) * (1 - low) + low).neg_()
        timed[::7] = 1.0  # identity steps, signs both ways
        chunks = timed.view(n, m, B, H).transpose(0, 1)  # (m, n, B, H), strided
        for factors in (chunks, chunks.contiguous(), chunks[:1]):
            ours, ref = chunk_product(factors, module), factors.prod(0)
            assert ours.shape == ref.shape and ours.is_contiguous()
            normal = ref.abs() >= tiny
            assert torch.allclose(ours[normal], ref[normal], rtol=tol, atol=0)
            assert torch.all(ours[~normal] == 0)
            assert not torch.any((ours != 0) & (ours.abs() < tiny))
        assert torch.equal(chunk_product(chunks, None), chunks.prod(0))  # no kernel: torch's
    # an LSTM's [h, c] width and (m, n, S) without a batch axis; one step of subnormals
    lstm = torch.rand(m, n, B, 2 * H, dtype=dtype) + 0.5
    unbatched = torch.rand(m, n, H, dtype=dtype)
    for factors in (lstm, unbatched):
        assert torch.allclose(chunk_product(factors, module), factors.prod(0), rtol=tol, atol=0)
    assert torch.all(chunk_product(torch.full((1, n, B, H), tiny / 4, dtype=dtype), module) == 0)
    # NaN and Inf stay non-finite where torch's product is (a diverged sweep is not hidden)
    bad = torch.rand(m, n, B, H, dtype=dtype) + 0.5
    bad[3, 0, 0, 0], bad[5, 1, 2, 3], bad[7, 2, 1, 1] = float("nan"), float("inf"), -float("inf")
    ours, ref = chunk_product(bad, module), bad.prod(0)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.equal(torch.isinf(ours), torch.isinf(ref)) and torch.equal(ours.sign(), ref.sign())
    # what the kernel cannot take goes to torch's product: no elements, a strided last axis
    empty = torch.rand(0, n, B, H, dtype=dtype)
    assert torch.equal(chunk_product(empty, module), empty.prod(0))
    wide = torch.rand(m, n, B, 2 * H, dtype=dtype)[..., ::2]
    assert torch.equal(chunk_product(wide, module), wide.prod(0))
    with pytest.raises(RuntimeError, match="chunk_product: expected factors"):
        module.chunk_product(chunks, torch.empty(n, B, H + 1, dtype=dtype))


def test_frozen_gate_chunk_map_is_the_composition_of_its_steps():
    """Along a sweep the forward step records 1 - theta (z for the classic cell); with the
    sweep's gates held fixed, a chunk maps a changed start h0 + d to its end + A d, A the
    product of those factors (ForwardStep.chunk_factors)."""
    from mgrit_gru.gru import cell
    from mgrit_gru.layer.solve import ForwardStep

    torch.manual_seed(0)
    m, n, B, H = 9, 2, 3, 5
    grid = Grid(N=m * n, m=m, n=n)
    gx, w_hh, b_hn = torch.randn(m * n, B, 3 * H), torch.randn(3 * H, H) * 0.5, torch.randn(H)
    for name, dt in (("classic", None), ("implicit", torch.rand(m * n, B) * 3)):
        kept = torch.empty(m * n, B, cell.KEPT * H)
        factors = torch.empty(m * n, B, H)
        op = ForwardStep(grid, gx, w_hh, b_hn, cell.GRUCell(name), dt, kept, factors)
        u = torch.empty(m + 1, n, B, H)
        u[0] = torch.randn(n, B, H) * 0.5
        for j in range(m):
            op(u[j], j, out=u[j + 1])
        gates = chunk_view(kept, grid)  # (m, n, B, 4H): r, z, n, gh_n per step
        d = torch.randn(n, B, H) * 1e-3
        h = u[0] + d
        for j in range(m):
            z, nn_ = gates[j][..., H : 2 * H], gates[j][..., 2 * H : 3 * H]
            w = 1 - z if dt is None else (1 - z) * chunk_view(dt, grid)[j].unsqueeze(-1)
            theta = w if name == "classic" else w / (1 + w)
            h = (1 - theta) * h + theta * nn_  # the step with its gates frozen
        assert torch.allclose(h, u[m] + op.chunk_factors() * d, atol=1e-14, rtol=0)


@pytest.mark.parametrize("relax", ["FCF", "F", "FCFCF"])
def test_lagged_early_exit_keeps_every_residual_within_tol(monkeypatch, relax):
    """The exit decision reads the previous comparison (on CUDA no stream stall, on ranks no
    stall of the others: the maximum over the ranks overlaps the sweep), so the exit comes a
    comparison later: the trajectory's true residuals stay within tol and the solve still
    saves steps."""
    from mgrit_gru.core import cycle

    T, m, tol = 640, 32, 1e-9
    a = torch.full((T,), 0.25)
    f = torch.randn(T, 1)
    grids = build_grids(T, m, 2)
    ops = scalar_ops(grids, a, lambda p: p.sqrt())
    ops[0] = Counting(ops[0])
    r = solve(
        grids, ops, torch.ones(1), to_chunks(f, grids[0]), relax=relax, stop=StopTest(tol),
        max_iters=8, early_exit=True,
    )  # fmt: skip
    u = flat_points(r.u, r.uend)
    assert r.converged and _true_residual(a, f, u) <= tol * u.abs().max().item()
    full = (len(r.residuals) * (1 + cycle.cf_sweeps(relax))) * (m - 1) * grids[0].n
    assert ops[0].steps < full / grids[0].n


def test_exit_checks_spread_out_in_long_chunks(monkeypatch):
    """An early-exiting F-relaxation checks every EXIT_EVERY steps, but at most EXIT_CHECKS
    times a sweep: in chunks of 512 every 16 steps (each check is a message between ranks).
    A long-memory GRU, whose exits come late, counted in the trace's lagged maxima, with and
    without the bound; the solves agree to their tolerance either way."""
    import mgrit_gru
    from mgrit_gru import trace
    from mgrit_gru.core import cycle

    torch.manual_seed(0)
    gru = mgrit_gru.GRU(3, 8, solver=mgrit_gru.MGRIT(cfactor=512, tol=1e-6))
    with torch.no_grad():
        gru.bias_hh_l0[8:16] += 3.0  # update gates near 1: a long memory, late exits
    x = torch.randn(4096, 2, 3)
    counts, outs = [], []
    for bound in (cycle.EXIT_CHECKS, 1 << 30):
        monkeypatch.setattr(cycle, "EXIT_CHECKS", bound)
        with trace.record() as t, torch.no_grad():
            outs.append(gru(x)[0])
        sweeps = gru.last_stats.forward[0].iterations + 1  # an exit sweep a cycle, and the last
        checks = sum(e.what == trace.MESSAGE and e.kind == trace.MAX_LAGGED for e in t.events)
        counts.append(checks)
        assert 0 < checks <= sweeps * (511 // (4 if bound > 32 else 16))
    assert counts[0] < counts[1]
    assert (outs[0] - outs[1]).abs().max() < 1e-4
