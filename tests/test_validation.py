"""Every user-facing error names the problem."""

from __future__ import annotations

import math

import pytest
import torch

import mgrit_gru
from mgrit_gru import MGRIT


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(cfactor=1), r"invalid cfactor=1; expected an integer >= 2"),
        (dict(cfactor=2.5), r"invalid cfactor=2.5"),
        (dict(cfactor="fast"), r"invalid cfactor='fast'; expected an integer >= 2 or 'auto'"),
        (dict(levels=0), r"invalid levels=0; expected an integer >= 1"),
        (dict(levels="many"), r"invalid levels='many'"),
        (dict(relax="C"), r"invalid relax='C'; expected 'F' followed by 'CF' repeated"),
        (dict(relax="FCFC"), r"invalid relax='FCFC'"),
        (dict(coarse="exact"), r"invalid coarse='exact'; choose one of \('implicit', 'frozen'"),
        (dict(coarse=3), r"invalid coarse=3"),
        (dict(tol=-1e-3), r"invalid tol=-0.001; expected a finite number >= 0"),
        (dict(tol=float("nan")), r"invalid tol=nan"),
        (dict(max_iters=-1), r"invalid max_iters=-1"),
        (dict(backward_tol=-1.0), r"invalid backward_tol=-1.0"),
        (dict(tol=float("nan")), r"invalid tol=nan; expected a finite number >= 0 or 'auto'"),
        (dict(tol="tight"), r"invalid tol='tight'"),
        (dict(max_iters="many"), r"invalid max_iters='many'"),
        (dict(backward_max_iters=1.5), r"invalid backward_max_iters=1.5"),
        (dict(on_divergence="ignore"), r"invalid on_divergence='ignore'; choose one of"),
        (dict(on_unconverged="ignore"), r"invalid on_unconverged='ignore'; choose one of"),
        (dict(guard=3), r"invalid guard=3; expected a mgrit_gru.Guard"),
        (dict(budget=2), r"invalid budget=2; expected None or a mgrit_gru.Budget"),
        (dict(keep_gates=1), r"invalid keep_gates=1; expected True or False"),
        (dict(early_exit="yes"), r"invalid early_exit='yes'; expected True or False"),
    ],
)
def test_invalid_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MGRIT(**kwargs)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: mgrit_gru.Implicit(gates="mean"), r"Implicit: invalid gates='mean'; choose one"),
        (lambda: mgrit_gru.Secant(depth=0), r"Secant: invalid depth=0; expected an integer >= 1"),
        (lambda: mgrit_gru.Guard(patience=0), r"Guard: invalid patience=0"),
        (lambda: mgrit_gru.Guard(cost="yes"), r"Guard: invalid cost='yes'; expected True or"),
        (lambda: mgrit_gru.Budget(forward=-1), r"Budget: invalid forward=-1"),
        (lambda: mgrit_gru.Budget(backward_relax="C"), r"Budget: invalid backward_relax='C'"),
        (lambda: mgrit_gru.Budget(gradient="exact"), r"Budget: invalid gradient='exact'"),
        (lambda: mgrit_gru.Auto(mgrit="fast"), r"Auto: invalid mgrit='fast'"),
        (lambda: mgrit_gru.Auto(MGRIT(budget=mgrit_gru.Budget())), r"a budget or serial MGRIT"),
        (lambda: mgrit_gru.Auto(max_wait=0), r"Auto: invalid max_wait=0"),
    ],
)
def test_invalid_option_families(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_option_families_accept_names_and_objects():
    assert MGRIT(coarse="secant").coarse == mgrit_gru.Secant()
    assert MGRIT(coarse=mgrit_gru.Secant(depth=2)).coarse.depth == 2
    assert MGRIT(coarse="implicit").coarse == mgrit_gru.Implicit("average")
    assert MGRIT(relax="FCFCFCF").relax == "FCFCFCF"
    assert MGRIT(coarse="frozen", relax="FCFCF").describe() == "mgrit(relax=FCFCF,coarse=frozen)"
    budget = MGRIT(budget=mgrit_gru.Budget(2, 1, backward_relax="F"))
    fwd, bwd = (budget.stopping(p, 1e-7, 1e-6) for p in ("forward", "backward"))
    assert (fwd.max_iters, bwd.max_iters, budget.bwd_relax) == (2, 1, "F")
    assert fwd.tol == bwd.tol == fwd.floor == 0.0  # no tolerance, no floor: the cycles run


def test_options_are_frozen_and_backward_defaults_follow_forward():
    opts = MGRIT(tol=1e-7, max_iters=3)
    rule = opts.stopping("backward", 2.2e-16, 1e-14)
    assert (rule.tol, rule.max_iters, rule.asked) == (1e-7, 3, None)
    assert MGRIT(tol=1e-7, backward_tol=1e-4).stopping("backward", 2.2e-16, 1e-14).tol == 1e-4
    with pytest.raises(AttributeError):
        opts.tol = 1.0
    assert MGRIT.serial().is_serial
    assert MGRIT(cfactor=32, levels="auto").num_levels(16384) == 3


def test_module_arguments():
    with pytest.raises(ValueError, match="unknown solver='fast'"):
        mgrit_gru.GRU(3, 4, solver="fast")
    assert isinstance(mgrit_gru.GRU(3, 4).solver, mgrit_gru.Auto)
    assert isinstance(mgrit_gru.GRU(3, 4, solver="mgrit").solver, MGRIT)
    with pytest.raises(ValueError, match="unknown cell='lstm'"):
        mgrit_gru.GRU(3, 4, cell="lstm")
    with pytest.raises(ValueError, match="^GRU: hidden_size must be greater than zero"):
        mgrit_gru.GRU(3, 0)
    with pytest.raises(ValueError, match="dropout should be a number in range \\[0, 1\\]"):
        mgrit_gru.GRU(3, 4, dropout=1.5)
    with pytest.raises(TypeError, match="expected a torch.nn.GRU"):
        mgrit_gru.GRU.from_torch(torch.nn.LSTM(3, 4))


def test_time_parallel_refuses_packed_input_before_any_exchange():
    from mgrit_gru.distributed import TimeGroup

    gru = mgrit_gru.GRU(3, 4, time_group=TimeGroup())  # no process group: nothing may be sent
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.randn(5, 2, 3), torch.tensor([5, 3]), enforce_sorted=False
    )
    with pytest.raises(ValueError, match="global lengths=.*not a PackedSequence"):
        gru(packed)
    with pytest.raises(ValueError, match="unknown coarse='one'; choose 'replicated' or 'root'"):
        TimeGroup(coarse="one")


