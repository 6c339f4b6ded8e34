"""The compiled CPU sweeps (mgrit_gru/kernels, gru/gru_cpu.cpp, lstm/lstm_cpu.cpp) against
the cells' PyTorch steps and torch.nn.GRU / torch.nn.LSTM: outputs, final states and every
gradient, float64 to 1e-12 over lengths, identity steps (padding of odd lengths), layers,
both directions, the implicit cell and every coarse correction; float32 within torch's own
float32 error. The switch (per module, per process), the statistics and the fallback where no
kernel is built."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import max_errors, tight

import mgrit_gru
from mgrit_gru import kernels
from mgrit_gru.gru import cell as gru_cell
from mgrit_gru.layer.solve import serial_way
from mgrit_gru.lstm import cell as lstm_cell

pytestmark = pytest.mark.skipif(
    kernels.load() is None, reason=f"no compiled kernels here: {kernels.error()}"
)


def _grads(module, x, h0, wy, wh, lengths=None):
    """Outputs, final state(s) and the gradients of a random linear loss (x, h0, parameters)."""
    leaf = x.detach().clone().requires_grad_()
    states = [s.detach().clone().requires_grad_() for s in h0]
    hx = states[0] if len(states) == 1 else tuple(states)
    if lengths is None:
        y, hn = module(leaf, hx)
    else:
        y, hn = module(leaf, hx, lengths=lengths)
    hn = hn if isinstance(hn, tuple) else (hn,)
    loss = (y * wy).sum() + sum((h * w).sum() for h, w in zip(hn, wh))
    grads = torch.autograd.grad(loss, [leaf, *states, *module.parameters()])
    return [y.detach(), *(h.detach() for h in hn), *grads]


def _solvers():
    return {
        "serial": "serial",
        "secant": tight(cfactor=4),
        "frozen-FCFCF": tight(cfactor=8, relax="FCFCF", coarse="frozen"),
        "implicit-F-3lev": tight(cfactor=4, relax="F", coarse="implicit", levels=3),
    }


@pytest.mark.parametrize("solver", list(_solvers()))
@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_compiled_equals_pytorch_and_torch_float64(model, solver):
    """Two layers, both directions, an odd length (the last chunk padded with identity
    steps): the compiled sweeps, the PyTorch steps and torch's module agree to 1e-12."""
    if model == "lstm" and solver.startswith("implicit"):
        pytest.skip("the LSTM has no implicit coarse step")
    torch.manual_seed(3)
    T, B, I, H = 53, 3, 4, 6
    ref = (torch.nn.GRU if model == "gru" else torch.nn.LSTM)(I, H, 2, bidirectional=True)
    cls = mgrit_gru.GRU if model == "gru" else mgrit_gru.LSTM
    x = torch.randn(T, B, I)
    h0 = [torch.randn(4, B, H)] * (1 if model == "gru" else 2)
    h0 = [h.clone() for h in h0]
    wy, wh = torch.randn(T, B, 2 * H), [torch.randn(4, B, H) for _ in h0]
    want = _grads(ref, x, h0, wy, wh)
    runs = {}
    for choice in ("pytorch", "compiled"):
        ours = cls.from_torch(ref, solver=_solvers()[solver])
        ours.kernels = choice
        runs[choice] = _grads(ours, x, h0, wy, wh)
        ran = {s.kernels for s in ours.last_stats.forward + ours.last_stats.backward}
        assert ran == ({"compiled"} if choice == "compiled" else ran - {"compiled"})
    for got in runs.values():
        for a, b in zip(got, want):
            assert (a - b).abs().max() < 1e-12
    for a, b in zip(runs["compiled"], runs["pytorch"]):
        assert (a - b).abs().max() < 1e-12


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_lengths_are_identity_steps_in_the_kernels(model, solver):
    """Sequences of their own lengths (identity steps past each end, in both directions)."""
    torch.manual_seed(4)
    T, B, I, H = 40, 4, 3, 5
    ref = (torch.nn.GRU if model == "gru" else torch.nn.LSTM)(I, H, bidirectional=True)
    cls = mgrit_gru.GRU if model == "gru" else mgrit_gru.LSTM
    opts = "serial" if solver == "serial" else tight(cfactor=4)
    lengths = torch.tensor([40, 17, 1, 33])
    x = torch.randn(T, B, I)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        y_ref, _ = ref(packed)
    y_ref, _ = torch.nn.utils.rnn.pad_packed_sequence(y_ref, total_length=T)
    outs = {}
    for choice in ("pytorch", "compiled"):
        ours = cls.from_torch(ref, solver=opts)
        ours.kernels = choice
        leaf = x.clone().requires_grad_()
        y, _ = ours(leaf, lengths=lengths)
        y.square().sum().backward()
        outs[choice] = (y.detach(), leaf.grad)
        assert (y.detach() - y_ref).abs().max() < 1e-12
    for a, b in zip(outs["compiled"], outs["pytorch"]):
        assert (a - b).abs().max() < 1e-12


