"""PyTorch's own GRU / LSTM tests, ported to judge the "drop-in" claim.

Each test runs three times, over the ``impl`` parameter:

* ``"torch"``: ``torch.nn.GRU`` / ``torch.nn.LSTM`` (the control: the port itself is right),
* ``"default"``: ``mgrit_gru.GRU`` / ``mgrit_gru.LSTM`` with their default solver,
* ``"mgrit"``: the same with ``MGRIT(cfactor=2, tol=1e-12, ...)``, which runs MGRIT cycles
  even on the short sequences below.

Sources: ``test/test_nn.py`` at pytorch commit 74f2fa66feec00335f72813782f4802e80bff4cb
(``TestNN`` and ``TestNNDeviceType``), and the GRU / LSTM entries of ``module_db`` in
``torch/testing/_internal/common_modules.py`` (stored version 00131b6bd4be; the file was not
available at 74f2fa66). Each test's docstring names its source and what was adapted; the
assertions are the originals' (``assertEqual`` is ``torch.testing.assert_close`` with its
default float64 tolerances, ``assertNotEqual`` its negation). CUDA / cuDNN-only parts are
dropped or replaced by a float64 CPU comparison with ``torch.nn``. Not ported: tests of
``nn.RNN`` only and of the cells (``RNNCell`` / ``GRUCell`` / ``LSTMCell``): the library has
neither.

Everything runs in float64 (tests/conftest.py's default dtype) on the CPU.

Where the library differs from torch, the library cases are marked ``xfail`` with the
difference as the reason: strict, except where the outcome rests on rounding (gradcheck's
reentrancy check), which the CPU and the compiled kernels change.
"""

from __future__ import annotations

import copy
import io
import itertools
import re
from functools import partial

import pytest
import torch
import torch.nn.utils.rnn as rnn_utils
from torch import nn
from torch.testing import assert_close, make_tensor

import mgrit_gru

IMPLS = ("torch", "default", "mgrit")


def mgrit_solver() -> mgrit_gru.MGRIT:
    """MGRIT that really cycles on short sequences, iterated to round-off."""
    return mgrit_gru.MGRIT(
        cfactor=2, tol=1e-12, max_iters=200, guard=mgrit_gru.Guard(patience=200, cost=False)
    )


def build(impl: str, kind: str, *args, **kwargs) -> nn.Module:
    """``kind`` ("GRU" / "LSTM") as ``impl`` makes it, with torch's constructor arguments."""
    if impl == "torch":
        return getattr(nn, kind)(*args, **kwargs)
    cls = getattr(mgrit_gru, kind)
    if impl == "default":
        return cls(*args, **kwargs)
    return cls(*args, **kwargs, solver=mgrit_solver())


def copy_of(impl: str, ref: nn.Module) -> nn.Module:
    """A copy of the torch module ``ref`` as ``impl`` (same weights, dtype and device)."""
    if impl == "torch":
        return copy.deepcopy(ref)
    cls = getattr(mgrit_gru, type(ref).__name__)
    if impl == "default":
        return cls.from_torch(ref)
    return cls.from_torch(ref, solver=mgrit_solver())


def xfail_library(request, impl: str, reason: str, when: bool = True, strict: bool = True) -> None:
    """Mark this case xfail for the two library variants (not the control); strict unless
    the outcome rests on rounding (which the CPU and the compiled kernels change)."""
    if when and impl != "torch":
        request.applymarker(pytest.mark.xfail(strict=strict, reason=reason))


def assert_not_close(actual, expected) -> None:
    """torch's TestCase.assertNotEqual: fails where assertEqual would pass."""
    with pytest.raises(AssertionError):
        assert_close(actual, expected)


@pytest.fixture(params=IMPLS)
def impl(request) -> str:
    return request.param


@pytest.fixture
def make(impl):
    """``make(kind, *args, **kwargs)``: the module of this case's implementation."""
    return partial(build, impl)


# ---------------------------------------------------------------------------------------------
# TestNN: argument and device checks
# ---------------------------------------------------------------------------------------------

ARGS_CASES = ("input_batch", "hidden_batch", "input_size", "hidden_size", "hidden_0")


@pytest.mark.parametrize("case", ARGS_CASES)
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_rnn_args_check(make, kind, case):
    """test/test_nn.py@74f2fa66 TestNN.test_rnn_args_check.

    Adapted: the 'RNN' mode dropped; each of the five bad shapes is its own case."""
    input_size, hidden_size, num_layers, batch_size, seq_len = 3, 5, 2, 4, 6
    num_directions = 1
    bad_size = 7  # prime number so that no size can divide it.

    correct_input_shape = (seq_len, batch_size, input_size)
    correct_hidden_shape = (num_layers * num_directions, batch_size, hidden_size)

    def update_shape(shape, dim, new_dim_size):
        new_shape = list(shape)
        new_shape[dim] = new_dim_size
        return tuple(new_shape)

    def get_inputs(input_shape, hidden_shape):
        input = torch.randn(input_shape)
        hidden = torch.randn(hidden_shape)
        if kind != "LSTM":
            return [(input, hidden)]
        if hidden_shape == correct_hidden_shape:
            return [(input, (hidden, hidden))]
        good_hidden = torch.randn(correct_hidden_shape)
        return [(input, (hidden, good_hidden)), (input, (good_hidden, hidden))]

    shapes = {
        "input_batch": (update_shape(correct_input_shape, 1, bad_size), correct_hidden_shape),
        "hidden_batch": (correct_input_shape, update_shape(correct_hidden_shape, 1, bad_size)),
        "input_size": (update_shape(correct_input_shape, 2, bad_size), correct_hidden_shape),
        "hidden_size": (correct_input_shape, update_shape(correct_hidden_shape, 2, bad_size)),
        "hidden_0": (correct_input_shape, update_shape(correct_hidden_shape, 0, bad_size)),
    }
    for input, hidden in get_inputs(*shapes[case]):
        model = make(kind, input_size, hidden_size, num_layers)
        with pytest.raises(RuntimeError):
            model(input, hidden)


PROJ_ARGS_CASES = (
    "input_batch",
    "hidden_batch",
    "input_size",
    "hidden_size",
    "hidden_0",
    "proj_eq_hidden",
    "proj_ne_hidden",
    "cell_ne_hidden",
)


