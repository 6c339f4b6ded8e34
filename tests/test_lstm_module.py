"""mgrit_gru.LSTM against torch.nn.LSTM + autograd in float64: outputs, h_n, c_n and every
gradient (input, h0, c0, weights, biases), on shapes of several kinds; its errors."""

from __future__ import annotations

import copy
from functools import partial

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
    if bias:  # one pass sums both biases' gradients: each still its own tensor
        assert ours.bias_ih_l0.grad.data_ptr() != ours.bias_hh_l0.grad.data_ptr()
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
        (lambda: mgrit_gru.LSTM(3, 4, proj_size=4), "proj_size has to be smaller than hidden"),
        (lambda: mgrit_gru.LSTM(3, 4, proj_size=-1), "proj_size should be a positive integer"),
        (lambda: mgrit_gru.LSTM(3, 4, proj_size=2.0), "proj_size should be of type int"),
        (lambda: mgrit_gru.LSTM(3, 0), "hidden_size must be greater than zero"),
        (
            lambda: mgrit_gru.LSTM(3, 4, dropout=2.0),
            "dropout should be a number in range \\[0, 1\\]",
        ),
        (lambda: mgrit_gru.LSTM(3, 4, solver="fast"), "solver"),
        (
            lambda: mgrit_gru.LSTM(3, 4, solver=mgrit_gru.MGRIT(coarse="implicit")),
            "steps coarse levels with the implicit GRU",
        ),
        (
            lambda: mgrit_gru.LSTM(3, 4, solver=mgrit_gru.Auto(mgrit_gru.MGRIT(coarse="implicit"))),
            "LSTM has no analogue",
        ),
        (lambda: mgrit_gru.LSTM.from_torch(torch.nn.GRU(3, 4)), "expected a torch.nn.LSTM"),
    ],
)
def test_lstm_bad_construction(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_lstm_bad_calls():
    lstm = mgrit_gru.LSTM(3, 4)
    x = torch.randn(10, 2, 3)
    with pytest.raises(
        ValueError, match=r"input.size\(-1\) must be equal to input_size. Expected 3"
    ):
        lstm(torch.randn(10, 2, 2))
    with pytest.raises(ValueError, match=r"hidden\[0\] size \(1, 2, 4\), got \[1, 3, 4\] \(h0\)"):
        lstm(x, (torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match=r"hidden\[1\] size \(1, 2, 4\), got \[2, 2, 4\] \(c0\)"):
        lstm(x, (torch.zeros(1, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(TypeError, match=r"hx must be a pair \(h0, c0\) of tensors, got Tensor"):
        lstm(x, torch.zeros(1, 2, 4))
    with pytest.raises(TypeError, match="c0 must be a torch.Tensor"):
        lstm(x, (torch.zeros(1, 2, 4), None))
    with pytest.raises(ValueError, match="c0 contains NaN or Inf"):
        lstm(x, (torch.zeros(1, 2, 4), torch.full((1, 2, 4), float("nan"))))
    with pytest.raises(TypeError, match="c0 dtype torch.float32 does not match"):
        lstm(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, dtype=torch.float32)))
    with pytest.raises(ValueError, match="LSTM: lengths must lie in"):
        lstm(x, lengths=torch.tensor([11, 3]))
    budget = mgrit_gru.MGRIT(budget=mgrit_gru.Budget(gradient="unrolled"))
    with pytest.raises(ValueError, match="is available for the GRU only"):
        mgrit_gru.LSTM(3, 4, solver=budget)  # at construction, as the other refusals
    with pytest.raises(ValueError, match="is available for the GRU only"):
        lstm.solver = budget  # and on assignment


def _packed_run(module, packed, h0, c0, wy, wh, wc):
    """Outputs and every gradient of a packed call: the packed data, h_n, c_n."""
    data = packed.data.detach().clone().requires_grad_()
    packed = torch.nn.utils.rnn.PackedSequence(
        data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
    )
    h0 = h0.detach().clone().requires_grad_()
    c0 = c0.detach().clone().requires_grad_()
    y, (hn, cn) = module(packed, (h0, c0))
    ((y.data * wy).sum() + (hn * wh).sum() + (cn * wc).sum()).backward()
    grads = [data.grad, h0.grad, c0.grad] + [p.grad for p in module.parameters()]
    return [y.data.detach(), hn.detach(), cn.detach()] + grads


@pytest.mark.filterwarnings("error::mgrit_gru.ConvergenceWarning")  # MGRIT itself converged
@pytest.mark.parametrize(
    "solver,layers,bidirectional,batch_first",
    [
        ("mgrit", 2, True, False),
        ("frozen", 1, True, True),
        ("auto", 2, False, False),
        ("serial", 1, True, False),
    ],
)
def test_packed_lstm_equals_torch(solver, layers, bidirectional, batch_first):
    """A PackedSequence of unsorted lengths (prime maximum) through every solver: the packed
    output, h_n, c_n and every gradient equal torch.nn.LSTM's in float64."""
    torch.manual_seed(2)
    ref = torch.nn.LSTM(3, 4, layers, batch_first=batch_first, bidirectional=bidirectional)
    opts = {
        "mgrit": mgrit_gru.MGRIT(cfactor=4, tol=1e-12),
        "frozen": mgrit_gru.MGRIT(cfactor=3, coarse="frozen", tol=1e-12),
        "auto": "auto",
        "serial": "serial",
    }[solver]
    ours = mgrit_gru.LSTM.from_torch(ref, solver=opts)
    lengths = torch.tensor([53, 89, 1, 70, 89])
    T, B, D = 89, 5, 2 if bidirectional else 1
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x, lengths, batch_first=batch_first, enforce_sorted=False
    )
    h0, c0 = torch.randn(D * layers, B, 4), torch.randn(D * layers, B, 4)
    wy = torch.randn(packed.data.shape[0], D * 4)
    wh, wc = torch.randn(D * layers, B, 4), torch.randn(D * layers, B, 4)
    got = _packed_run(ours, packed, h0, c0, wy, wh, wc)
    want = _packed_run(ref, packed, h0, c0, wy, wh, wc)
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-8
    if solver in ("mgrit", "frozen"):
        assert any(s.levels > 1 and s.iterations > 0 for s in ours.last_stats.forward)
    # padded with lengths= gives the same h_n, c_n and zero outputs past each length
    y, (hn, cn) = ours(x, (h0, c0), lengths=lengths)
    assert (hn - got[1]).abs().max() < 1e-8 and (cn - got[2]).abs().max() < 1e-8
    seq = y.transpose(0, 1) if not batch_first else y
    assert seq[0, 53:].abs().max() == 0 and seq[2, 1:].abs().max() == 0


def test_lstm_keeps_gates_and_recomputes_alike():
    """keep_gates (the backward linearises from the forward's gates, wide MGRIT steps) and
    its absence give the same outputs and gradients."""
    torch.manual_seed(3)
    ref = torch.nn.LSTM(3, 4)
    x = torch.randn(600, 3, 3)
    results = []
    for keep in (True, False):
        opts = mgrit_gru.MGRIT(cfactor=8, tol=1e-12, keep_gates=keep)
        ours = mgrit_gru.LSTM.from_torch(ref, solver=opts)
        leaf = x.clone().requires_grad_()
        y, (h, c) = ours(leaf)
        (y.sum() + c.sum()).backward()
        results.append([y, leaf.grad] + [p.grad for p in ours.parameters()])
    for a, b in zip(*results):
        assert (a - b).abs().max() < 1e-10


def test_lstm_budget_and_auto_report_what_they_ran():
    """A fixed budget runs its cycles and reports them; the automatic choice reports its
    choice; both stay close to torch.nn.LSTM (float64, trained-like random weights)."""
    torch.manual_seed(4)
    ref = torch.nn.LSTM(3, 8)
    x = torch.randn(512, 2, 3)
    y_ref, _ = ref(x)
    budget = mgrit_gru.MGRIT(cfactor=8, budget=mgrit_gru.Budget(forward=2, backward=1))
    ours = mgrit_gru.LSTM.from_torch(ref, solver=budget)
    y, _ = ours(x)
    y.sum().backward()
    fwd = ours.last_stats.forward[0]
    assert fwd.iterations == 2 and fwd.levels > 1 and not fwd.fell_back
    assert ours.last_stats.backward[0].iterations == 1
    assert (y - y_ref).abs().max() < 1e-2
    auto = mgrit_gru.LSTM.from_torch(ref)  # solver="auto"
    y, _ = auto(x)
    assert (y - y_ref).abs().max() < 1e-10
    assert auto.last_stats.forward[0].serial_cost > 0


def test_lstm_double_backward_and_func_transforms():
    """create_graph=True (a gradient penalty) and torch.func.grad run the reference
    recurrence: equal to torch.nn.LSTM's."""
    torch.manual_seed(5)
    ref = torch.nn.LSTM(2, 3)
    ours = mgrit_gru.LSTM.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=4, tol=1e-12))
    x = torch.randn(30, 2, 2)
    grads = []
    for module in (ours, ref):
        leaf = x.clone().requires_grad_()
        y, _ = module(leaf)
        (g,) = torch.autograd.grad(y.pow(2).sum(), leaf, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), leaf)
        grads.append((g.detach(), gg))
    assert (grads[0][0] - grads[1][0]).abs().max() < 1e-10
    assert (grads[0][1] - grads[1][1]).abs().max() < 1e-10
    params = dict(ours.named_parameters())
    loss = lambda p: torch.func.functional_call(ours, p, (x,))[0].sum()  # noqa: E731
    got = torch.func.grad(loss)(params)
    y_ref, _ = ref(x)
    want = torch.autograd.grad(y_ref.sum(), list(ref.parameters()))
    for a, b in zip(got.values(), want):
        assert (a - b).abs().max() < 1e-10


