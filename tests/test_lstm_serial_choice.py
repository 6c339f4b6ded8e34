"""The serial LSTM solve beside the compiled CPU sweeps: torch's kernel (oneDNN's fused LSTM,
its graph kept for the backward) where the cost model prices it lower, the compiled sweeps
elsewhere; outputs and gradients equal torch.nn.LSTM's either way (float64), SolveStats
saying what ran; lengths, proj_size and traces keep the sweeps; tables without the new
entries read as before."""

from __future__ import annotations

import pytest
import torch

import mgrit_gru
from mgrit_gru import calibrate, cost, kernels
from mgrit_gru.layer import solve
from mgrit_gru.lstm.cell import LSTMCell

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no compiled kernels here")


def _run(module, x, h0, c0):
    """Outputs, final states and every gradient of a fixed loss."""
    torch.manual_seed(11)
    y_size = module.hidden_size * (2 if module.bidirectional else 1)
    wy = torch.randn(*x.shape[:2], y_size)
    wh, wc = torch.randn_like(h0), torch.randn_like(c0)
    leaf = x.clone().requires_grad_()
    states = [h0.clone().requires_grad_(), c0.clone().requires_grad_()]
    y, (h, c) = module(leaf, tuple(states))
    loss = (y * wy).sum() + (h * wh).sum() + (c * wc).sum()
    grads = torch.autograd.grad(loss, [leaf, *states, *module.parameters()])
    return [y.detach(), h.detach(), c.detach(), *grads]


def _ways(module) -> tuple[set, set]:
    stats = module.last_stats
    return {s.kernels for s in stats.forward}, {s.kernels for s in stats.backward}


def _expected(T, B, H, train=True) -> str:
    """The way the model in use prices lower for this layer."""
    x = torch.empty(T, B, 1)
    torch_us, sweep_us = solve.serial_prices(LSTMCell(), x, H, train)
    return "torch" if torch_us < sweep_us else "compiled"


def _priced(way: str):
    """A table (the built-in one) in which the other way costs 100 times its price: the
    layer then takes ``way`` ("torch" or "compiled") at any shape."""
    row = dict(cost.BUILTIN["cpu"])
    dear = "lstm_sweep" if way == "torch" else "lstm_torch"
    call, steps = row[dear]
    row[dear] = (call, tuple((b, 100 * us) for b, us in steps))
    return cost.use(row)


# (T, B, H, bias): the built-in model takes torch's kernel at the first ones (one long
# sequence of a narrow layer), the sweeps at the last (more sequences, few steps, another H)
SHAPES = [(3000, 1, 2, True), (1000, 1, 2, False), (120, 3, 5, False), (4, 48, 6, True)]


@pytest.mark.parametrize("T, B, H, bias", SHAPES)
def test_serial_lstm_takes_the_way_the_model_prices_lower(T, B, H, bias):
    torch.manual_seed(T + B)
    ref = torch.nn.LSTM(3, H, bias=bias)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")  # kernels: "auto", so compiled
    x, h0, c0 = torch.randn(T, B, 3), torch.randn(1, B, H), torch.randn(1, B, H)
    want = _run(ref, x, h0, c0)
    got = _run(ours, x, h0, c0)
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-12
    way = _expected(T, B, H)
    assert _ways(ours) == ({way}, {way})


def test_the_shapes_cover_both_ways():
    """The built-in model (the suite pins it) takes each way at some of SHAPES."""
    assert {_expected(T, B, H) for T, B, H, _ in SHAPES} == {"torch", "compiled"}


def test_two_layers_bidirectional_batch_first_by_torch():
    torch.manual_seed(2)
    ref = torch.nn.LSTM(3, 32, num_layers=2, bidirectional=True, batch_first=True)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x, h0, c0 = torch.randn(1, 300, 3), torch.randn(4, 1, 32), torch.randn(4, 1, 32)
    with _priced("torch"):
        for a, b in zip(_run(ours, x, h0, c0), _run(ref, x, h0, c0)):
            assert (a - b).abs().max() < 1e-12
        assert _expected(300, 1, 32) == "torch" and _ways(ours) == ({"torch"}, {"torch"})


@pytest.mark.parametrize("way", ["torch", "sweep"])
def test_pinned_table_decides(way):
    """A table that prices the other way far dearer makes the solve take ``way``."""
    torch.manual_seed(5)
    ref = torch.nn.LSTM(3, 5)
    x, h0, c0 = torch.randn(50, 2, 3), torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    with _priced("torch" if way == "torch" else "compiled"):
        ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
        got = _run(ours, x, h0, c0)
    for a, b in zip(got, _run(ref, x, h0, c0)):
        assert (a - b).abs().max() < 1e-12
    ran = "torch" if way == "torch" else "compiled"
    assert _ways(ours) == ({ran}, {ran})