def test_float32_within_torchs_own_error():
    """float32: the compiled GRU and LSTM differ from the float64 answer no more than
    torch.nn's own float32 modules do (times 4: another, equally rounded arithmetic)."""
    torch.manual_seed(5)
    T, B, I, H = 400, 4, 8, 32
    for torch_cls, cls in ((torch.nn.GRU, mgrit_gru.GRU), (torch.nn.LSTM, mgrit_gru.LSTM)):
        ref = torch_cls(I, H)
        x = torch.randn(T, B, I)
        with torch.no_grad():
            exact, _ = ref(x)
            ref32 = copy.deepcopy(ref).float()
            torch_err = (ref32(x.float())[0].double() - exact).abs().max().item()
            for solver in ("serial", mgrit_gru.MGRIT(cfactor=16)):
                ours = cls.from_torch(ref32, solver=solver, kernels="compiled")
                with serial_way("sweep"):  # the sweeps, where the model may take torch's LSTM
                    y, _ = ours(x.float())
                assert {s.kernels for s in ours.last_stats.forward} == {"compiled"}
                err = (y.double() - exact).abs().max().item()
                assert err <= 4 * torch_err + 1e-6, (cls, solver, err, torch_err)


def test_one_step_and_sweep_agree_with_the_cell_steps():
    check_forward_contract(kernels.load())


def check_forward_contract(K, H: int = 5) -> None:
    """The kernels' own contract, below the solve: strided (chunk layout) inputs, forcing,
    kept gates, frozen-gate factors, dt (0: identity) and a padded chunk, step by step against
    the cells' PyTorch steps. ``K`` is what the switch hands the layer (the C++ module; the
    Triton token, tests/test_triton.py), run as the layer runs it: through the cell's
    kernel_forward, which calls its own sweep on it."""
    torch.manual_seed(6)
    S, n, B = 6, 3, 2
    dt = (torch.rand(S, n, B, 1) > 0.3).double()
    g = torch.randn(S, n, B, 2 * H) * 0.1
    x0 = torch.randn(n, B, 2 * H)
    for model in ("gru", "lstm", "implicit"):
        W = 2 * H if model == "lstm" else H
        G = 4 * H if model == "lstm" else 3 * H
        gx = torch.randn(n, S, B, G).transpose(0, 1)  # chunk layout: strided
        w = torch.randn(G, H) / H**0.5
        b = torch.randn(H)
        out = torch.empty(S, n, B, W)
        keep = torch.empty(S, n, B, 4 * H)
        fac = torch.empty(S, n, B, W)
        if model == "lstm":
            cell = lstm_cell.LSTMCell()
        else:
            cell = gru_cell.GRUCell("implicit" if model == "implicit" else "classic")
        pad = (1, 2, 4)  # chunk 1's steps 2, 3 are identity steps
        cell.kernel_forward(K, x0[None, ..., :W], out, gx, w, b, g[..., :W], keep, fac, dt, pad, 0)
        u = x0[..., :W]
        for s in range(S):
            k, f = torch.empty(n, B, 4 * H), torch.empty(n, B, W)
            if model == "lstm":
                new = lstm_cell.step(u, gx[s], w, dt[s], keep=k, factor=f)
            else:
                kind = "implicit" if model == "implicit" else "classic"
                new = gru_cell.step(u, gx[s], w, b, kind, dt[s], keep=k, factor=f)
            if 2 <= s < 4:  # chunk 1 padded at steps 2, 3
                new[1], f[1] = u[1], 1.0
            new = new + g[s, ..., :W]
            for got, want in ((out[s], new), (keep[s], k), (fac[s], f)):
                assert (got - want).abs().max() < 1e-13
            u = new