def test_lstm_flatten_all_weights_repr():
    lstm = mgrit_gru.LSTM(3, 4, 2, bidirectional=True)
    lstm.flatten_parameters()
    assert [len(w) for w in lstm.all_weights] == [4, 4, 4, 4]
    assert lstm.all_weights[1][0] is lstm.weight_ih_l0_reverse
    assert "LSTM(3, 4, num_layers=2, bidirectional=True, solver=" in repr(lstm)
    ref = torch.nn.LSTM(3, 4, 2, bidirectional=True)
    lstm.load_state_dict(ref.state_dict())  # torch's keys load as they are
    assert torch.equal(lstm.weight_hh_l1_reverse, ref.weight_hh_l1_reverse)


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


def test_serial_forward_runs_torchs_kernel_and_survives_a_refusal(monkeypatch):
    """The serial forward runs torch's LSTM kernel (its c rebuilt from the h's, equal to
    the step-by-step c) and the serial adjoint its backward; where cuDNN refuses a shape the
    library's own loops solve them."""
    torch.manual_seed(6)
    ref = torch.nn.LSTM(3, 5)
    ours = mgrit_gru.LSTM.from_torch(ref, solver="serial")
    ours.kernels = "pytorch"  # torch's kernel runs where the compiled sweeps do not
    x, h0, c0 = torch.randn(1500, 2, 3), torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    wy, wh, wc = torch.randn(1500, 2, 5), torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    calls = []
    real = torch._VF.lstm
    monkeypatch.setattr(torch._VF, "lstm", lambda *a: calls.append(1) or real(*a))
    want = _run(ref, x, h0, c0, wy, wh, wc)
    calls.clear()
    for got, w in zip(_run(ours, x, h0, c0, wy, wh, wc), want):  # c_n, every gradient
        assert (got - w).abs().max() < 1e-10
    assert len(calls) == 2  # torch's kernel ran the forward, and again for its backward

    def refuse(*args, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")

    monkeypatch.setattr(torch._VF, "lstm", refuse)
    ours.zero_grad()
    for got, w in zip(_run(ours, x, h0, c0, wy, wh, wc), want):
        assert (got - w).abs().max() < 1e-10


def test_messages_name_the_lstm():
    """The LSTM's errors and warnings name the LSTM, not the GRU."""
    with pytest.raises(ValueError, match=r"^LSTM: unknown solver='fast'"):
        mgrit_gru.LSTM(3, 4, solver="fast")
    with pytest.raises(ValueError, match=r"^LSTM: unknown solver=None; pass 'auto'"):
        mgrit_gru.LSTM(3, 4, solver=None)
    with pytest.raises(ValueError, match=r"^GRU: unknown solver=None"):
        mgrit_gru.GRU(3, 4, solver=None)
    opts = mgrit_gru.MGRIT(cfactor=4, max_iters=1, tol=1e-15, on_unconverged="warn")
    lstm = mgrit_gru.LSTM(3, 4, solver=opts)
    with pytest.warns(mgrit_gru.ConvergenceWarning, match=r"^LSTM: MGRIT .*LSTM\.last_stats"):
        lstm(torch.randn(64, 2, 3))
    lstm.solver = opts.replace(on_unconverged="raise")
    with pytest.raises(mgrit_gru.DivergenceError, match=r"^LSTM: MGRIT forward solve did not"):
        lstm(torch.randn(64, 2, 3))


def test_stopping_test_judges_h_by_its_own_size():
    """An LSTM whose cell state grows large (weights x6, forget-gate bias +5: max |c| about
    190 against |h| < 1): float32 MGRIT to its default tolerance gives h within 4x of the
    error torch.nn.LSTM's own float32 run has against the float64 answer. (Judged by the size
    of the stacked [h, c], as before, the early exit's threshold and the residual of h scaled
    with |c|: 6.4-7x torch's error here, 50x on another network.)"""
    torch.manual_seed(0)
    H = 16
    ref = torch.nn.LSTM(4, H)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(6.0)
        ref.bias_hh_l0[H : 2 * H] += 5.0
    x = torch.randn(2000, 4, 4)
    with torch.no_grad():
        assert ref(x)[1][1].abs().max() > 100  # the case: c far larger than h
    _assert_float32_mgrit_within_4x_of_torch(ref, x)


def _assert_float32_mgrit_within_4x_of_torch(ref, x) -> None:
    """float32 ``MGRIT()`` on ``ref``'s weights, on both kernels, gives outputs within 4x of
    the error that ``ref``'s own float32 run has against its float64 answer, and MGRIT gave
    the result."""
    with torch.no_grad():
        exact, _ = ref(x)
        ref32 = copy.deepcopy(ref).float()
        torch_err = (ref32(x.float())[0].double() - exact).abs().max().item()
        for kernels in ("pytorch", "compiled"):
            ours = mgrit_gru.LSTM.from_torch(ref32, solver=mgrit_gru.MGRIT(), kernels=kernels)
            y, _ = ours(x.float())
            err = (y.double() - exact).abs().max().item()
            assert ours.last_stats.forward[0].levels > 1  # MGRIT gave the result
            assert err <= 4 * torch_err, (kernels, err, torch_err)


PROJ_CASES = [
    # (T, layers, bidirectional, batch_first, bias, lengths, solver)
    (97, 1, False, False, True, False, "mgrit"),
    (61, 2, True, True, True, True, "mgrit"),
    (64, 1, True, False, True, True, "frozen"),
    (40, 3, False, False, False, False, "serial"),
    (50, 2, True, False, True, True, "serial"),
    (1, 1, True, False, True, False, "mgrit"),
]


@pytest.mark.filterwarnings("error::mgrit_gru.ConvergenceWarning")
@pytest.mark.parametrize("kernels", ["compiled", "pytorch"])
@pytest.mark.parametrize("T,layers,bidirectional,batch_first,bias,lengths,solver", PROJ_CASES)
def test_projected_lstm_equals_torch(
    T, layers, bidirectional, batch_first, bias, lengths, solver, kernels
):
    """proj_size > 0: outputs, (h_n, c_n) and every gradient (x, h0, c0, each weight and
    W_hr) equal torch.nn.LSTM's to 1e-12 in float64, with MGRIT cycling (tol 1e-13; the
    secant and the frozen-gate coarse corrections) or serially, padded sequences both ways;
    the parameters are torch's (names, shapes, order)."""
    torch.manual_seed(0)
    H, P = 7, 3
    ref = torch.nn.LSTM(
        3, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
        proj_size=P,
    )  # fmt: skip
    coarse = "frozen" if solver == "frozen" else "secant"
    opts = mgrit_gru.MGRIT(cfactor=2, tol=1e-13, coarse=coarse, max_iters=100)
    opts = "serial" if solver == "serial" else opts
    ours = mgrit_gru.LSTM.from_torch(ref, solver=opts, kernels=kernels)
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in ref.state_dict().items()
    ]
    assert ours._flat_weights_names == ref._flat_weights_names
    assert repr(ours).startswith(repr(ref)[:-1])
    D, B = 2 if bidirectional else 1, 4
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    h0, c0 = torch.randn(D * layers, B, P), torch.randn(D * layers, B, H)
    wy = torch.randn(*x.shape[:2], D * P)
    wh, wc = torch.randn(D * layers, B, P), torch.randn(D * layers, B, H)
    if lengths:
        lens = torch.tensor([T, T // 2, 1, T - 3])
        pack = partial(
            torch.nn.utils.rnn.pack_padded_sequence, lengths=lens, batch_first=batch_first,
            enforce_sorted=False,
        )  # fmt: skip
        wy = torch.randn(int(lens.sum()), D * P)
        got = _packed_run(ours, pack(x), h0, c0, wy, wh, wc)
        want = _packed_run(ref, pack(x), h0, c0, wy, wh, wc)
    else:
        got, want = _run(ours, x, h0, c0, wy, wh, wc), _run(ref, x, h0, c0, wy, wh, wc)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-12, k
    if solver != "serial" and T > 1:
        assert all(s.levels > 1 and s.iterations > 0 for s in ours.last_stats.forward)
    back = ours.to_torch()
    assert back.proj_size == P
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), ref.parameters()))