def test_auto_cfactor_follows_the_cost_model():
    from mgrit_gru import cost
    from mgrit_gru.distributed import TimeGroup
    from mgrit_gru.layer.solve import step_kind
    from mgrit_gru.options import auto_cfactor

    # CPU, early exit: the power of two at or below sqrt(28 T B / rows), rows = o / c of the
    # cost model (80 at H=64), chunks of 32 to 512 steps
    assert cost.overhead_rows(64) == pytest.approx(80.0)
    assert [auto_cfactor(T, 4, 64) for T in (100, 1024, 4096, 16384, 65536)] == [
        32,
        32,
        64,
        128,
        256,
    ]
    assert auto_cfactor(784, 32, 64) == 64 and auto_cfactor(1460, 10, 64) == 64  # smnist, ACSF1
    assert auto_cfactor(16384, 4, 256) == 256 and auto_cfactor(16384, 16, 64) == 256
    assert auto_cfactor(10**7, 64, 64) == 512
    assert auto_cfactor(65536, 4, 64, "cuda:0") == 32
    # without early exit: about 1024 rows (of H=64) per batched step
    no_exit = MGRIT(cfactor="auto", early_exit=False)
    assert [auto_cfactor(T, 4, 64, options=no_exit) for T in (4096, 16384, 65536)] == [32, 64, 256]
    assert no_exit.resolve(16384, 4, 64).cfactor == 64
    opts = MGRIT(cfactor="auto", tol=1e-7)
    resolved = opts.resolve(16384, 4, 64, "cpu")
    assert resolved == MGRIT(cfactor=128, tol=1e-7)
    assert MGRIT(cfactor=8).resolve(9, 9, 9) is not None
    with pytest.raises(ValueError, match="cfactor='auto' must be resolved first"):
        opts.num_levels(100)
    # time-parallel ranks: one process's rule on the whole T, at least one chunk per rank
    assert auto_cfactor(65536, 4, 64, ranks=2) == auto_cfactor(65536, 4, 64) == 256
    assert (
        auto_cfactor(65536, 4, 64, ranks=16) == 256 and auto_cfactor(65537, 4, 64, ranks=2) == 256
    )
    assert auto_cfactor(150, 3, 5) == 32 and auto_cfactor(150, 3, 5, ranks=8) == 16  # 10 chunks
    assert MGRIT().resolve(150, 3, 5, ranks=8).cfactor == 16
    tg = TimeGroup()
    gru = mgrit_gru.GRU(3, 64, time_group=tg)  # no process group needed to ask
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TimeGroup, "size", property(lambda self: 2))
        # one process's, for the steps that run (the compiled sweeps' rule where they serve)
        assert gru.time_cfactor(65536, 4) == auto_cfactor(65536, 4, 64, kind=step_kind())