@pytest.mark.parametrize("threads", [1, 2])
def test_exit_check_in_the_sweep_is_torchs_comparison(threads):
    """An early exit's check fused into a sweep (``stored``, ``change``): the last step's
    previous states set aside exactly, the change exactly ``(new - old).abs().max()`` (NaN
    where a difference is NaN, as torch's max), the outputs bit for bit those of the sweep
    without a check; forward and adjoint, GRU and LSTM, rows over several blocks."""
    K = kernels.load()
    torch.manual_seed(7)
    S, n, B, H = 16, 256, 8, 8  # 2048 rows in 16 blocks: a region opens whatever the load
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for model in ("gru", "lstm"):
            W, G = (2 * H, 4 * H) if model == "lstm" else (H, 3 * H)
            gx = torch.randn(S, n, B, G, dtype=torch.float64)
            D, C = torch.rand(S, n, B, W, dtype=torch.float64), torch.randn(S, n, B, G)
            C = C.double()
            w = torch.randn(G, H, dtype=torch.float64) / H**0.5
            x0 = torch.randn(1, n, B, W, dtype=torch.float64)
            cell = lstm_cell.LSTMCell() if model == "lstm" else gru_cell.GRUCell("classic")
            forward = (x0, gx, w, None, None, None, None, None, (-1, 0, 0), 0)
            runs = {
                "forward": (cell.kernel_forward, forward),
                "adjoint": (cell.kernel_adjoint, (x0, D, C, w, None)),
            }
            for name, (kernel_sweep, args) in runs.items():
                for poison in (False, True):
                    old = torch.randn(S, n, B, W, dtype=torch.float64)
                    if poison:
                        old[-1, 170, 5, 2] = math.nan
                    plain, fused = old.clone(), old.clone()
                    kernel_sweep(K, args[0], plain, *args[1:])
                    stored = torch.empty(n, B, W, dtype=torch.float64)
                    change = torch.empty((), dtype=torch.float64)
                    kernel_sweep(K, args[0], fused, *args[1:], (stored, change))
                    assert torch.equal(fused, plain), (model, name)
                    assert torch.equal(stored.nan_to_num(), old[-1].nan_to_num()), (model, name)
                    want = (plain[-1] - old[-1]).abs().max()
                    if poison:
                        assert torch.isnan(change) and torch.isnan(want)
                    else:
                        assert change.item() == want.item(), (model, name)
    finally:
        torch.set_num_threads(before)


def test_exit_checks_in_the_sweeps_leave_the_solve_as_it_was(monkeypatch):
    """MGRIT with early exits (the default) gives the same outputs and gradients, bit for
    bit, with the checks inside the compiled sweeps as with the copy and comparison around
    them, and the exits come at the same steps: chunks of 64 steps (15 checks a sweep), on
    which sweeps do exit."""
    from mgrit_gru.core import cycle
    from mgrit_gru.layer import solve as layer_solve

    torch.manual_seed(8)
    ref = torch.nn.GRU(3, 8)
    x = torch.randn(1024, 2, 3)
    wy = torch.randn(1024, 2, 8)
    agreed = cycle._RanksLagged.agreed
    exits = []

    def counting(self, tol):
        out = agreed(self, tol)
        exits.append(out)
        return out

    monkeypatch.setattr(cycle._RanksLagged, "agreed", counting)

    def run():
        exits.clear()
        module = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=64, tol=1e-5))
        out = _grads(module, x, [torch.zeros(1, 2, 8)], wy, [torch.zeros(1, 2, 8)])
        stats = module.last_stats
        return out, (stats.forward_iterations, stats.backward_iterations, list(exits))

    fused, fused_path = run()
    use = layer_solve._Compiled._use

    def around(self, kernel):
        use(self, kernel)
        self.checks = False

    monkeypatch.setattr(layer_solve._Compiled, "_use", around)
    plain, plain_path = run()
    assert any(fused_path[2]), "no sweep exited: the test would not see a wrong check"
    assert fused_path == plain_path  # cycles, and every check's verdict in order
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)