@pytest.mark.parametrize("case", PROJ_ARGS_CASES)
def test_projections_lstm_args_check(request, impl, make, case):
    """test/test_nn.py@74f2fa66 TestNN.test_projections_lstm_args_check.

    Adapted: each of the eight bad shapes is its own case."""
    input_size, hidden_size, proj_size, num_layers, batch_size, seq_len = 3, 5, 2, 2, 4, 6
    num_directions = 1
    bad_size = 7  # prime number so that no size can divide it.

    correct_input_shape = (seq_len, batch_size, input_size)
    correct_hidden_h_shape = (num_layers * num_directions, batch_size, proj_size)
    correct_hidden_c_shape = (num_layers * num_directions, batch_size, hidden_size)

    def update_shape(shape, dim, new_dim_size):
        new_shape = list(shape)
        new_shape[dim] = new_dim_size
        return tuple(new_shape)

    ci, ch, cc = correct_input_shape, correct_hidden_h_shape, correct_hidden_c_shape
    shapes = {
        "input_batch": (update_shape(ci, 1, bad_size), ch, cc),
        "hidden_batch": (ci, update_shape(ch, 1, bad_size), update_shape(cc, 1, bad_size)),
        "input_size": (update_shape(ci, 2, bad_size), ch, cc),
        "hidden_size": (ci, update_shape(ch, 2, bad_size), update_shape(cc, 2, bad_size)),
        "hidden_0": (ci, update_shape(ch, 0, bad_size), update_shape(cc, 0, bad_size)),
        "proj_eq_hidden": (ci, update_shape(ch, 0, hidden_size), cc),
        "proj_ne_hidden": (ci, update_shape(ch, 0, bad_size), cc),
        "cell_ne_hidden": (ci, ch, update_shape(cc, 0, bad_size)),
    }
    input_shape, hidden_h_shape, hidden_c_shape = shapes[case]
    input = torch.randn(input_shape)
    hidden = (torch.randn(hidden_h_shape), torch.randn(hidden_c_shape))
    model = make("LSTM", input_size, hidden_size, num_layers, proj_size=proj_size)
    with pytest.raises(RuntimeError):
        model(input, hidden)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_rnn_check_device(request, impl, make, kind):
    """test/test_nn.py@74f2fa66 TestNN.test_rnn_check_device.

    Adapted: runs without GPUs: the second device 'cuda:0' is the meta device, and in the
    LSTM's last check the pair (cuda:0, cuda:1) is (meta, cpu); the RNN mode dropped."""
    input_size, hidden_size, num_layers, batch_size, seq_len = 3, 5, 2, 4, 6
    num_directions = 1
    other = "meta"

    correct_input_shape = (seq_len, batch_size, input_size)
    correct_hidden_shape = (num_layers * num_directions, batch_size, hidden_size)

    model = make(kind, input_size, hidden_size, num_layers)
    model_other = copy.deepcopy(model).to(other)
    input = torch.randn(correct_input_shape)
    hidden = torch.randn(correct_hidden_shape)

    # input and weights are not at the same device
    with pytest.raises(
        RuntimeError, match="Input and parameter tensors are not at the same device"
    ):
        model(input.to(other))
    with pytest.raises(
        RuntimeError, match="Input and parameter tensors are not at the same device"
    ):
        model_other(input)

    # input and hiddens are not at the same device
    with pytest.raises(RuntimeError, match=r"Input and hidden tensors are not at the same device"):
        if kind == "LSTM":
            model(input, (hidden.to(other), hidden.to(other)))
        else:
            model(input, (hidden.to(other)))
    with pytest.raises(RuntimeError, match=r"Input and hidden tensors are not at the same device"):
        if kind == "LSTM":
            model_other(input.to(other), (hidden, hidden))
        else:
            model_other(input.to(other), (hidden))

    # hidden tensors are not at the same device
    if kind == "LSTM":
        with pytest.raises(
            RuntimeError, match="Input and hidden tensors are not at the same device"
        ):
            model(input.to(other), (hidden.to(other), hidden.to("cpu")))


def test_projections_lstm_check_device(request, impl, make):
    """test/test_nn.py@74f2fa66 TestNN.test_projections_lstm_check_device.

    Adapted: runs without GPUs: 'cuda:0' is the meta device, (cuda:0, cuda:1) is (meta, cpu)."""
    input_size, hidden_size, proj_size, num_layers, batch_size, seq_len = 3, 5, 2, 2, 4, 6
    num_directions = 1
    other = "meta"

    correct_input_shape = (seq_len, batch_size, input_size)
    correct_hidden_h_shape = (num_layers * num_directions, batch_size, proj_size)
    correct_hidden_c_shape = (num_layers * num_directions, batch_size, hidden_size)

    model = make("LSTM", input_size, hidden_size, num_layers, proj_size=proj_size)
    input = torch.randn(correct_input_shape)
    hidden_h = torch.randn(correct_hidden_h_shape)
    hidden_c = torch.randn(correct_hidden_c_shape)

    # input and weights are not at the same device
    with pytest.raises(
        RuntimeError, match="Input and parameter tensors are not at the same device"
    ):
        model(input.to(other))

    # input and hiddens are not at the same device
    with pytest.raises(RuntimeError, match=r"Input and hidden tensors are not at the same device"):
        model(input, (hidden_h.to(other), hidden_c.to(other)))

    # hidden tensors are not at the same device
    with pytest.raises(RuntimeError, match="Input and hidden tensors are not at the same device"):
        model(input.to(other), (hidden_h.to(other), hidden_c.to("cpu")))


@pytest.mark.parametrize("check", ["hidden", "input"])
@pytest.mark.parametrize("case", ["LSTM", "LSTM_proj", "GRU"])
def test_cudnn_forward_exception(request, impl, make, case, check):
    """test/test_nn.py@74f2fa66 TestNN.test_cudnn_forward_exception (no CUDA needed).

    Adapted: the RNN mode dropped; each module and each of the two checks is its own case."""
    if case == "LSTM":
        rnn, hidden = (
            make("LSTM", 10, 20, batch_first=True),
            (
                torch.zeros(1, 2, 19),
                torch.zeros(1, 2, 19),
            ),
        )
    elif case == "LSTM_proj":
        rnn, hidden = (
            make("LSTM", 10, 20, batch_first=True, proj_size=10),
            (
                torch.zeros(1, 2, 19),
                torch.zeros(1, 2, 19),
            ),
        )
    else:
        rnn, hidden = make("GRU", 10, 20, batch_first=True), torch.zeros(1, 2, 19)
    x_wrong = torch.randn(2, 3, 3)
    x_right = torch.randn(2, 3, 10)
    if check == "hidden":
        with pytest.raises(RuntimeError, match="Expected hidden.*size.*got"):
            rnn(x_right, hidden)
    else:
        with pytest.raises(
            RuntimeError, match=re.escape("input.size(-1) must be equal to input_size")
        ):
            rnn(x_wrong)


def test_projections_errors_on_gru_and_rnn(make):
    """test/test_nn.py@74f2fa66 TestNN.test_projections_errors_on_gru_and_rnn.

    Adapted: the RNN mode dropped."""
    error_msg = "proj_size argument is only supported for LSTM, not RNN or GRU"
    with pytest.raises(ValueError, match=error_msg):
        make("GRU", 30, 20, 2, proj_size=10)


@pytest.mark.parametrize(
    "args,regex",
    [
        ((10, 0, 1), "hidden_size must be greater than zero"),
        ((10, 10, 0), "num_layers must be greater than zero"),
    ],
    ids=["hidden_size_0", "num_layers_0"],
)
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_module_db_error_inputs(request, impl, make, kind, args, regex):
    """torch/testing/_internal/common_modules.py@00131b6b module_error_inputs_torch_nn_RNN_GRU
    (the module_error_inputs_func of module_db's GRU and LSTM entries), as test_modules.py's
    test_errors runs them: construction raises ValueError matching the regex."""
    with pytest.raises(ValueError, match=regex):
        make(kind, *args)