@pytest.fixture
def gru():
    return mgrit_gru.GRU(3, 4, num_layers=2)


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: (torch.randn(5, 2, 3, 1), None), ValueError, r"2 \(unbatched.*or 3 dimensions"),
        (
            lambda: (torch.randn(5, 2, 7), None),
            ValueError,
            r"input.size\(-1\) "
            r"must be equal to input_size. Expected 3, got 7",
        ),
        (
            lambda: (torch.randn(5, 2, 3, dtype=torch.float32), None),
            TypeError,
            r"input dtype torch.float32 does not match the parameters' dtype torch.float64",
        ),
        (
            lambda: (torch.randn(0, 2, 3), None),
            ValueError,
            r"Expected sequence length to be larger than 0 in RNN",
        ),
        (
            lambda: (torch.tensor([[[1.0, float("nan"), 0.0]]]), None),
            ValueError,
            r"input contains NaN or Inf",
        ),
        (
            lambda: (torch.tensor([[[1.0, 2.0, 0.0]], [[-float("inf"), 2.0, float("inf")]]]), None),
            ValueError,
            r"input contains NaN or Inf",
        ),
        (
            lambda: (torch.randn(5, 2, 3), torch.randn(1, 2, 4)),
            ValueError,
            r"Expected hidden size \(2, 2, 4\), got \[1, 2, 4\] \(h0\)",
        ),
        (
            lambda: (torch.randn(5, 2, 3), torch.randn(2, 2, 4, dtype=torch.float32)),
            TypeError,
            r"h0 dtype torch.float32 does not match",
        ),
        (
            lambda: (torch.randn(5, 2, 3), torch.full((2, 2, 4), float("inf"))),
            ValueError,
            r"h0 contains NaN or Inf",
        ),
        (lambda: ([[1.0, 2.0, 3.0]], None), TypeError, r"input must be a torch.Tensor"),
    ],
)
def test_bad_input(gru, make, error, match):
    x, h0 = make()
    with pytest.raises(error, match=match):
        gru(x, h0)


def test_huge_finite_input_is_not_taken_for_inf(gru):
    """The finiteness check sums first; a sum that overflows from finite values is checked
    element by element, so such input runs."""
    x = torch.full((5, 2, 3), torch.finfo(torch.float64).max / 4)
    assert not torch.isfinite(x.sum())
    y, _ = gru(x)
    assert torch.isfinite(y).all()