def test_nan_flows_and_saturation_is_exact_in_the_kernels():
    """A NaN reaching a step (from the weights, say) is a NaN in its outputs and every later
    one, as in torch (never a finite wrong number); huge pre-activations saturate the gates
    exactly, without overflow, in float32 (whose exp the kernel computes itself)."""
    K = kernels.load()
    S, H = 6, 8
    for dtype in (torch.float32, torch.float64):
        gx = torch.randn(S, 1, 2, 3 * H, dtype=dtype)
        gx[2, 0, 0, 5] = math.nan
        gx[:, 0, 1] = 1e30 * torch.sign(gx[:, 0, 1])
        w = torch.randn(3 * H, H, dtype=dtype)
        out = torch.empty(S, 1, 2, H, dtype=dtype)
        K.gru_forward(torch.zeros(1, 1, 2, H, dtype=dtype), out, gx, w, None, None, None, None,
                      None, False, -1, 0, 0, 0)  # fmt: skip
        assert torch.isnan(out[2:, 0, 0]).any(-1).all() and torch.isfinite(out[:2, 0, 0]).all()
        assert torch.isfinite(out[:, 0, 1]).all() and out[:, 0, 1].abs().max() <= 1.0
        gx4 = torch.randn(S, 1, 2, 4 * H, dtype=dtype)
        gx4[2, 0, 0, 3] = math.nan
        gx4[:, 0, 1] = 1e30 * torch.sign(gx4[:, 0, 1])
        out = torch.empty(S, 1, 2, 2 * H, dtype=dtype)
        w4 = torch.randn(4 * H, H, dtype=dtype)
        u0 = torch.zeros(1, 1, 2, 2 * H, dtype=dtype)
        K.lstm_forward(u0, out, gx4, w4, None, None, None, None, -1, 0, 0, 0)
        assert torch.isnan(out[2:, 0, 0]).any(-1).all() and torch.isfinite(out[:2, 0, 0]).all()
        assert torch.isfinite(out[:, 0, 1]).all()


def test_the_switch_per_module_and_process(monkeypatch):
    gru = mgrit_gru.GRU(2, 3, solver="serial")
    x = torch.randn(20, 2, 2)
    monkeypatch.setenv(kernels.ENV, "pytorch")
    gru(x)
    assert {s.kernels for s in gru.last_stats.forward} == {"torch"}  # torch's own loop
    gru.kernels = "compiled"  # the module's own choice wins
    gru(x)
    assert {s.kernels for s in gru.last_stats.forward} == {"compiled"}
    gru.kernels = None
    monkeypatch.setenv(kernels.ENV, "auto")
    gru(x)
    assert {s.kernels for s in gru.last_stats.forward} == {"compiled"}
    with pytest.raises(ValueError, match=r"kernels='fast': choose one of \('auto'"):
        mgrit_gru.GRU(2, 3, kernels="fast")
    with pytest.raises(ValueError, match=r"kernels='fast': choose one of"):
        mgrit_gru.LSTM(2, 3, kernels="fast")
    monkeypatch.setenv(kernels.ENV, "fastest")
    with pytest.raises(ValueError, match=r"MGRIT_GRU_KERNELS='fastest': choose one of"):
        gru(x)