def test_projected_lstm_initial_states_and_unbatched():
    """No hx, zero hx (left out of the input: nothing for it to add) and a zero hx that needs
    a gradient (kept in: torch's gradient of h0 is not zero); unbatched input."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 6, 2, proj_size=2, bidirectional=True)
    ours = mgrit_gru.LSTM.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=2, tol=1e-13))
    x = torch.randn(30, 5, 3)
    zeros = (torch.zeros(4, 5, 2), torch.zeros(4, 5, 6))
    for hx in (None, zeros):
        for a, b in zip(ours(x, hx)[1], ref(x, hx)[1]):
            assert (a - b).abs().max() < 1e-12
    h0 = zeros[0].clone().requires_grad_()
    ours(x, (h0, zeros[1]))[0].sum().backward()
    h0_ref = zeros[0].clone().requires_grad_()
    ref(x, (h0_ref, zeros[1]))[0].sum().backward()
    assert h0_ref.grad.abs().max() > 0.01 and (h0.grad - h0_ref.grad).abs().max() < 1e-12
    y, (h, c) = ours(x[:, 0], (torch.randn(4, 2), torch.randn(4, 6)))
    assert y.shape == (30, 4) and h.shape == (4, 2) and c.shape == (4, 6)


def test_projected_first_steps():
    """Where h0 enters: time 0 forward; each sequence's last step in reverse (flipped), on the
    slice of global time that holds it."""
    from mgrit_gru.lstm.projection import first_steps

    lengths = torch.tensor([10, 5, 1])  # last steps 9, 4, 0
    like = torch.empty(0)
    assert first_steps(10, 0, 10, lengths, False, like)[0].tolist() == [1, 1, 1]
    assert first_steps(10, 0, 10, lengths, False, like)[1:].sum() == 0
    rev = first_steps(10, 0, 10, lengths, True, like)  # flipped: step k is global time 9 - k
    assert rev.argmax(0).tolist() == [0, 5, 9] and rev.sum() == 3
    assert first_steps(5, 5, 10, lengths, False, like).sum() == 0  # a later slice: not here
    later = first_steps(5, 5, 10, lengths, True, like)  # global times 5..9, flipped
    assert later.argmax(0).tolist()[0] == 0 and later.sum() == 1


@pytest.mark.filterwarnings("error::mgrit_gru.ConvergenceWarning")
def test_projected_lstm_float32_mgrit_as_accurate_as_torch():
    """float32 MGRIT to its default tolerance on a projected LSTM with longer memory (weights
    x2, forget-gate bias +2: 4 cycles, |h| up to 1.4): its outputs h = W_hr m within 4x of
    the error that torch.nn.LSTM's own float32 run has against the float64 answer: the
    stopping test on [m, c] bounds the projected outputs as well."""
    torch.manual_seed(0)
    H, P = 32, 8
    ref = torch.nn.LSTM(4, H, proj_size=P)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(2.0)
        ref.bias_hh_l0[H : 2 * H] += 2.0
    _assert_float32_mgrit_within_4x_of_torch(ref, torch.randn(2000, 4, 4))


def test_proj_size_types_and_hx_dims_as_torch():
    """proj_size takes what torch takes (numpy integers; False is 0), refuses True and
    non-integers; an (h0, c0) pair of the wrong dimensions is one error in torch's words."""
    import numpy as np

    assert mgrit_gru.LSTM(3, 8, proj_size=np.int64(2)).proj_size == 2
    assert mgrit_gru.LSTM(3, 8, proj_size=False).proj_size == 0
    for bad in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match="proj_size should be of type int"):
            mgrit_gru.LSTM(3, 8, proj_size=bad)
    for impl in (torch.nn.LSTM, mgrit_gru.LSTM):
        lstm = impl(3, 8, proj_size=2)
        with pytest.raises(
            RuntimeError, match=r"hx and cx should also be 3-D but got \(2-D, 3-D\)"
        ):
            lstm(torch.zeros(5, 4, 3), (torch.zeros(1, 2), torch.zeros(1, 4, 8)))
        with pytest.raises(
            RuntimeError, match=r"unbatched 2-D input, hx and cx should also be 2-D"
        ):
            lstm(torch.zeros(5, 3), (torch.zeros(1, 1, 2), torch.zeros(1, 8)))