def test_device_mismatch(gru):
    """torch's words and order: the states against the input first, then the input against
    the parameters."""
    x = torch.randn(5, 2, 3, device="meta")
    with pytest.raises(
        RuntimeError,
        match=r"Input and parameter tensors are not at the same device, found input tensor at "
        r"meta and parameter tensor at cpu",
    ):
        gru(x)
    with pytest.raises(
        RuntimeError, match=r"Input and hidden tensors are not at the same device, found input "
        r"tensor at meta and hidden tensor at cpu \(h0\)",
    ):  # fmt: skip
        gru(x, torch.zeros(2, 2, 4))


def test_auto_tolerance_follows_the_arithmetic():
    """tol="auto": 1e-5 in 32-bit arithmetic (at least its floor), the rounding floor in
    float64; the cap: 10 cycles for 5 digits, 2 per digit beyond. A tolerance below the floor
    is raised to it and the one asked is kept for the warning."""
    from mgrit_gru.core import stopping

    f32 = stopping.floor(torch.float32, "cpu", 32)
    f64 = stopping.floor(torch.float64, "cpu", 32)
    assert 1e-7 < f32 < 1e-5 and 1e-16 < f64 < 1e-13
    auto = MGRIT()
    rule32 = auto.stopping("forward", torch.finfo(torch.float32).eps, f32)
    assert (rule32.tol, rule32.max_iters, rule32.floor, rule32.asked) == (1e-5, 10, f32, None)
    rule64 = auto.stopping("backward", torch.finfo(torch.float64).eps, f64)
    assert rule64.tol == f64 and rule64.max_iters == math.ceil(-2 * math.log10(f64))
    bf16 = auto.stopping("forward", 2.0**-7, stopping.floor(torch.float32, "cpu", 32) * 2**16)
    assert bf16.tol > 1e-5 and bf16.asked is None  # auto: silently the floor
    raised = MGRIT(tol=1e-9).stopping("forward", torch.finfo(torch.float32).eps, f32)
    assert (raised.tol, raised.asked) == (f32, 1e-9)
    assert MGRIT(tol=1e-9).stopping("forward", torch.finfo(torch.float64).eps, f64).asked is None