# ---------------------------------------------------------------------------------------------
# TestNN: initial state, empty inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_rnn_initial_hidden_state(make, kind):
    """test/test_nn.py@74f2fa66 TestNN.test_rnn_initial_hidden_state.

    Adapted: the RNN mode dropped; float64."""
    rnn = make(kind, 30, 20, 2)
    input = torch.randn(10, 32, 30)
    hidden = torch.zeros(2, 32, 20)

    if kind == "LSTM":
        hidden = (hidden, hidden)
    output1, hidden1 = rnn(input, hidden)
    output2, hidden2 = rnn(input)
    assert_close(output1, output2)
    assert_close(hidden1, hidden2)


@pytest.mark.parametrize("bidir", [False, True])
def test_projections_lstm_initial_hidden_state(request, impl, make, bidir):
    """test/test_nn.py@74f2fa66 TestNN.test_projections_lstm_initial_hidden_state.

    Adapted: bidir is a parameter; float64."""
    rnn = make("LSTM", 30, 20, 2, bidirectional=bidir, proj_size=10)
    num_dirs = 2 if bidir else 1
    input = torch.randn(10, 32, 30)
    hidden_h = torch.zeros(2 * num_dirs, 32, 10)
    hidden_c = torch.zeros(2 * num_dirs, 32, 20)
    hidden = (hidden_h, hidden_c)
    output1, hidden1 = rnn(input, hidden)
    output2, hidden2 = rnn(input)
    assert_close(output1, output2)
    assert_close(hidden1, hidden2)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_error_RNN_seq_len_zero(request, impl, make, kind, bidirectional):
    """test/test_nn.py@74f2fa66 TestNN.test_error_RNN_seq_len_zero.

    Adapted: CPU only (the original also runs it on CPU); the RNN mode dropped; float64."""
    input = torch.ones(0, 10, 5)
    rnn = make(kind, 5, 6, bidirectional=bidirectional)
    with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0 in RNN"):
        rnn(input)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_RNN_input_size_zero(make, kind):
    """test/test_nn.py@74f2fa66 TestNN.test_RNN_input_size_zero (a batch of size 0).

    Adapted: CPU only; the RNN mode dropped."""
    input = torch.zeros((5, 0, 3))
    rnn = make(kind, input_size=3, hidden_size=4)
    outs = rnn(input)
    assert outs[0].shape == torch.Size([5, 0, 4])
    # Check that backward does not cause a hard error
    outs[0].sum().backward()


# ---------------------------------------------------------------------------------------------
# TestNN: against a reference (cuDNN / CUDA comparisons replaced by float64 torch.nn on CPU)
# ---------------------------------------------------------------------------------------------


def _forward_backward(
    rnn, input_val, grad_output, weights_val, hx_val, grad_hy, cx_val=None, grad_cy=None
):
    """_test_RNN_cpu_vs_cudnn's forward_backward, without its CUDA branch."""
    is_lstm = isinstance(rnn, nn.LSTM)

    for x_layer, y_layer in zip(rnn.all_weights, weights_val):
        for x, y in zip(x_layer, y_layer):
            x.data.copy_(y.data)

    if isinstance(input_val, rnn_utils.PackedSequence):
        input = rnn_utils.PackedSequence(
            input_val.data.data.requires_grad_(True), input_val.batch_sizes
        )
        input_var = input.data
    else:
        input = input_val.clone().requires_grad_(True)
        input_var = input
    if is_lstm:
        if cx_val is None:
            hx = (hx_val.clone().requires_grad_(True), hx_val.add(1).requires_grad_(True))
        else:
            hx = (hx_val.clone().requires_grad_(True), cx_val.add(1).requires_grad_(True))
    else:
        hx = hx_val.clone().requires_grad_(True)

    output, hy = rnn(input, hx)

    if isinstance(output, rnn_utils.PackedSequence):
        output = output.data

    if is_lstm:
        if grad_cy is None:
            torch.autograd.backward([output, hy[0], hy[1]], [grad_output, grad_hy, grad_hy + 1])
        else:
            torch.autograd.backward([output, hy[0], hy[1]], [grad_output, grad_hy, grad_cy + 1])
    else:
        torch.autograd.backward([output, hy], [grad_output, grad_hy])

    return {
        "output": output.data,
        "hy": hy[0].data if is_lstm else hy.data,
        "weights": rnn.all_weights,
        "grad_input": input_var.grad.data,
        "grad_hx": hx[0].grad.data if is_lstm else hx.grad.data,
        "cy": hy[1].data if is_lstm else None,
        "grad_cx": hx[1].grad.data if is_lstm else None,
    }


def _make_noncontig(tensor):
    ndim = tensor.dim()
    return torch.stack([tensor.clone().zero_(), tensor], ndim).select(ndim, 1)


def _compare_cpu_gpu(outputs_cpu, outputs_gpu):
    assert list(outputs_cpu.keys()) == list(outputs_gpu.keys())
    for key in outputs_cpu.keys():
        if key != "weights":
            assert_close(outputs_cpu[key], outputs_gpu[key], atol=5e-5, rtol=0, msg=key)

    # check grad weights separately, as nested dict
    for cpu_layer_weight, gpu_layer_weight in zip(outputs_cpu["weights"], outputs_gpu["weights"]):
        for cpu_weight, gpu_weight in zip(cpu_layer_weight, gpu_layer_weight):
            assert_close(cpu_weight.grad.data, gpu_weight.grad.data, atol=5e-5, rtol=0)


CPU_VS_CUDNN_SIZES = dict(
    input_size=10, hidden_size=6, proj_size=3, num_layers=2, seq_length=7, batch=6
)


@pytest.mark.parametrize("dropout", [0, 1], ids=["no_dropout", "with_dropout"])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_RNN_cpu_vs_cudnn(impl, kind, dropout):
    """test/test_nn.py@74f2fa66 TestNN._test_RNN_cpu_vs_cudnn via test_RNN_cpu_vs_cudnn_no_dropout
    (dropout=0) and test_RNN_cpu_vs_cudnn_with_dropout (dropout=1), its module loop over
    (nn.LSTM, nn.GRU) and all 64 (bias, bidirectional, batch_first, contig, variable_len,
    lens_as_tensor) configurations.

    Adapted: the cuDNN module is the implementation under test, the CPU module torch.nn.<kind>
    (float64, as the original); the RNN modes (tanh / relu) dropped; the projection part is
    test_RNN_cpu_vs_cudnn_proj. The original's unused non-contiguous copy of the input is
    omitted."""
    s = CPU_VS_CUDNN_SIZES
    input_size, hidden_size, num_layers = s["input_size"], s["hidden_size"], s["num_layers"]
    seq_length, batch, dtype = s["seq_length"], s["batch"], torch.double
    module = getattr(nn, kind)
    for bias, bidirectional, batch_first, contig, variable_len, lens_as_tensor in itertools.product(
        (True, False), repeat=6
    ):
        num_directions = 2 if bidirectional else 1
        if batch_first:
            input_val = torch.randn(batch, seq_length, input_size, dtype=dtype)
            grad_output = torch.randn(batch, seq_length, hidden_size * num_directions, dtype=dtype)
        else:
            input_val = torch.randn(seq_length, batch, input_size, dtype=dtype)
            grad_output = torch.randn(seq_length, batch, hidden_size * num_directions, dtype=dtype)

        hx_val = torch.randn(num_layers * num_directions, batch, hidden_size, dtype=dtype)
        grad_hy = torch.randn(num_layers * num_directions, batch, hidden_size, dtype=dtype)

        if not contig:
            grad_output = _make_noncontig(grad_output)
            grad_hy = _make_noncontig(grad_hy)
            hx_val = _make_noncontig(hx_val)

        if variable_len:
            lengths = [7, 5, 5, 2, 1, 1]
            if lens_as_tensor:
                lengths = torch.tensor(lengths, dtype=torch.long)
            input_val = rnn_utils.pack_padded_sequence(input_val, lengths, batch_first=batch_first)
            grad_output = rnn_utils.pack_padded_sequence(
                grad_output, lengths, batch_first=batch_first
            ).data

        args = (input_size, hidden_size, num_layers)
        kwargs = dict(
            bias=bias, dropout=dropout, bidirectional=bidirectional, batch_first=batch_first
        )
        rnn = module(*args, **kwargs).to(dtype)
        outputs_cpu = _forward_backward(
            rnn, input_val, grad_output, rnn.all_weights, hx_val, grad_hy
        )

        rnn_gpu = build(impl, kind, *args, **kwargs).to(dtype)
        outputs_gpu = _forward_backward(
            rnn_gpu, input_val, grad_output, rnn.all_weights, hx_val, grad_hy
        )

        _compare_cpu_gpu(outputs_cpu, outputs_gpu)