def test_without_a_build_auto_runs_pytorch_and_compiled_says_why(monkeypatch):
    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(kernels, "_error", "no C++ compiler (c++ or g++) on PATH")
    x = torch.randn(20, 2, 2)
    gru = mgrit_gru.GRU(2, 3, solver="serial")
    gru(x)
    assert {s.kernels for s in gru.last_stats.forward} == {"torch"}  # torch's own loop
    gru.kernels = "compiled"
    with pytest.raises(RuntimeError, match="CPU kernels are unavailable: no C.. compiler"):
        gru(x)
    lstm = mgrit_gru.LSTM(2, 3, solver=mgrit_gru.MGRIT(cfactor=4))
    lstm(x)
    assert {s.kernels for s in lstm.last_stats.forward} == {"pytorch"}


def test_no_compiled_kernel_for_other_dtypes_or_devices():
    """Only float32 and float64 CPU tensors have a compiled kernel: "auto" runs the PyTorch
    steps for the others, "compiled" says why it cannot."""
    half = torch.zeros(2, dtype=torch.bfloat16)
    assert kernels.compiled_for("auto", half) is None
    with pytest.raises(RuntimeError, match="no compiled kernel for cpu tensors of torch.bfloat16"):
        kernels.compiled_for("compiled", half)
    meta = torch.zeros(2, device="meta")
    assert kernels.compiled_for("auto", meta) is None
    assert kernels.compiled_for("pytorch", torch.zeros(2)) is None


def test_build_command_reports_the_kernels():
    out = subprocess.run(
        [sys.executable, "-m", "mgrit_gru.kernels"], capture_output=True, text=True, check=True
    )
    assert "compiled CPU kernels ready in" in out.stdout


def test_gru_against_torch_with_the_shared_helper():
    """The conftest comparison on the compiled path: outputs, h_n, every gradient."""
    ref = torch.nn.GRU(3, 5, 2)
    x, h0 = torch.randn(30, 2, 3), torch.randn(2, 2, 5)
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=4), kernels="compiled")
    assert max(max_errors(ref, ours, x, h0)) < 1e-12


def test_choices_are_read_alike_and_checked_at_construction(monkeypatch):
    """kernels= reads its value as the environment variable does (case and blanks aside),
    and a bad MGRIT_GRU_KERNELS is an error when a module is made, not at its first call."""
    assert mgrit_gru.GRU(2, 3, kernels=" Compiled ").kernels == "compiled"
    monkeypatch.setenv(kernels.ENV, " PyTorch ")
    assert kernels.process_default() == "pytorch"
    monkeypatch.setenv(kernels.ENV, "bogus")
    with pytest.raises(ValueError, match=r"MGRIT_GRU_KERNELS='bogus': choose one of"):
        mgrit_gru.GRU(2, 3)