def test_roundoff_reads_the_matmul_precision(monkeypatch):
    from mgrit_gru.core import stopping

    assert stopping.roundoff(torch.float64) == torch.finfo(torch.float64).eps
    assert stopping.roundoff(torch.float32) == torch.finfo(torch.float32).eps
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    assert stopping.roundoff(torch.float32) == 2.0**-7
    assert stopping.roundoff(torch.float64) == torch.finfo(torch.float64).eps


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_an_empty_batch_is_answered_as_torch_does(kind, batch_first):
    """A batch of size 0 gives torch's shapes (outputs and final states with batch 0), and a
    backward through them runs, every gradient zero (torch.nn.GRU / LSTM do the same)."""
    torch_cls, ours_cls = {
        "gru": (torch.nn.GRU, mgrit_gru.GRU),
        "lstm": (torch.nn.LSTM, mgrit_gru.LSTM),
    }[kind]
    ref = torch_cls(3, 4, 2, bidirectional=True, batch_first=batch_first)
    ours = ours_cls.from_torch(ref)
    x = torch.randn(0, 5, 3) if batch_first else torch.randn(5, 0, 3)
    for module in (ref, ours):
        leaf = x.clone().requires_grad_()
        y, h_n = module(leaf)
        y_ref, h_ref = ref(x)
        assert y.shape == y_ref.shape
        states = h_n if isinstance(h_n, tuple) else (h_n,)
        refs = h_ref if isinstance(h_ref, tuple) else (h_ref,)
        assert [s.shape for s in states] == [s.shape for s in refs]
        (y.sum() + sum(s.sum() for s in states)).backward()
        assert all(p.grad is None or not p.grad.any() for p in module.parameters())
        module.zero_grad()


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_the_meta_device_gives_torchs_shapes(kind):
    """On the meta device (shapes without data: model inspection, FLOP counters) a call
    returns what torch's module returns there: outputs and states of the right shapes."""
    ref = getattr(torch.nn, kind)(3, 4, 2, bidirectional=True, batch_first=True, device="meta")
    ours = getattr(mgrit_gru, kind)(3, 4, 2, bidirectional=True, batch_first=True, device="meta")
    x = torch.randn(2, 5, 3, device="meta")
    (y, h), (y_ref, h_ref) = ours(x), ref(x)
    states = h if isinstance(h, tuple) else (h,)
    refs = h_ref if isinstance(h_ref, tuple) else (h_ref,)
    assert y.device.type == "meta" and y.shape == y_ref.shape
    assert [s.shape for s in states] == [s.shape for s in refs]


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize("change", ["relu_", "imul", "setitem"])
def test_outputs_may_be_changed_in_place(kind, change):
    """In-place operations on the output, as torch's RNNs allow them: the gradients equal
    torch's module's under the same operations."""
    ref = getattr(torch.nn, kind)(3, 4)
    ours = getattr(mgrit_gru, kind).from_torch(ref, solver="serial")
    x = torch.randn(20, 2, 3)
    grads = []
    for module in (ref, ours):
        leaf = x.clone().requires_grad_()
        y, _ = module(leaf)
        if change == "relu_":
            y.relu_()
        elif change == "imul":
            y *= 2
        else:
            y[0] = 0
        y.square().sum().backward()
        grads.append(leaf.grad)
    assert (grads[0] - grads[1]).abs().max() < 1e-12


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"bias": "False"}, "bias should be of type bool, got: str"),
        ({"bias": 1}, "bias should be of type bool, got: int"),
        ({"batch_first": "False"}, "batch_first should be of type bool, got: str"),
        ({"batch_first": 0}, "batch_first should be of type bool, got: int"),
        ({"hidden_size": 5.0}, "hidden_size should be of type int, got: float"),
        ({"input_size": 3.0}, "input_size should be of type int, got: float"),
    ],
)
def test_argument_types_as_torch_checks_them(kind, kwargs, message):
    """A flag that is not a bool (batch_first="False" is truthy: it would silently run batch
    first) or a size that is not an int: torch's TypeError, in torch's words."""
    args = {"input_size": 3, "hidden_size": 5, **kwargs}
    with pytest.raises(TypeError, match=message):
        getattr(torch.nn, kind)(**args)
    with pytest.raises(TypeError, match=f"^{kind}: {message}"):
        getattr(mgrit_gru, kind)(**args)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_errors_are_catchable_as_torchs(kind):
    """Where torch's RNNs raise RuntimeError (input size, state shape, empty sequence) or
    ValueError (dtype), the library's error is that class too (and keeps its own)."""
    ours = getattr(mgrit_gru, kind)(3, 4)
    ref = getattr(torch.nn, kind)(3, 4)
    cases = [
        (torch.randn(5, 2, 7), None, RuntimeError),
        (torch.randn(0, 2, 3), None, RuntimeError),
        (torch.randn(5, 2, 3, dtype=torch.float32), None, ValueError),
    ]
    state = torch.randn(1, 3, 4)  # batch 3 for a batch of 2
    cases.append((torch.randn(5, 2, 3), state if kind == "GRU" else (state, state), RuntimeError))
    for x, hx, torch_error in cases:
        with pytest.raises(torch_error):
            ref(x, hx)
        with pytest.raises(torch_error):
            ours(x, hx)
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM"):
        torch.nn.GRU(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="^GRU: proj_size argument is only supported for LSTM"):
        mgrit_gru.GRU(3, 4, proj_size=2)
    assert mgrit_gru.GRU(3, 4, proj_size=0).hidden_size == 4