@pytest.mark.parametrize("dropout", [0, 1], ids=["no_dropout", "with_dropout"])
def test_RNN_cpu_vs_cudnn_proj(request, impl, dropout):
    """test/test_nn.py@74f2fa66 TestNN._test_RNN_cpu_vs_cudnn ("checking LSTM with
    projections", proj_size=3) via test_RNN_cpu_vs_cudnn_no_dropout / _with_dropout, all 64
    configurations.

    Adapted: the cuDNN module is the implementation under test, the CPU module torch.nn.LSTM
    (float64). The original's unused non-contiguous copy of the input is omitted."""
    s = CPU_VS_CUDNN_SIZES
    input_size, hidden_size, num_layers = s["input_size"], s["hidden_size"], s["num_layers"]
    proj_size, seq_length, batch, dtype = s["proj_size"], s["seq_length"], s["batch"], torch.double
    for bias, bidirectional, batch_first, contig, variable_len, lens_as_tensor in itertools.product(
        (True, False), repeat=6
    ):
        num_directions = 2 if bidirectional else 1
        if batch_first:
            input_val = torch.randn(batch, seq_length, input_size, dtype=dtype)
            grad_output = torch.randn(batch, seq_length, proj_size * num_directions, dtype=dtype)
        else:
            input_val = torch.randn(seq_length, batch, input_size, dtype=dtype)
            grad_output = torch.randn(seq_length, batch, proj_size * num_directions, dtype=dtype)

        hx_val = torch.randn(num_layers * num_directions, batch, proj_size, dtype=dtype)
        cx_val = torch.randn(num_layers * num_directions, batch, hidden_size, dtype=dtype)
        grad_hy = torch.randn(num_layers * num_directions, batch, proj_size, dtype=dtype)
        grad_cy = torch.randn(num_layers * num_directions, batch, hidden_size, dtype=dtype)

        if not contig:
            grad_output = _make_noncontig(grad_output)
            grad_hy = _make_noncontig(grad_hy)
            grad_cy = _make_noncontig(grad_cy)
            hx_val = _make_noncontig(hx_val)
            cx_val = _make_noncontig(cx_val)

        if variable_len:
            lengths = [7, 5, 5, 2, 1, 1]
            if lens_as_tensor:
                lengths = torch.tensor(lengths, dtype=torch.long)
            input_val = rnn_utils.pack_padded_sequence(input_val, lengths, batch_first=batch_first)
            grad_output = rnn_utils.pack_padded_sequence(
                grad_output, lengths, batch_first=batch_first
            ).data

        args = (input_size, hidden_size, num_layers)
        kwargs = dict(
            bias=bias,
            dropout=dropout,
            bidirectional=bidirectional,
            batch_first=batch_first,
            proj_size=proj_size,
        )
        rnn = nn.LSTM(*args, **kwargs).to(dtype)
        outputs_cpu = _forward_backward(
            rnn, input_val, grad_output, rnn.all_weights, hx_val, grad_hy, cx_val, grad_cy
        )

        rnn_gpu = build(impl, "LSTM", *args, **kwargs).to(dtype)
        outputs_gpu = _forward_backward(
            rnn_gpu, input_val, grad_output, rnn.all_weights, hx_val, grad_hy, cx_val, grad_cy
        )
        _compare_cpu_gpu(outputs_cpu, outputs_gpu)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_rnn_fused(impl, kind, bias):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_rnn_fused (onlyCUDA there).

    Adapted: the module "on the device" is the implementation under test, its weights copied
    from the CPU torch.nn module (the original's copy_rnn direction reversed: the reference
    keeps its own); float64 (the original also runs double); module and bias are parameters."""
    dtype = torch.double

    def check_rnn_grads(rnn1, rnn2):
        for x_layer, y_layer in zip(rnn1.all_weights, rnn2.all_weights):
            for x, y in zip(x_layer, y_layer):
                assert_close(x.grad, y.grad, atol=5e-5, rtol=0)

    input_size, hidden_size, num_layers, seq_length, batch = 10, 6, 2, 7, 6
    input_val = torch.randn(seq_length, batch, input_size, dtype=dtype)
    grad_output = torch.randn(seq_length, batch, hidden_size, dtype=dtype)
    hx_val = torch.randn(num_layers, batch, hidden_size, dtype=dtype)
    grad_hy = torch.randn(num_layers, batch, hidden_size, dtype=dtype)
    rnn = getattr(nn, kind)(input_size, hidden_size, num_layers, bias=bias).to(dtype)
    rnn_device = copy_of(impl, rnn)

    is_lstm = kind == "LSTM"
    if is_lstm:
        hx = (hx_val.clone().requires_grad_(True), hx_val.clone().add(1).requires_grad_(True))
        hx_device = (
            hx_val.clone().requires_grad_(True),
            hx_val.clone().add(1).requires_grad_(True),
        )
    else:
        hx = hx_val.clone().requires_grad_(True)
        hx_device = hx_val.clone().requires_grad_(True)

    inp = input_val.clone().requires_grad_(True)
    inp_cu = input_val.clone().requires_grad_(True)
    output1, hy1 = rnn(inp, hx)
    output2, hy2 = rnn_device(inp_cu, hx_device)
    if is_lstm:
        torch.autograd.backward([output1, hy1[0], hy1[1]], [grad_output, grad_hy, grad_hy + 1])
        torch.autograd.backward([output2, hy2[0], hy2[1]], [grad_output, grad_hy, grad_hy + 1])
    else:
        torch.autograd.backward([output1, hy1], [grad_output, grad_hy])
        torch.autograd.backward([output2, hy2], [grad_output, grad_hy])

    assert_close(output1, output2)
    assert_close(hy1, hy2)

    check_rnn_grads(rnn, rnn_device)
    assert_close(inp.grad, inp_cu.grad)
    if is_lstm:
        assert_close(hx[0].grad, hx_device[0].grad)
        assert_close(hx[1].grad, hx_device[1].grad)
    else:
        assert_close(hx.grad, hx_device.grad)


def _maybe_index_tuple(maybe_tuple_of_tensors, index):
    if maybe_tuple_of_tensors is None:
        return None
    if isinstance(maybe_tuple_of_tensors, torch.Tensor):  # the GRU's h0
        return maybe_tuple_of_tensors[:, index : index + 1, :].contiguous()
    return tuple(maybe_tuple_of_tensors[j][:, index : index + 1, :].contiguous() for j in range(2))


VARIABLE_SEQUENCE_TESTS = [
    # enforce_sorted, lengths
    [True, [5]],
    [False, [5]],
    [True, [10, 10, 6, 2, 2, 1, 1]],
    [False, [10, 10, 6, 2, 2, 1, 1]],
    [False, [2, 1, 3, 2, 10, 5, 3]],
]


@pytest.mark.parametrize(
    "kind,proj_size", [("LSTM", 0), ("LSTM", 2), ("GRU", 0)], ids=["LSTM", "LSTM_proj", "GRU"]
)
@pytest.mark.parametrize("enforce_sorted,seq_lens", VARIABLE_SEQUENCE_TESTS)
def test_variable_sequence(request, impl, make, kind, proj_size, enforce_sorted, seq_lens):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_variable_sequence.

    Adapted: float64 (the original runs float32 on CPU), with dtype2prec's float64 precision
    (1e-5) for the parameter gradients too; the lengths case and proj_size are parameters
    (use_default_hiddens loops inside); a GRU case added (the same packed-sequence path)."""
    dtype = torch.double
    prec = 1e-5  # dtype2prec_DONTUSE[torch.double]

    def pad(var, length):
        if var.size(0) == length:
            return var
        return torch.cat([var, var.new_zeros(length - var.size(0), *var.size()[1:])])

    def check_lengths(lengths, enforce_sorted, use_default_hiddens, proj_size):
        input_size = 3
        hidden_size = 4
        num_layers = 2
        bidirectional = True

        max_length = max(lengths)
        x_leaf = torch.randn(max_length, len(lengths), input_size, dtype=dtype, requires_grad=True)
        num_directions = 2 if bidirectional else 1
        extra = dict(proj_size=proj_size) if kind == "LSTM" else {}
        lstm = make(
            kind,
            input_size,
            hidden_size,
            bidirectional=bidirectional,
            num_layers=num_layers,
            **extra,
        ).to(dtype)
        lstm2 = copy.deepcopy(lstm).to(dtype)
        x = x_leaf

        hidden0 = None
        if not use_default_hiddens:
            real_hidden_size = hidden_size if proj_size == 0 else proj_size
            h0 = torch.randn(
                num_directions * num_layers, len(lengths), real_hidden_size, dtype=dtype
            )
            if kind == "LSTM":
                c0 = torch.randn(
                    num_directions * num_layers, len(lengths), hidden_size, dtype=dtype
                )
                hidden0 = (h0, c0)
            else:
                hidden0 = h0

        # Compute sequences separately
        seq_outs = []
        seq_hiddens = []
        for i, l in enumerate(lengths):
            hidden_i = _maybe_index_tuple(hidden0, i)
            out, hid = lstm2(x[:l, i : i + 1], hidden_i)
            out_pad = pad(out, max_length)
            seq_outs.append(out_pad)
            seq_hiddens.append(hid)
        seq_out = torch.cat(seq_outs, 1)
        if kind == "LSTM":
            seq_hidden = tuple(torch.cat(hids, 1) for hids in zip(*seq_hiddens))
        else:
            seq_hidden = torch.cat(seq_hiddens, 1)

        # Use packed format
        packed = rnn_utils.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
        packed_out, packed_hidden = lstm(packed, hidden0)
        unpacked, unpacked_len = rnn_utils.pad_packed_sequence(packed_out)

        # Check forward
        assert_close(packed_hidden, seq_hidden, atol=prec, rtol=0)
        assert_close(unpacked, seq_out, atol=prec, rtol=0)
        assert_close(unpacked_len, torch.tensor(lengths), atol=prec, rtol=0)

        # Check backward
        seq_out.sum().backward()
        grad_x = x_leaf.grad.data.clone()
        x_leaf.grad.data.zero_()
        unpacked.sum().backward()

        assert_close(x_leaf.grad, grad_x, atol=prec, rtol=0)
        for p1, p2 in zip(lstm.parameters(), lstm2.parameters()):
            assert_close(p1.grad, p2.grad, atol=prec, rtol=0)

    for use_default_hiddens in (True, False):
        check_lengths(seq_lens, enforce_sorted, use_default_hiddens, proj_size)


