"""mgrit_gru.LSTM against torch.nn.LSTM + autograd in float64: outputs, h_n, c_n and every
gradient (input, h0, c0, weights, biases), on shapes of several kinds; its errors."""

from __future__ import annotations

import pytest
import torch

import mgrit_gru


def _run(module, x, h0, c0, wy, wh, wc):
    x = x.detach().clone().requires_grad_()
    h0 = h0.detach().clone().requires_grad_()
    c0 = c0.detach().clone().requires_grad_()
    y, (hn, cn) = module(x, (h0, c0))
    ((y * wy).sum() + (hn * wh).sum() + (cn * wc).sum()).backward()
    grads = [x.grad, h0.grad, c0.grad] + [p.grad for p in module.parameters()]
    return [y.detach(), hn.detach(), cn.detach()] + grads


@pytest.mark.filterwarnings("error::mgrit_gru.ConvergenceWarning")  # MGRIT itself converged
@pytest.mark.parametrize(
    "T,layers,bidirectional,batch_first,bias,solver",
    [
        (97, 1, False, False, True, "mgrit"),  # prime T
        (61, 2, True, True, True, "mgrit"),
        (50, 3, False, False, False, "serial"),
        (1, 1, True, False, True, "mgrit"),
    ],
)
def test_lstm_equals_torch(T, layers, bidirectional, batch_first, bias, solver):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(
        3, 5, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional
    )
    opts = "serial" if solver == "serial" else mgrit_gru.MGRIT(cfactor=4)
    ours = mgrit_gru.LSTM.from_torch(ref, solver=opts)
    assert list(ours.state_dict()) == list(ref.state_dict())
    D, B = 2 if bidirectional else 1, 2
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    h0, c0 = torch.randn(D * layers, B, 5), torch.randn(D * layers, B, 5)
    wy = torch.randn(*x.shape[:2], D * 5)
    wh, wc = torch.randn(D * layers, B, 5), torch.randn(D * layers, B, 5)
    for got, want in zip(_run(ours, x, h0, c0, wy, wh, wc), _run(ref, x, h0, c0, wy, wh, wc)):
        assert (got - want).abs().max() < 1e-8
    back = ours.to_torch()
    assert all(
        torch.equal(a, b) for a, b in zip(back.state_dict().values(), ref.state_dict().values())
    )


def test_lstm_unbatched_and_defaults():
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 4)
    ours = mgrit_gru.LSTM.from_torch(ref)
    x = torch.randn(40, 3)
    y, (h, c) = ours(x)
    y_ref, (h_ref, c_ref) = ref(x)
    assert y.shape == y_ref.shape and h.shape == h_ref.shape
    assert (y - y_ref).abs().max() < 1e-8 and (c - c_ref).abs().max() < 1e-8


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: mgrit_gru.LSTM(3, 4, proj_size=2), "proj_size is not supported yet"),
        (lambda: mgrit_gru.LSTM(3, 4, solver="auto"), "choose 'serial' or mgrit_gru.MGRIT"),
        (lambda: mgrit_gru.LSTM(3, 0), "hidden_size must be a positive int"),
        (
            lambda: mgrit_gru.LSTM(3, 4, solver=mgrit_gru.MGRIT(budget=mgrit_gru.Budget())),
            "Budget is not supported yet",
        ),
    ],
)
def test_lstm_bad_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_lstm_bad_calls():
    lstm = mgrit_gru.LSTM(3, 4)
    with pytest.raises(ValueError, match="input has 2 features, expected 3"):
        lstm(torch.randn(10, 2, 2))
    with pytest.raises(ValueError, match=r"h0 must have shape \(1, 2, 4\)"):
        lstm(torch.randn(10, 2, 3), (torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)))
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 3), [5, 3])
    with pytest.raises(TypeError, match="PackedSequence is not supported yet"):
        lstm(packed)


@pytest.mark.filterwarnings("error::mgrit_gru.ConvergenceWarning")
def test_lstm_float32_default_solver():
    """float32 with MGRIT()'s defaults (tolerance 1e-5) at a length with many chunks."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 8).float()
    ours = mgrit_gru.LSTM.from_torch(ref)
    x = torch.randn(2000, 2, 3, dtype=torch.float32, requires_grad=True)
    y, (h, c) = ours(x)
    y.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    y_ref, _ = ref(x)
    y_ref.sum().backward()
    assert (y - y_ref).abs().max() < 1e-4
    assert (grad - x.grad).norm() / x.grad.norm() < 1e-4
