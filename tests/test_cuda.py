"""The same equivalence checks on CUDA tensors; skipped where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch
from conftest import make_ref, max_errors, tight

import mgrit_gru

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_cuda_equals_torch_float64(solver):
    ref = make_ref(3, 6, layers=2, bidirectional=True, zbias=2.0).cuda()
    opts = "serial" if solver == "serial" else tight(cfactor=8)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    assert ours.weight_hh_l0.is_cuda
    x, h0 = torch.randn(500, 3, 3, device="cuda"), torch.randn(4, 3, 6, device="cuda")
    assert max(max_errors(ref, ours, x, h0)) < (1e-10 if solver == "serial" else 1e-8)


def test_cuda_packed_and_float32_default_solver():
    ref = make_ref(3, 16, dtype=torch.float32).cuda()
    ours = mgrit_gru.GRU.from_torch(ref)
    x = torch.randn(4000, 4, 3, device="cuda", dtype=torch.float32)
    lengths = torch.tensor([4000, 3000, 17, 2500])
    with torch.no_grad():
        y, hn = ours(x, lengths=lengths)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        _, hn_ref = ref(packed)
    assert (hn - hn_ref).abs().max() < 1e-4
    assert torch.all(y[17:, 2] == 0)


@pytest.mark.parametrize("coarse", ["implicit", "frozen", "secant"])
@pytest.mark.parametrize("relax", ["FCF", "FCFCF"])
def test_cuda_every_coarse_correction_float64(coarse, relax):
    ref = make_ref(3, 6, zbias=3.0).cuda()
    ours = mgrit_gru.GRU.from_torch(ref, solver=tight(cfactor=16, coarse=coarse, relax=relax))
    x, h0 = torch.randn(1459, 2, 3, device="cuda"), torch.randn(1, 2, 6, device="cuda")
    assert max(max_errors(ref, ours, x, h0)) < 1e-8


@pytest.fixture
def no_cudnn_tf32():
    """cuDNN's RNN uses TF32 by default (torch.backends.cudnn.allow_tf32), in torch.nn.GRU
    and in the serial forward that runs it: 2.5e-4 from float64 on an H200. Off, for float32
    comparisons."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


def test_cuda_auto_budget_double_backward_and_inference_mode(no_cudnn_tf32):
    ref = make_ref(3, 8, dtype=torch.float32).cuda()
    x = torch.randn(3000, 2, 3, device="cuda", dtype=torch.float32, requires_grad=True)
    auto = mgrit_gru.GRU.from_torch(ref)
    with torch.inference_mode():
        auto(x.detach())
    y, h = auto(x)
    (y.sum() + h.sum()).backward()
    with torch.no_grad():
        assert (y - ref(x)[0]).abs().max() < 1e-4
    budget = mgrit_gru.MGRIT(cfactor=4, levels=3, budget=mgrit_gru.Budget(2, 1))
    y_b, _ = mgrit_gru.GRU.from_torch(ref, solver=budget)(x)
    y_b.sum().backward()
    assert torch.isfinite(x.grad).all()
    small = mgrit_gru.GRU.from_torch(make_ref(3, 5).cuda(), solver="serial")
    xs = torch.randn(20, 2, 3, device="cuda", requires_grad=True)
    (gx,) = torch.autograd.grad(small(xs)[0].sum(), xs, create_graph=True)
    (gx**2).sum().backward()
    assert small.weight_hh_l0.grad is not None


def test_cuda_serial_beyond_cudnn_limit():
    """cuDNN refused T = 65536 on an H200 (torch.nn.GRU raises CUDNN_STATUS_NOT_SUPPORTED):
    the serial solve falls back to the library's own loop and agrees with MGRIT."""
    ref = make_ref(2, 4, dtype=torch.float32).cuda()
    x = torch.randn(65536, 1, 2, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        y_serial, h_serial = mgrit_gru.GRU.from_torch(ref, solver="serial")(x)
        y_mgrit, h_mgrit = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT())(x)
    assert torch.isfinite(y_serial).all()
    assert (y_serial - y_mgrit).abs().max() < 1e-4


# -- the Triton sweeps (auto on CUDA: float32, bf16, fp16; "triton" by name also float64) --