# ---------------------------------------------------------------------------------------------
# TestNN / TestNNDeviceType: autograd
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_rnn_retain_variables(make, kind):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_rnn_retain_variables
    (_test_rnn_retain_variables, dtype double as on CPU there).

    Adapted: the RNN mode dropped; the module is a parameter."""
    dtype = torch.double
    rnn = make(kind, 10, 20, num_layers=2).to(dtype)
    input = torch.randn(5, 6, 10, dtype=dtype, requires_grad=True)
    output = rnn(input)
    output[0].sum().backward(retain_graph=True)
    grads = [input.grad.data.clone()] + [p.grad.data.clone() for p in rnn.parameters()]
    for _ in range(4):
        rnn.zero_grad()
        input.grad.data.zero_()
        output[0].sum().backward(retain_graph=True)
        grads2 = [input.grad.data] + [p.grad.data for p in rnn.parameters()]
        assert_close(grads, grads2)


REENTRANT = (
    "backward is not bitwise reproducible: the first backward of a graph reuses the gates its "
    "forward kept (MGRIT keep_gates=True, the default), a repeated backward recomputes them, "
    "and the input gradients differ by up to 4.4e-16; gradcheck's reentrancy check "
    "(nondet_tol=0.0) fails ('Backward is not reentrant'), where torch's repeated backward is "
    "bitwise equal"
)


@pytest.mark.parametrize("seq_len", [1, 5], ids=["T1", "T5"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_GRU_LSTM_grad_and_gradgrad(request, impl, make, kind, bias, seq_len):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_LSTM_grad_and_gradgrad and
    test_GRU_grad_and_gradgrad (_test_rnn_mod): gradcheck and gradgradcheck of the flattened
    outputs w.r.t. the input, check_batched_grad=False, fast_mode=True (torch's test wrappers'
    default).

    Adapted: the CUDA double-backward error check dropped; bias is a parameter; a 5-step
    sequence added to the original 1-step one (inp (1, 3, 4)) so that MGRIT runs cycles."""
    # not strict: whether the two backward passes agree bitwise rests on rounding (for one
    # seed and CPU the GRU without bias over one step happened to agree)
    xfail_library(request, impl, REENTRANT, strict=False)
    hsize = 4
    inp = torch.rand(seq_len, 3, hsize, dtype=torch.double, requires_grad=True)
    mod = make(kind, hsize, hsize, bias=bias).to(torch.double)

    def flatten_out(mod, inp):
        out = mod(inp)
        return tuple([t if isinstance(t, torch.Tensor) else tt for t in out for tt in t])

    gradcheckfunc = partial(flatten_out, mod)
    assert torch.autograd.gradcheck(gradcheckfunc, inp, check_batched_grad=False, fast_mode=True)
    assert torch.autograd.gradgradcheck(
        gradcheckfunc, inp, check_batched_grad=False, fast_mode=True
    )


