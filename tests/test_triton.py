"""The Triton sweeps (each cell's own, gru/gru_triton.py and lstm/lstm_triton.py, which the
cells launch when the switch hands them the Triton token; the shared helpers and launch in
mgrit_gru/kernels/gpu.py, which imports no cell) on the CPU through Triton's interpreter
(conftest sets TRITON_INTERPRET=1 before triton is imported), on tiny shapes: each kernel,
through the cell's kernel_* methods as the layer calls it, against the cells' PyTorch steps
and the compiled C++ kernels, whole layers against torch.nn.GRU / torch.nn.LSTM and the
PyTorch path in float64 (MGRIT really running, odd T, lengths, both directions, the library's
serial loop and serial adjoint), both ways of multiplying by W_hh (held in registers; in
column blocks, forced here at H = 20 by blocks of 16), and every kernel variant compiled
ahead of time for an H200 (sm_90) in a subprocess, which needs no GPU.

Float64 dots are full precision in the interpreter (numpy), so the tolerances are float64's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import tight
from test_kernels import check_forward_contract

import mgrit_gru
from mgrit_gru import kernels
from mgrit_gru.gru import cell as gru_cell
from mgrit_gru.kernels import gpu
from mgrit_gru.lstm import cell as lstm_cell

pytestmark = [
    pytest.mark.skipif(gpu.triton is None, reason=f"{gpu._IMPORT_ERROR}"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not gpu.interpreting(),
        reason="a GPU is here: tests/test_cuda.py runs the Triton kernels compiled",
    ),
]


@pytest.fixture(params=["held", "blocked"])
def product(request, monkeypatch):
    """W_hh held in registers (H <= HOLD), or multiplied in column blocks of BK."""
    if request.param == "blocked":
        monkeypatch.setattr(gpu, "HOLD", 16)
        monkeypatch.setattr(gpu, "BK", 16)
    return request.param


def test_interpreter_is_on_for_the_suite():
    """The suite must run the kernels, not skip them: conftest turned the interpreter on
    before triton was imported, and the kernels serve CPU tensors under it only."""
    assert gpu.interpreting() and gpu.error(torch.device("cpu")) is None
    assert isinstance(kernels.compiled_for("triton", torch.zeros(1)), gpu.TritonKernels)


def test_the_kernels_room_imports_no_cell():
    """kernels/gpu.py holds the shared helpers and the launch only: imported first in a fresh
    process it loads no cell's Triton sweeps, and its token holds no kernel; the cells launch
    their own (GRUCell's and LSTMCell's kernel_* methods, checked below)."""
    probe = (
        "import sys, mgrit_gru.kernels.gpu as g; g.kernels(); "
        "print(sorted(m for m in sys.modules "
        "if m.startswith('mgrit_gru.') and m.endswith('_triton')))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr[-2000:]
    assert not [a for a in vars(gpu.TritonKernels) if a.startswith(("gru_", "lstm_"))]


@pytest.mark.parametrize("H", [5, 20])
def test_forward_sweep_contract(H, product):
    check_forward_contract(gpu.kernels(), H)


def _adjoint_reference(cell, x0, D, C, w, g):
    lam, out = x0[0], []
    for s in range(D.shape[0]):
        lam = cell.adjoint_step(lam, D[s], C[s], w) + (0.0 if g is None else g[s])
        out.append(lam)
    return torch.stack(out)


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("forcing", [True, False])
def test_adjoint_sweep_against_the_cells_adjoint_step(model, forcing, product):
    torch.manual_seed(1)
    S, n, B, H = 5, 3, 2, 20
    W, G, NC = (2 * H, 4 * H, 5 * H) if model == "lstm" else (H, 3 * H, 3 * H)
    x0 = torch.randn(1, n, B, W)
    D = torch.rand(n, S, B, W).transpose(0, 1)  # chunk layout: strided
    C = torch.randn(S, n, B, NC) * 0.3
    w = torch.randn(G, H) / H**0.5
    g = torch.randn(S, n, B, W) if forcing else None
    out = torch.empty(S, n, B, W)
    cell = lstm_cell.LSTMCell() if model == "lstm" else gru_cell.GRUCell()
    cell.kernel_adjoint(gpu.kernels(), x0, out, D, C, w, g)
    want = _adjoint_reference(cell, x0, D, C, w, g)
    assert (out - want).abs().max() < 1e-12


@pytest.mark.parametrize("model", ["gru", "implicit", "lstm"])
def test_serial_adjoint_equals_the_compiled_cpu_one(model, product):
    """The serial adjoint with its gate gradients (identity steps where dt = 0) against the
    C++ kernel, which tests/test_kernels.py holds to autograd."""
    K = kernels.load()
    if K is None:
        pytest.skip(f"no compiled CPU kernels: {kernels.error()}")
    torch.manual_seed(2)
    T, B, H = 9, 3, 20
    W = 2 * H if model == "lstm" else H
    points, kept = torch.randn(T + 1, B, W), torch.rand(T, B, 4 * H)
    d_out, d_last = torch.randn(T, B, W), torch.randn(B, W)
    dt = (torch.rand(T, B) > 0.2).double()
    w = torch.randn((4 if model == "lstm" else 3) * H, H) / H**0.5
    if model == "lstm":
        cell = lstm_cell.LSTMCell()
    else:
        cell = gru_cell.GRUCell("implicit" if model == "implicit" else "classic")
    # (d_gx, d_gh, lam0) of each; cloned: the gate gradients come from the work-buffer pool
    runs = [cell.kernel_vjp(k, points, kept, dt, w, d_out, d_last) for k in (gpu.kernels(), K)]
    got, want = [[t.clone() for t in run[:3]] for run in runs]
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-12
    assert runs[0][3] is None  # the Triton sweep leaves the biases' sums to the layer
    if runs[1][3] is not None:  # the C++ sweep's sums of its rows: the biases' gradients
        for grads, total in zip(want[:2], runs[1][3]):
            assert (grads.sum((0, 1)) - total).abs().max() < 1e-12


def _pair(model, H, bidirectional=False, layers=1):
    torch.manual_seed(3)
    ref_cls, cls = (
        (torch.nn.LSTM, mgrit_gru.LSTM) if model == "lstm" else (torch.nn.GRU, mgrit_gru.GRU)
    )
    ref = ref_cls(3, H, layers, bidirectional=bidirectional, dtype=torch.float64)
    return ref, cls


def _errors(ref, ours, x) -> tuple:
    """(y error, worst gradient error over x and every parameter) of a random linear loss."""
    wy = None
    res = []
    for m in (ref, ours):
        xg = x.clone().requires_grad_()
        y = m(xg)[0]
        wy = torch.randn_like(y) if wy is None else wy
        res.append((y.detach(), torch.autograd.grad((y * wy).sum(), [xg, *m.parameters()])))
    (y_r, g_r), (y_o, g_o) = res
    return (y_r - y_o).abs().max().item(), max((a - b).abs().max().item() for a, b in zip(g_r, g_o))


def _ran(module) -> set:
    return {s.kernels for s in module.last_stats.forward + module.last_stats.backward}


@pytest.mark.parametrize("model, T", [("gru", 64), ("lstm", 61)])
def test_mgrit_layers_equal_torch_both_directions(model, T):
    """MGRIT with m = 4 on 16 rows per level-0 sweep (T = 64, B = 1: 16 chunks), and an odd T
    (padded chunks), both directions: y, h_n and every gradient against torch.nn in float64
    (one T per cell: the interpreter takes seconds a sweep)."""
    ref, cls = _pair(model, 16, bidirectional=True)
    ours = cls.from_torch(ref, solver=tight(cfactor=4, levels=2), kernels="triton")
    x = torch.randn(T, 1, 3)
    errs = _errors(ref, ours, x)
    assert max(errs) < 1e-10, errs
    assert _ran(ours) == {"triton"}
    assert ours.last_stats.forward_iterations > 0


@pytest.mark.parametrize(
    "model, product", [("gru", "held"), ("lstm", "blocked")], indirect=["product"]
)
def test_lengths_and_the_library_serial_loop(model, monkeypatch, product):
    """Lengths (identity steps past each end) on the library's own serial loop and serial
    adjoint (what runs where cuDNN refuses a shape: forced here), and through MGRIT; the
    held product for the GRU, the blocked one (at H = 20) for the LSTM."""
    monkeypatch.setattr(gpu.TritonKernels, "serial_by_torch", False)
    ref, cls = _pair(model, 20)
    x = torch.randn(23, 3, 3)
    lengths = torch.tensor([23, 9, 16])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    want, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0])
    for solver in ("serial", tight(cfactor=4)):
        ours = cls.from_torch(ref, solver=solver, kernels="triton")
        xg = x.clone().requires_grad_()
        y, _ = ours(xg, lengths=lengths)
        assert (y - want).abs().max() < 1e-11
        xr = x.clone().requires_grad_()
        y_ref, _ = torch.nn.utils.rnn.pad_packed_sequence(
            ref(torch.nn.utils.rnn.pack_padded_sequence(xr, lengths, enforce_sorted=False))[0]
        )
        (g,) = torch.autograd.grad(y.sum(), xg)
        (g_ref,) = torch.autograd.grad(y_ref.sum(), xr)
        assert (g - g_ref).abs().max() < 1e-11
        assert _ran(ours) == {"triton"}


def test_triton_equals_the_pytorch_path_in_float32():
    """float32 (the GPU's auto dtype): the Triton sweeps and the PyTorch steps agree to
    float32's rounding, whatever solver."""
    torch.manual_seed(4)
    ref = torch.nn.GRU(3, 16, dtype=torch.float32)
    x = torch.randn(40, 2, 3, dtype=torch.float32)
    ys = []
    for choice in ("triton", "pytorch"):
        ours = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=4), kernels=choice)
        ys.append(ours(x)[0])
    assert (ys[0] - ys[1]).abs().max() < 1e-5


def test_the_switch_names_what_is_missing(monkeypatch):
    """kernels="triton" is checked like "compiled": on the CPU without the interpreter it says
    what would run them; "auto" on the CPU keeps the C++ kernels (or PyTorch)."""
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        kernels.compiled_for("triton", torch.zeros(1))
    assert not isinstance(kernels.compiled_for("auto", torch.zeros(1)), gpu.TritonKernels)
    assert "triton" in kernels.CHOICES
    assert mgrit_gru.GRU(2, 3, kernels=" Triton ").kernels == "triton"


def test_every_kernel_compiles_for_the_h200():
    """Every launch a solve makes, compiled ahead of time for sm_90 by Triton's own compiler
    (no GPU needed): what the interpreter cannot see (types, layouts, register tiles) is
    checked before a GPU ever runs the code."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run(
        [sys.executable, "-m", "mgrit_gru.kernels", "--triton", "--quick"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.count(" ok: 14 kernels") == 4, run.stdout