def test_torchs_kernel_runs_the_forward_once_in_training(monkeypatch):
    """The backward runs back through the forward's graph (torch's kernel runs once a
    training step, as in torch.nn.LSTM); a second backward of the same forward (the graph
    is spent) runs the sweeps' adjoint from the rebuilt states: the same gradients."""
    torch.manual_seed(7)
    ref = torch.nn.LSTM(3, 32)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x = torch.randn(400, 1, 3, requires_grad=True)
    with _priced("torch"):
        assert _expected(400, 1, 32) == "torch"
        calls = []
        real = torch._VF.lstm
        monkeypatch.setattr(torch._VF, "lstm", lambda *a: calls.append(1) or real(*a))
        y, _ = ours(x)
        y.square().sum().backward(retain_graph=True)
        assert len(calls) == 1 and _ways(ours) == ({"torch"}, {"torch"})
        first = x.grad.clone()
        x.grad = None
        y.square().sum().backward()
        assert len(calls) == 1 and (x.grad - first).abs().max() < 1e-12
        assert [s.kernels for s in ours.last_stats.backward] == ["torch", "compiled"]
        y_ref, _ = ref(x)
        (g_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
        assert (first - g_ref).abs().max() < 1e-12


def test_inference_priced_on_the_forward_alone():
    torch.manual_seed(8)
    ref = torch.nn.LSTM(3, 5)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x = torch.randn(100, 2, 3)
    with torch.no_grad():
        y, _ = ours(x)
        y_ref, _ = ref(x)
    assert (y - y_ref).abs().max() < 1e-12
    assert _ways(ours)[0] == {_expected(100, 2, 5, train=False)}


def test_lengths_keep_the_sweeps():
    torch.manual_seed(9)
    ref = torch.nn.LSTM(3, 32)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x, lengths = torch.randn(300, 2, 3), torch.tensor([300, 120])
    with _priced("torch"):
        assert _expected(300, 2, 32) == "torch"  # but lengths rule torch's kernel out
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        y_ref, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], total_length=300)
        leaf = x.clone().requires_grad_()
        y, _ = ours(leaf, lengths=lengths)
        assert (y - y_ref).abs().max() < 1e-12
        (y * y_ref.detach()).sum().backward()
        (g_ref,) = torch.autograd.grad((y_ref * y_ref.detach()).sum(), ref.weight_hh_l0)
        assert (ours.weight_hh_l0.grad - g_ref).abs().max() < 1e-12
        assert _ways(ours) == ({"compiled"}, {"compiled"})


@pytest.mark.parametrize("way", ["torch", "compiled"])
def test_proj_size_as_torch(way):
    """The projected LSTM solves a plain LSTM layer inside (W_hh W_hr, H wide): that layer
    takes the way the model prices lower, equal to torch.nn.LSTM(proj_size=...) either way."""
    torch.manual_seed(10)
    ref = torch.nn.LSTM(3, 32, proj_size=2)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x = torch.randn(300, 1, 3, requires_grad=True)
    with _priced(way):
        y, _ = ours(x)
        y_ref, _ = ref(x)
        assert (y - y_ref).abs().max() < 1e-12
        (g,) = torch.autograd.grad(y.sum(), x)
        (g_ref,) = torch.autograd.grad(y_ref.sum(), x)
        assert (g - g_ref).abs().max() < 1e-12
        assert _ways(ours) == ({way}, {way})


def test_a_trace_keeps_the_sweeps():
    from mgrit_gru import trace

    ref = torch.nn.LSTM(3, 32)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    x = torch.randn(300, 1, 3, requires_grad=True)
    with _priced("torch"):
        assert _expected(300, 1, 32) == "torch"
        with trace.record():
            y, _ = ours(x)
            y.sum().backward()
        assert "torch" not in set().union(*_ways(ours))


def test_tables_without_the_serial_entries_read_as_before(tmp_path):
    """An older calibration (no SERIAL_KINDS) is valid and prices by the built-in entries;
    a new one round-trips through the cache; a damaged entry is dropped, not the row."""
    old = {k: list(cost.BUILTIN["cpu"][k]) for k in cost.KINDS}
    assert set(cost.valid_row(old)) == set(cost.KINDS)
    x = torch.empty(500, 2, 1)
    with cost.use(old):
        assert cost.serial_entry("lstm_torch") == cost.BUILTIN["cpu"]["lstm_torch"]
        old_prices = solve.serial_prices(LSTMCell(), x, 64, True)
    assert old_prices == solve.serial_prices(LSTMCell(), x, 64, True)
    new = dict(old, lstm_torch=[10.0, [[1, 1.0], [8, 2.0]]], lstm_sweep=[5.0, [[1, 0.5]]])
    row = cost.valid_row(new)
    assert "lstm_torch" in row and "lstm_sweep" not in row  # one batch: no entry
    path = tmp_path / "calibration.json"
    calibrate.save(new, path)
    entry = cost.cached_entry(path)
    assert cost.valid_row(entry["cpu"])["lstm_torch"] == (10.0, ((1, 1.0), (8, 2.0)))


def test_serial_price_interpolates_between_batches():
    row = dict(cost.BUILTIN["cpu"], lstm_torch=(100.0, ((1, 2.0), (5, 6.0), (9, 14.0))))
    with cost.use(row):
        assert cost.serial_solve_us("lstm_torch", 10, 3, 64) == pytest.approx(100 + 10 * 4.0)
        assert cost.serial_solve_us("lstm_torch", 10, 7, 64) == pytest.approx(100 + 10 * 10.0)
        assert cost.serial_solve_us("lstm_torch", 10, 11, 64) == pytest.approx(100 + 10 * 18.0)


def test_calibration_fit_of_the_serial_entries():
    points = [(T, B, 50 + T * (1 + 2 * B)) for T in (16, 1024) for B in (1, 4)]
    call, steps = calibrate.fit_serial(points)
    assert call == pytest.approx(50) and steps == [[1, pytest.approx(3)], [4, pytest.approx(9)]]