def test_a_failed_build_says_so_and_the_pytorch_steps_run(tmp_path):
    """A compiler that fails: a warning that the build failed (and why), then the PyTorch
    steps; "compiled" names the failure (in a fresh process with an empty build folder)."""
    env = {**os.environ, "CXX": "/bin/false", "MGRIT_GRU_BUILD": str(tmp_path)}
    code = (
        "import torch, mgrit_gru\n"
        "g = mgrit_gru.GRU(3, 4, solver='serial', kernels='auto')\n"
        "g(torch.randn(5, 1, 3))\n"
        "print(g.last_stats.forward[0].kernels)\n"
        "g.kernels = 'compiled'\n"
        "try:\n    g(torch.randn(5, 1, 3))\nexcept RuntimeError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    out = done.stdout.splitlines()
    assert done.returncode == 0 and out[0] == "torch", done.stdout + done.stderr
    assert "the CPU kernels could not be built (the build failed" in done.stderr
    assert "kernels='compiled': the CPU kernels are unavailable: the build failed" in out[1]
    assert ".;" not in out[1]


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_sweeps_over_threads_equal_one_thread(model, solver):
    """A sweep large enough to share its row blocks among threads (one parallel region per
    sweep, blocks taken from a shared counter) gives bit for bit the one-thread result, on
    torch.nn's numbers in float64: rows advance independently, whichever thread runs them.
    So do the outputs, the states' and the input's gradients and the biases' (our sums); the
    weights' gradients are ATen GEMMs that reduce over all T x B rows, whose BLAS may split
    that reduction by thread count (MKL does on an AVX-512 Xeon, not on an AMD EPYC): equal
    to rounding there."""
    torch.manual_seed(3)
    kind = torch.nn.GRU if model == "gru" else torch.nn.LSTM
    ref = kind(5, 24, dtype=torch.float64)
    x = torch.randn(700, 20, 5, dtype=torch.float64)
    wy = torch.randn(700, 20, 24, dtype=torch.float64)
    options = "serial" if solver == "serial" else tight(cfactor=8)
    cls = mgrit_gru.GRU if model == "gru" else mgrit_gru.LSTM
    h0 = [torch.zeros(1, 20, 24, dtype=torch.float64)] * (1 if model == "gru" else 2)
    wh = [torch.randn(1, 20, 24, dtype=torch.float64)] * len(h0)
    before = torch.get_num_threads()
    got = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got[threads] = _grads(cls.from_torch(ref, solver=options), x, h0, wy, wh)
    finally:
        torch.set_num_threads(before)
    expected = _grads(ref, x, h0, wy, wh)
    weights = ["weight" in name for name, _ in ref.named_parameters()]  # the module's order
    gemm = [False] * (len(got[1]) - len(weights)) + weights
    for threads in (2, 3):
        for a, b, by_blas in zip(got[threads], got[1], gemm):
            if by_blas:
                assert (a - b).abs().max() <= 1e-13 * (1 + b.abs().max()), threads
            else:
                assert torch.equal(a, b), threads
    for a, b in zip(got[1], expected):
        assert (a - b).abs().max() <= 1e-11 * (1 + b.abs().max())


def test_the_sweeps_open_parallel_regions_in_torchs_openmp_runtime():
    """Built without OpenMP, ATen's parallel_for (a header template) runs its body on the
    calling thread: every sweep on one core whatever torch.set_num_threads said (so it was
    until 2026-12-05). The module says how it was built, and its OpenMP is torch's own (one
    runtime and thread pool in the process, sized by torch.set_num_threads)."""
    module = kernels.load()
    assert module.threaded or not kernels._OPENMP
    if sys.platform.startswith("linux"):
        with open("/proc/self/maps") as maps:
            runtimes = {line.split()[-1] for line in maps if "libgomp" in line.split("/")[-1]}
        assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("implicit", [False, True])
def test_whole_sequence_passes_equal_the_cells_pytorch_code(implicit):
    """The compiled passes around MGRIT's adjoint sweeps (the GRU's coefficients from its kept
    gates, written in reversed time, and the gate gradients from the reversed adjoint, with
    their sums over the rows: the biases' gradients) equal
    the cell's PyTorch functions they replace, float64, with step sizes of 0 (lengths) and 1,
    states read from a strided view; bit for bit at 1 and 2 threads."""
    module = kernels.load()
    torch.manual_seed(4)
    T, B, H = 300, 16, 16  # work enough (rows x H) to open a parallel region
    dt64 = dict(dtype=torch.float64)
    wide = torch.randn(T + 1, B, 2 * H, **dt64)
    points = wide[..., :H]  # last axis contiguous, rows strided
    kept = torch.cat(
        [torch.rand(T, B, 2 * H, **dt64), torch.rand(T, B, H, **dt64) * 2 - 1],
        -1,
    )
    kept = torch.cat([kept, torch.randn(T, B, H, **dt64)], -1)  # [r, z, n, gh_n]
    dt = (torch.rand(T, B, **dt64) > 0.2).to(torch.float64)
    cell = "implicit" if implicit else "classic"
    ref = gru_cell.linearise_kept(points[:T], kept, cell, dt.unsqueeze(-1))
    lam_rev = torch.randn(T + 1, B, H, **dt64)
    d_gx_ref, d_gh_ref = gru_cell.gate_grads(lam_rev[:T].flip(0), ref.C, ref.A_n)
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            D, C = torch.empty(T, B, H, **dt64), torch.empty(T, B, 3 * H, **dt64)
            A_n = torch.empty(T, B, H, **dt64)
            module.gru_coefficients(points[:T], kept, dt, implicit, D, C, A_n)
            d_gx, d_gh = torch.empty(T, B, 3 * H, **dt64), torch.empty(T, B, 3 * H, **dt64)
            sums = torch.empty(3 * H, **dt64), torch.empty(3 * H, **dt64)  # the biases'
            module.gru_gate_grads(lam_rev, C, A_n, d_gx, d_gh, *sums)
            runs.append((D, C, A_n, d_gx, d_gh, *sums))
    finally:
        torch.set_num_threads(before)
    expected = (ref.D.flip(0), ref.C.flip(0), ref.A_n, d_gx_ref, d_gh_ref)
    expected += (d_gx_ref.sum((0, 1)), d_gh_ref.sum((0, 1)))
    for got, want, other in zip(runs[0], expected, runs[1]):
        assert (got - want).abs().max() <= 1e-13
        assert torch.equal(got, other)
    with pytest.raises(RuntimeError, match="gru_coefficients"):
        module.gru_coefficients(points[:T], kept, dt, implicit, D[:-1], C, A_n)


def test_lstm_whole_sequence_passes_equal_the_cells_pytorch_code():
    """The LSTM's compiled passes (coefficients [0, f] / [A, C_i, C_f, C_g, C_o] in reversed
    time, the gate gradients d from the reversed adjoint) against its PyTorch functions, float64,
    identity steps (dt 0) included, states read from a strided view; bit for bit at 1 and 2
    threads."""
    module = kernels.load()
    torch.manual_seed(5)
    T, B, H = 300, 16, 16
    dt64 = dict(dtype=torch.float64)
    points = torch.randn(T + 1, B, 3 * H, **dt64)[..., : 2 * H]  # [h, c], rows strided
    kept = torch.cat([torch.rand(T, B, 2 * H, **dt64), torch.rand(T, B, H, **dt64) * 2 - 1], -1)
    kept = torch.cat([kept, torch.rand(T, B, H, **dt64)], -1)  # [i, f, g, o]
    dt = (torch.rand(T, B, **dt64) > 0.2).to(torch.float64)
    ref = lstm_cell.linearise_kept(points[:T], kept, dt.unsqueeze(-1))
    lam_rev = torch.randn(T + 1, B, 2 * H, **dt64)
    d_ref = lstm_cell.gate_grads(lam_rev[:T].flip(0), ref.C)
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            D, C = torch.empty(T, B, 2 * H, **dt64), torch.empty(T, B, 5 * H, **dt64)
            module.lstm_coefficients(points[:T], kept, dt, D, C)
            d = torch.empty(T, B, 4 * H, **dt64)
            module.lstm_gate_grads(lam_rev, C, d)
            runs.append((D, C, d))
    finally:
        torch.set_num_threads(before)
    for got, want, other in zip(runs[0], (ref.D.flip(0), ref.C.flip(0), d_ref), runs[1]):
        assert (got - want).abs().max() <= 1e-13
        assert torch.equal(got, other)


def _dry_run(script: str, *extra: str) -> str:
    """A benchmark's --dry-run (with ``extra`` arguments), which must succeed: its stdout
    (skipped without kernels)."""
    if kernels.load() is None:
        pytest.skip(f"no compiled kernels here: {kernels.error()}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--dry-run", *extra],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    return run.stdout


def test_bias_sums_benchmark_dry_run():
    """benchmarks/bias_sums.py end to end on a tiny shape: a row per thread count, both ways."""
    out = _dry_run("bias_sums.py")
    rows = [line for line in out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 2 and all(line.rstrip(" |").endswith("x") for line in rows), out


def test_coarse_maps_benchmark_dry_run():
    """benchmarks/coarse_maps.py end to end on a tiny shape: a row per solver and thread count
    with both ways' times, and the threads' ratio row; the maps' steps, then (``--products``)
    their chunk factors."""
    for extra, way in (((), "pytorch maps"), (("--products",), "torch prod")):
        out = _dry_run("coarse_maps.py", *extra)
        rows = [line for line in out.splitlines() if line.startswith("| random |")]
        assert len(rows) == 2 * 3, out  # budget and mgrit: threads 1, 2 and 2t / 1t
        for line in rows:
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert all(float(cells[k].split()[0].rstrip("x")) > 0 for k in (4, 5))
        assert f"| {way} ms |" in out, out


def test_exit_checks_benchmark_dry_run():
    """benchmarks/exit_checks.py end to end on a tiny shape: both ways' times per solver and
    thread count, and the threads' ratio row."""
    for extra in ((), ("--spacing",)):  # where the checks are; how far apart
        out = _dry_run("exit_checks.py", *extra)
        rows = [line for line in out.splitlines() if line.startswith("| random |")]
        assert len(rows) == 3, out  # mgrit: threads 1, 2 and 2t / 1t
        for line in rows:
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert all(float(cells[k].split()[0].rstrip("x")) > 0 for k in (4, 5))
    assert "every 4 steps" in out and "<= 32 a sweep" in out


def test_chunk_length_benchmark_dry_run():
    """benchmarks/chunk_length.py end to end on a tiny shape: the two chunk lengths' row with
    positive ratios and both against the serial solve."""
    out = _dry_run("chunk_length.py")
    rows = [line for line in out.splitlines() if line.startswith("| random |")]
    assert len(rows) == 1, out
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[4] == "32 -> 64" and float(cells[5].rstrip("x")) > 0, out
    assert all(float(v.rstrip("x")) > 0 for v in cells[7].split(" -> ")), out


def test_auto_cfactor_prices_the_steps_that_run():
    """cfactor="auto" takes the fixed cost of the steps that will run: the compiled sweeps'
    (a few rows' worth) where they serve the layer, the PyTorch steps' (80 rows' worth in the
    built-in table) under kernels="pytorch"; a time group's split (time_cfactor) and a call
    agree with it."""
    from mgrit_gru import cost
    from mgrit_gru.layer.solve import step_kind
    from mgrit_gru.options import auto_cfactor

    if kernels.load() is None:
        pytest.skip(f"no compiled kernels here: {kernels.error()}")
    with cost.use(None):  # the built-in table
        assert step_kind("compiled") == step_kind("auto") == "sweep"
        assert step_kind("pytorch") == step_kind("auto", "cuda") == "step"
        assert auto_cfactor(16384, 4, 64) == 128
        assert auto_cfactor(16384, 4, 64, kind="sweep") == 512
        assert auto_cfactor(2000, 1, 8, kind="sweep") == 128  # sqrt(28 * 2000 / 1) = 237
        for choice, m in (("compiled", 128), ("pytorch", 32)):
            gru = mgrit_gru.GRU(3, 8, solver=mgrit_gru.MGRIT(tol=1e-6), kernels=choice)
            assert gru.time_cfactor(2000, 1) == m
            gru(torch.randn(2000, 1, 3))
            # 2000 steps as chunks of m: 16 of 128 (two levels), 63 of 32 (three: 63 -> 2)
            assert [s.levels for s in gru.last_stats.forward] == [2 if m == 128 else 3]
        # half precision solves in float32 on the compiled sweeps: their rule; a budget's
        # unrolled gradient and kernels that do not serve here (Triton on the CPU, without a
        # transform to run them) run the PyTorch steps: theirs, and no error for asking
        assert mgrit_gru.GRU(3, 8).to(torch.bfloat16).time_cfactor(2000, 1) == 128
        unrolled = mgrit_gru.MGRIT(budget=mgrit_gru.Budget(2, 1, gradient="unrolled"))
        assert mgrit_gru.GRU(3, 8, solver=unrolled).time_cfactor(2000, 1) == 32
        assert step_kind("triton") == "step"