def _triton_pair(model, H, dtype):
    torch.manual_seed(5)
    if model == "lstm-proj":  # torch's projected LSTM: the plain one on [o tanh(c), c] inside
        return torch.nn.LSTM(3, H, proj_size=H // 2, dtype=dtype).cuda(), mgrit_gru.LSTM
    ref_cls, cls = (
        (torch.nn.LSTM, mgrit_gru.LSTM) if model == "lstm" else (torch.nn.GRU, mgrit_gru.GRU)
    )
    return ref_cls(3, H, dtype=dtype).cuda(), cls


@pytest.mark.parametrize("H", [16, 64, 160])  # W_hh held in registers (<= 64); in blocks
@pytest.mark.parametrize("model", ["gru", "lstm", "lstm-proj"])
def test_cuda_triton_float64_equals_torch(model, H):
    """kernels="triton" in float64: y and every gradient against torch.nn (cuDNN, float64)
    through MGRIT run to round-off and on the library's serial loop and serial adjoint (with
    lengths, which cuDNN's loop does not take), odd T."""
    ref, cls = _triton_pair(model, H, torch.float64)
    x = torch.randn(1001, 3, 3, device="cuda", dtype=torch.float64)
    lengths = torch.tensor([1001, 517, 3])
    for solver in (tight(cfactor=8), "serial"):
        ours = cls.from_torch(ref, solver=solver, kernels="triton")
        xs = [x.clone().requires_grad_() for _ in range(2)]
        y_ref, _ = torch.nn.utils.rnn.pad_packed_sequence(
            ref(torch.nn.utils.rnn.pack_padded_sequence(xs[0], lengths, enforce_sorted=False))[0]
        )
        y, _ = ours(xs[1], lengths=lengths)
        assert (y - y_ref).abs().max() < 1e-9
        g_ref = torch.autograd.grad(y_ref.square().sum(), [xs[0], *ref.parameters()])
        g = torch.autograd.grad(y.square().sum(), [xs[1], *ours.parameters()])
        for a, b in zip(g, g_ref):
            assert (a - b).abs().max() < 1e-9
        ran = {s.kernels for s in ours.last_stats.forward + ours.last_stats.backward}
        assert ran == {"triton"}


@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_cuda_triton_float32_equals_the_pytorch_path(model, no_cudnn_tf32):
    """ "compiled" in float32 on CUDA (the Triton sweeps; TF32 off) and the PyTorch steps agree
    to float32's rounding, with lengths, on MGRIT and on the serial loop cuDNN does not run
    (lengths); "auto" runs the PyTorch steps on CUDA until a GPU check has passed."""
    ref, cls = _triton_pair(model, 64, torch.float32)
    x = torch.randn(4000, 4, 3, device="cuda")
    lengths = torch.tensor([4000, 1234, 3999, 17])
    for solver in (mgrit_gru.MGRIT(), "serial"):
        ys = []
        for choice in ("compiled", "pytorch"):
            ours = cls.from_torch(ref, solver=solver, kernels=choice)
            xg = x.clone().requires_grad_()
            y, _ = ours(xg, lengths=lengths)
            (g,) = torch.autograd.grad(y.square().sum(), xg)
            ys.append((y, g))
            ran = {s.kernels for s in ours.last_stats.forward}
            assert ran == ({"triton"} if choice == "compiled" else {"pytorch"})
        assert (ys[0][0] - ys[1][0]).abs().max() < 1e-4
        assert (ys[0][1] - ys[1][1]).abs().max() / ys[1][1].abs().max() < 1e-4


def test_cuda_triton_bf16_module_runs_near_float32():
    ref, cls = _triton_pair("gru", 64, torch.float32)
    x = torch.randn(2048, 4, 3, device="cuda")
    want = cls.from_torch(ref, solver=mgrit_gru.MGRIT(), kernels="pytorch")(x)[0]
    # a bf16 module solves in float32 (the layer casts): the float32 Triton sweeps run
    ours = cls.from_torch(ref, solver=mgrit_gru.MGRIT(), kernels="compiled").to(torch.bfloat16)
    got = ours(x.to(torch.bfloat16))[0]
    assert {s.kernels for s in ours.last_stats.forward} == {"triton"}
    assert (got.float() - want).abs().max() < 0.1