def test_LSTM_differentiable_backward_using_oneDNN(impl):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_LSTM_differentiable_backward_using_oneDNN.

    Adapted: the first network is torch.nn.LSTM with oneDNN (mkldnn) disabled, the second the
    implementation under test with its weights (instead of a deepcopy run with oneDNN on);
    float64 (the original runs float32 and bfloat16)."""
    batch = 10
    seq_len = 12
    input = 3
    Net = nn.LSTM(input, 3, 20, batch_first=True)
    Net_clone = copy_of(impl, Net)
    x = torch.rand(batch, seq_len, input)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)

    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        out1, _ = Net(x1)
        der_out1 = torch.autograd.grad(
            out1, x1, grad_outputs=torch.ones_like(out1), retain_graph=True, create_graph=True
        )[0]
        loss1 = der_out1.sum()
        loss1.backward(retain_graph=True)
    finally:
        torch._C._set_mkldnn_enabled(enabled)

    out2, _ = Net_clone(x2)
    der_out2 = torch.autograd.grad(
        out2, x2, grad_outputs=torch.ones_like(out2), retain_graph=True, create_graph=True
    )[0]
    loss2 = der_out2.sum()
    loss2.backward(retain_graph=True)
    assert torch.allclose(der_out1, der_out2)
    assert torch.allclose(x1.grad, x2.grad)


# ---------------------------------------------------------------------------------------------
# TestNN: dropout
# ---------------------------------------------------------------------------------------------


def _one_step(kind: str, s):
    """One step from a zero state of a bias-free layer whose every gate pre-activation is
    ``s`` (all weights equal, as in test_RNN_dropout): the output."""
    s = torch.as_tensor(s, dtype=torch.double)
    if kind == "GRU":  # r = z = sigmoid(s), n = tanh(s + r * 0), h = (1 - z) * n + z * 0
        return (1 - torch.sigmoid(s)) * torch.tanh(s)
    c = torch.sigmoid(s) * torch.tanh(s)  # i * g, f * c0 = 0
    return torch.sigmoid(s) * torch.tanh(c)  # o * tanh(c)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("p", [0, 0.276, 0.731, 1])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_RNN_dropout(make, kind, p, train):
    """test/test_nn.py@74f2fa66 TestNN.test_RNN_dropout (checks that dropout sits between the
    layers).

    Adapted: the original's nn.RNN(10, 1000, 2, bias=False, relu) with all weights 1 sums the
    kept layer-0 outputs exactly (10 each, rescaled by 1 / (1 - p)); here GRU / LSTM (10, 1000,
    2, bias=False) with weight_ih_l0, weight_hh_l0, weight_hh_l1 = 1 and weight_ih_l1 =
    1 / (1000 * y0), y0 layer 0's (equal) output: layer 1's pre-activation is s = k / (1000 *
    (1 - p)) for k kept units, its output g(s). The original's assertions, in these terms:
    output constant; output = g(1) for p == 0 or eval (10000 there); 0 for p == 1; else
    output = g(k / (1000 (1 - p))) for an integer k with 800 < k / (1 - p) < 1200 (there: 8000 <
    output < 12000, output * (1 - p) a multiple of 10); h_n constant per layer, h_n[0] = y0 (10
    there), h_n[1] = output. CPU only; p and train are parameters."""
    rnn = make(kind, 10, 1000, 2, bias=False, dropout=p)
    if train:
        rnn.train()
    else:
        rnn.eval()
    y0 = _one_step(kind, 10.0).item()
    rnn.weight_ih_l0.data.fill_(1)
    rnn.weight_hh_l0.data.fill_(1)
    rnn.weight_ih_l1.data.fill_(1 / (1000 * y0))
    rnn.weight_hh_l1.data.fill_(1)
    input = torch.ones(1, 1, 10)
    hx = torch.zeros(2, 1, 1000)
    if kind == "LSTM":
        hx = (hx, torch.zeros(2, 1, 1000))

    output, hy = rnn(input, hx)
    if kind == "LSTM":
        hy = hy[0]
    assert_close(output.data.min(), output.data.max())
    output_val = output.data[0][0][0]
    if p == 0 or not train:
        assert_close(output_val, _one_step(kind, 1.0))
    elif p == 1:
        assert_close(output_val, torch.tensor(0.0, dtype=torch.double))
    else:
        kept = torch.arange(1001, dtype=torch.double)
        candidates = _one_step(kind, kept / (1000 * (1 - p)))
        k = int((candidates - output_val).abs().argmin())
        assert abs(candidates[k] - output_val) < 1e-10  # k / (1 - p): an integer k kept
        assert 800 < k / (1 - p) < 1200

    assert_close(hy[0].data.min(), hy[0].data.max())
    assert_close(hy[1].data.min(), hy[1].data.max())
    assert_close(hy.data[0][0][0], torch.tensor(y0, dtype=torch.double))
    assert_close(hy.data[1][0][0], output_val)


def _state(kind, *shape, rand=torch.rand):
    h = rand(*shape)
    return (h, rand(*shape)) if kind == "LSTM" else h


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("p", [0, 0.1234])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_RNN_dropout_state(make, kind, p, train):
    """test/test_nn.py@74f2fa66 TestNN.test_RNN_dropout_state (dropout state survives
    torch.save / torch.load).

    Adapted: nn.RNN(100, 100, 2, bias=False, dropout=p, relu) is GRU / LSTM (100, 100, 2,
    bias=False, dropout=p) (the LSTM's hx a pair of rand tensors); CPU only; p and train are
    parameters."""
    rnn = make(kind, 100, 100, 2, bias=False, dropout=p)
    if train:
        rnn.train()
    else:
        rnn.eval()
    input = torch.rand(1, 1, 100)
    hx = _state(kind, 2, 1, 100)

    output1, hy1 = rnn(input, hx)
    output2, hy2 = rnn(input, hx)

    buf = io.BytesIO()
    torch.save(rnn, buf)
    buf.seek(0)
    # weights_only=False as this is legacy code that saves the model
    rnn2 = torch.load(buf, weights_only=False)
    rnn2.flatten_parameters()
    output3, hy3 = rnn2(input, hx)

    if p == 0 or not train:
        assert_close(output1, output2)
        assert_close(output1, output3)
        assert_close(hy1, hy2)
        assert_close(hy1, hy3)
    else:
        assert_not_close(output1, output2)
        assert_not_close(output1, output3)
        assert_not_close(hy1, hy2)
        assert_not_close(hy1, hy3)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_RNN_change_dropout(make, kind, train):
    """test/test_nn.py@74f2fa66 TestNN.test_RNN_change_dropout (assigning rnn.dropout between
    calls).

    Adapted: nn.RNN(100, 100, 2, dropout=0, relu) is GRU / LSTM (100, 100, 2, dropout=0); CPU
    only; float64 (as the original); train is a parameter."""
    rnn = make(kind, 100, 100, 2, dropout=0)
    input = torch.rand(3, 2, 100)
    if train:
        rnn.train()
    else:
        rnn.eval()

    prev_output = None
    for p in (0, 0.5, 0, 0.7, 0.2, 1, 0.2, 0):
        rnn.dropout = p
        output1, hy1 = rnn(input)
        output2, hy2 = rnn(input)

        if p == 0 or p == 1 or not train:
            assert_close(output1, output2)
            assert_close(hy1, hy2)
        else:
            assert_not_close(output1, output2)
            assert_not_close(hy1, hy2)

        if prev_output is not None:
            if not train:
                assert_close(output1.data, prev_output)
                assert_close(output2.data, prev_output)
            else:
                assert_not_close(output1.data, prev_output)
                assert_not_close(output2.data, prev_output)
        prev_output = output1.data


# ---------------------------------------------------------------------------------------------
# TestNN: weights (weight norm, tying, partial flat weights), pickling / __setstate__
# ---------------------------------------------------------------------------------------------


WEIGHT_NORM_CASES = [
    ("LSTM", {}, "weight_ih_l0", 4),
    ("LSTM", {"proj_size": 16}, "weight_hr_l0", 5),
    ("GRU", {}, "weight_ih_l0", 4),
]


@pytest.mark.filterwarnings("ignore:.*weight_norm.* is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "kind,extra,name,num_params", WEIGHT_NORM_CASES, ids=["LSTM", "LSTM_proj", "GRU"]
)
def test_rnn_weight_norm(request, impl, make, kind, extra, name, num_params):
    """test/test_nn.py@74f2fa66 TestNN.test_rnn_weight_norm.

    Adapted: the two LSTM checks are cases; a GRU case added (the same RNNBase path)."""
    l = make(kind, 32, 32, **extra)  # noqa: E741
    # This Module has 4 or 5 parameters called:
    # 'weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0', weight_hr_l0

    # Applying weight norm on one of them causes it to become a tensor
    l = torch.nn.utils.weight_norm(l, name=name)  # noqa: E741
    assert sum(isinstance(p, torch.nn.Parameter) for p in l._flat_weights) == num_params - 1

    # Removing the weight norm reparametrization restores the Parameter
    l = torch.nn.utils.remove_weight_norm(l, name=name)  # noqa: E741
    assert sum(isinstance(p, torch.nn.Parameter) for p in l._flat_weights) == num_params

    # Make sure that, upon removal of the reparametrization, the
    # `._parameters` and `.named_parameters` contain the right params.
    # Specifically, the original weight ('weight_ih_l0') should be placed
    # back in the parameters, while the reparametrization components
    # ('weight_ih_l0_v' and 'weight_ih_l0_g') should be removed.
    assert name in l._parameters
    assert l._parameters[name] is not None
    assert name + "_v" not in l._parameters
    assert name + "_g" not in l._parameters
    assert name in dict(l.named_parameters())
    assert dict(l.named_parameters())[name] is not None
    assert name + "_v" not in dict(l.named_parameters())
    assert name + "_g" not in dict(l.named_parameters())


@pytest.mark.filterwarnings("ignore:.*weight_norm.* is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "kind,extra,name",
    [
        ("LSTM", {}, "weight_hh_l0"),
        ("LSTM", {"proj_size": 3}, "weight_hr_l0"),
        ("GRU", {}, "weight_hh_l0"),
    ],
    ids=["LSTM", "LSTM_proj", "GRU"],
)
def test_RNN_cudnn_weight_norm(request, impl, make, kind, extra, name):
    """test/test_nn.py@74f2fa66 TestNN.test_RNN_cudnn_weight_norm (needs cuDNN there).

    Adapted: the move to CUDA dropped (the weight-normed module runs on the CPU, where the
    expected output was computed); the two LSTM checks are cases; a GRU case added."""
    input_size, hidden_size, num_layers, seq_length, batch = 10, 6, 2, 7, 6
    m = make(kind, input_size, hidden_size, num_layers, **extra)

    input = torch.randn(seq_length, batch, input_size)
    expected_output = m(input)

    # adds weight normalization
    m = torch.nn.utils.weight_norm(m, name=name)
    assert_close(m(input), expected_output)

    # remove weight norm
    m = torch.nn.utils.remove_weight_norm(m, name=name)
    assert_close(m(input), expected_output)


@pytest.mark.parametrize("case", ["LSTM", "LSTM_proj", "GRU"], ids=["LSTM", "LSTM_proj", "GRU"])
def test_cudnn_weight_tying(request, impl, case):
    """test/test_nn.py@74f2fa66 TestNN.test_cudnn_weight_tying (needs cuDNN there): a module
    with bias_ih_l0_reverse tied to bias_ih_l0, one SGD step, then its output before and after
    .cpu() must agree (there: on CUDA and after moving to the CPU).

    Adapted: CPU only, float64; each module is a case; besides the original's assertion, the
    output after the step is compared with torch.nn's (same tied weights, same step) in place of
    the CUDA-vs-CPU comparison."""
    kind = "GRU" if case == "GRU" else "LSTM"
    extra = {"proj_size": 10} if case == "LSTM_proj" else {}
    ref = getattr(nn, kind)(10, 20, batch_first=True, bidirectional=True, **extra)
    rnn = build(impl, kind, 10, 20, batch_first=True, bidirectional=True, **extra)
    rnn.load_state_dict(ref.state_dict())
    input = torch.randn(5, 4, 10)
    hx = torch.randn(2, 5, 20)
    if kind == "LSTM":
        # LSTM with projections has different hx size
        if extra:
            hx = torch.randn(2, 5, 10)
        cx = torch.randn(2, 5, 20)
        hx = (hx, cx)
    outputs = []
    for module in (ref, rnn):
        module.bias_ih_l0_reverse = module.bias_ih_l0
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        opt.zero_grad()
        output = module(input, hx)
        output[0].sum().backward()
        opt.step()
        outputs.append(module(input, hx))
    output_cuda = outputs[1]
    rnn.cpu()
    output_cpu = rnn(input, hx)
    assert_close(output_cuda, output_cpu)
    assert_close(output_cuda, outputs[0])


def test_partial_flat_weights(impl, make):
    """test/test_nn.py@74f2fa66 TestNN.test_partial_flat_weights (needs CUDA there): a module
    moved (_apply) while one weight attribute is deleted, the weight restored afterwards.

    Adapted: .cuda() is .cpu() (the same _apply path); the restored weight is a copy
    (weight_orig.clone(), as .cuda() gave a copy); float64."""
    input_size, hidden_size, num_layers = 10, 6, 2

    m = make("LSTM", input_size, hidden_size, num_layers)
    inp = torch.randn(3, 2, 10)
    out_expected = m(inp)
    # deletes an attribute of original LSTM
    weight_orig = m.weight_hh_l0
    del m.weight_hh_l0
    assert not hasattr(m, "weight_hh_l0")
    # verifies that moving with only some attributes defined does not throw an error
    m.cpu()
    # recompute the weight and make sure that module can be used
    m.weight_hh_l0 = weight_orig.clone()
    assert_close(m(inp)[0], out_expected[0])


def test_save_lstm_compatibility(impl, make):
    """test/test_nn.py@74f2fa66 TestNNDeviceType.test_save_lstm_compatibility (an LSTM pickled
    before PyTorch 1.8, without proj_size, restored by __setstate__).

    Adapted: float64."""
    # Test that saving an LSTM in PyTorch 1.7 and older can still be
    # loaded in newer versions of PyTorch.
    model = make("LSTM", 2, 3)
    x = torch.randn(32, 5, 2)
    expected = model(x)

    # Get a state dict for PyTorch 1.7 LSTM. Before PyTorch 1.8, proj_size
    # didn't exist.
    assert model.proj_size == 0
    state_dict = model.__dict__
    del state_dict["proj_size"]

    # load a model
    loaded_model = make("LSTM", 2, 3)
    loaded_model.__setstate__(state_dict)
    result = loaded_model(x)
    assert_close(result, expected)


# ---------------------------------------------------------------------------------------------
# module_db (common_modules.py): GRU / LSTM inputs, batched and unbatched, with and without h0
# ---------------------------------------------------------------------------------------------


def _no_batch_dim_reference_rnn_gru(m, p, *args, **kwargs):
    """common_modules.py@00131b6b no_batch_dim_reference_rnn_gru (freeze_rng_state dropped:
    no dropout here)."""
    if len(args) == 1:
        (inp,) = args
        h = None
    elif len(args) == 2:
        inp, h = args
        h = h.unsqueeze(1)

    batch_dim = 0 if kwargs["batch_first"] else 1
    kwargs.pop("batch_first")
    inp = inp.unsqueeze(batch_dim)
    single_batch_input_args = (inp, h)
    output = m(*single_batch_input_args, **kwargs)
    return (output[0].squeeze(batch_dim), output[1].squeeze(1))


def _no_batch_dim_reference_lstm(m, p, *args, **kwargs):
    """common_modules.py@00131b6b no_batch_dim_reference_lstm (freeze_rng_state dropped)."""
    if len(args) == 1:
        (inp,) = args
        h = None
    elif len(args) == 2:
        inp, h = args
        h = (h[0].unsqueeze(1), h[1].unsqueeze(1))

    batch_dim = 0 if kwargs["batch_first"] else 1
    kwargs.pop("batch_first")
    inp = inp.unsqueeze(batch_dim)
    single_batch_input_args = (inp, h)
    output = m(*single_batch_input_args, **kwargs)
    return (output[0].squeeze(batch_dim), (output[1][0].squeeze(1), output[1][1].squeeze(1)))


def _module_db_samples(kind: str):
    """(constructor kwargs, forward-input shapes) of common_modules.py@00131b6b
    module_inputs_torch_nn_RNN_GRU (is_rnn=False, no packed sequences: module_db's GRU entry)
    and module_inputs_torch_nn_LSTM; the tensors are made in the test (make_tensor, float64,
    requires_grad)."""
    samples = []
    if kind == "GRU":
        for b, b_f, bidir in itertools.product((False, True), repeat=3):
            cons_args = {
                "input_size": 2,
                "hidden_size": 2,
                "num_layers": 2,
                "batch_first": b_f,
                "bias": b,
                "bidirectional": bidir,
            }
            cons_args_hidden = dict(cons_args, hidden_size=3)
            samples.append((cons_args, ((3, 2),)))
            samples.append((cons_args_hidden, ((3, 2), (4 if bidir else 2, 3))))
    else:
        for b, b_f, bidir, proj_size in itertools.product(
            (False, True), (False, True), (False, True), (0, 2)
        ):
            hidden_size = 3
            cons_args = {
                "input_size": 2,
                "hidden_size": hidden_size,
                "num_layers": 2,
                "proj_size": proj_size,
                "batch_first": b_f,
                "bias": b,
                "bidirectional": bidir,
            }
            samples.append((cons_args, ((2, 2),)))
            h_out = proj_size if proj_size > 0 else hidden_size
            d = 4 if bidir else 2
            samples.append((dict(cons_args), ((3, 2), ((d, h_out), (d, hidden_size)))))
    return samples


def _sample_id(sample):
    cons, shapes = sample
    flags = [k for k in ("bias", "batch_first", "bidirectional") if cons[k]]
    if cons.get("proj_size"):
        flags.append(f"proj{cons['proj_size']}")
    return "-".join([f"H{cons['hidden_size']}"] + flags + ["h0" if len(shapes) > 1 else "no_h0"])


def _make_inputs(shapes):
    make_input = partial(make_tensor, device="cpu", dtype=torch.double, requires_grad=True)
    inputs = []
    for shape in shapes:
        if isinstance(shape[0], tuple):  # the LSTM's (h0, c0)
            inputs.append(tuple(make_input(s) for s in shape))
        else:
            inputs.append(make_input(shape))
    return inputs


MODULE_DB = [("GRU", s) for s in _module_db_samples("GRU")] + [
    ("LSTM", s) for s in _module_db_samples("LSTM")
]


@pytest.mark.parametrize(
    "kind,sample", MODULE_DB, ids=[f"{k}-{_sample_id(s)}" for k, s in MODULE_DB]
)
def test_module_db_forward(request, impl, make, kind, sample):
    """torch/testing/_internal/common_modules.py@00131b6b module_inputs_torch_nn_RNN_GRU
    (is_rnn=False) and module_inputs_torch_nn_LSTM (the inputs of module_db's GRU and LSTM
    entries: unbatched inputs, with and without h0), as test/test_modules.py's test_forward runs
    them: the module's output equals its reference_fn's (the same module on the input
    unsqueezed to a batch of one).

    Adapted: float64 only; train mode only (the modules have no dropout)."""
    cons, shapes = sample
    m = make(kind, **cons)
    args = _make_inputs(shapes)
    reference_fn = (
        _no_batch_dim_reference_lstm if kind == "LSTM" else _no_batch_dim_reference_rnn_gru
    )
    outputs = m(*args)
    ref_outputs = reference_fn(m, list(m.parameters()), *args, batch_first=cons["batch_first"])
    assert_close(outputs, ref_outputs)


@pytest.mark.parametrize(
    "kind,sample", MODULE_DB, ids=[f"{k}-{_sample_id(s)}" for k, s in MODULE_DB]
)
def test_module_db_vs_torch(request, impl, kind, sample):
    """torch/testing/_internal/common_modules.py@00131b6b module_inputs_torch_nn_RNN_GRU
    (is_rnn=False) and module_inputs_torch_nn_LSTM inputs, compared with torch.nn (the
    cpu-vs-reference analogue of test_modules.py's test_cpu_gpu_parity: outputs, then the
    gradients of the input, h0 and every parameter under the same random output weights).

    Adapted: the comparison is with torch.nn.<kind> holding the same weights (float64)."""
    cons, shapes = sample
    ref = getattr(nn, kind)(**cons)
    mod = copy_of(impl, ref)
    inputs = _make_inputs(shapes)
    results = []
    for module in (ref, mod):
        args = [
            tuple(t.detach().clone().requires_grad_() for t in a)
            if isinstance(a, tuple)
            else a.detach().clone().requires_grad_()
            for a in inputs
        ]
        torch.manual_seed(1)
        out = module(*args)
        flat = [out[0]] + (list(out[1]) if kind == "LSTM" else [out[1]])
        loss = sum((t * torch.randn_like(t)).sum() for t in flat)
        leaves = [t for a in args for t in (a if isinstance(a, tuple) else (a,))]
        grads = torch.autograd.grad(loss, leaves + list(module.parameters()))
        results.append(([t.detach() for t in flat], list(grads)))
    assert_close(results[1][0], results[0][0])
    assert_close(results[1][1], results[0][1])
