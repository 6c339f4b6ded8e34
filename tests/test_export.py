"""Deployment and the call's edges as torch's (issue 39): under torch.jit.trace, torch.export
and ONNX export the layers are torch's own RNN ops (the exported graph is torch.nn's, its
numbers equal); what has no torch counterpart is refused in one line. Also: NaN in the
padding past ``lengths=`` is not read, autocast returns torch's dtypes, and the repr is
torch's plus the solver's short name. Ground truth: torch.nn.GRU / torch.nn.LSTM."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import mgrit_gru

# (kind, num_layers, bidirectional, batch_first, proj_size, h0 given)
CONFIGS = [
    ("GRU", 1, False, False, 0, False),
    ("GRU", 2, True, True, 0, True),
    ("LSTM", 1, False, True, 0, True),
    ("LSTM", 2, True, False, 0, False),
    ("LSTM", 2, True, True, 2, True),
]
IDS = ["-".join(str(v) for v in c) for c in CONFIGS]
I, H, T, B = 3, 5, 6, 3


def _module(kind, layers, bidirectional, batch_first, proj, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    cls = getattr(mgrit_gru, kind)
    extra = {"proj_size": proj} if proj else {}
    return cls(
        I, H, layers, batch_first=batch_first, bidirectional=bidirectional, dtype=dtype,
        **extra, **kw,
    )  # fmt: skip


def _inputs(module, with_h0, seed, dtype=torch.float64):
    """An input and its initial state (None, h0, or the LSTM's (h0, c0)) for ``module``."""
    g = torch.Generator().manual_seed(seed)
    shape = (B, T, I) if module.batch_first else (T, B, I)
    x = torch.randn(shape, generator=g, dtype=dtype)
    if not with_h0:
        return x, None
    rows = (2 if module.bidirectional else 1) * module.num_layers
    h0 = torch.randn(rows, B, module.proj_size or H, generator=g, dtype=dtype)
    if module.mode == "GRU":
        return x, h0
    return x, (h0, torch.randn(rows, B, H, generator=g, dtype=dtype))


class Model(torch.nn.Module):
    """A model holding the layer; its outputs flattened to tensors (y, h_n[, c_n])."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, hx=None):
        y, h = self.rnn(x, hx)
        return (y, h) if isinstance(h, torch.Tensor) else (y, *h)


class Padded(torch.nn.Module):
    """The layer called with ``lengths=``."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, lengths):
        y, h = self.rnn(x, lengths=lengths)
        return (y, h) if isinstance(h, torch.Tensor) else (y, *h)


class Packing(torch.nn.Module):
    """The layer called on a PackedSequence the model packs itself."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, lengths):
        first = self.rnn.batch_first
        packed = pack_padded_sequence(x, lengths, batch_first=first, enforce_sorted=False)
        y, h = self.rnn(packed)
        y, _ = pad_packed_sequence(y, batch_first=first, total_length=x.shape[int(first)])
        return (y, h) if isinstance(h, torch.Tensor) else (y, *h)


def _close(got, want, tol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a - b).abs().max() <= tol


def _ops(graph_text: str, kind: str) -> bool:
    return f"aten::{kind.lower()}" in graph_text or f"aten.{kind.lower()}" in graph_text


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_trace_is_torchs_graph_with_torchs_numbers(config):
    """torch.jit.trace (with its check that two traces agree) records torch's RNN op; the
    trace run on another input equals torch.nn's module."""
    kind, layers, bidirectional, batch_first, proj, with_h0 = config
    ours = _module(kind, layers, bidirectional, batch_first, proj)
    ref = Model(ours.to_torch())
    x, hx = _inputs(ours, with_h0, 1)
    args = (x,) if hx is None else (x, hx)
    traced = torch.jit.trace(Model(ours), args)
    assert _ops(str(traced.inlined_graph), kind)
    x2, hx2 = _inputs(ours, with_h0, 2)
    args2 = (x2,) if hx2 is None else (x2, hx2)
    _close(traced(*args2), ref(*args2), 1e-12)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_torch_export_is_torchs_graph_with_torchs_numbers(config):
    """torch.export.export (no data-dependent guard from the input checks) records torch's
    RNN op; the exported program run on another input equals torch.nn's module."""
    kind, layers, bidirectional, batch_first, proj, with_h0 = config
    ours = _module(kind, layers, bidirectional, batch_first, proj)
    ref = Model(ours.to_torch())
    x, hx = _inputs(ours, with_h0, 1)
    args = (x,) if hx is None else (x, hx)
    program = torch.export.export(Model(ours), args)
    assert _ops(str(program.graph), kind)
    x2, hx2 = _inputs(ours, with_h0, 2)
    args2 = (x2,) if hx2 is None else (x2, hx2)
    _close(program.module()(*args2), ref(*args2), 1e-12)


def test_strict_torch_export_and_unbatched_trace():
    """torch.export with strict=True (TorchDynamo) and a trace of unbatched input."""
    ours = _module("LSTM", 2, True, False, 2)
    ref = Model(ours.to_torch())
    x = torch.randn(T, I, dtype=torch.float64)
    program = torch.export.export(Model(ours), (x,), strict=True)
    _close(program.module()(x), ref(x), 1e-12)
    traced = torch.jit.trace(Model(ours), (x,))
    _close(traced(x + 1), ref(x + 1), 1e-12)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize("wrapper", [Padded, Packing], ids=["lengths", "packed"])
def test_trace_of_lengths_and_packed_input(kind, wrapper):
    """lengths= is traced as packing the padded input (as a PackedSequence the model packs
    itself): the trace, run on other lengths, equals torch.nn's module on the packed input."""
    ours = _module(kind, 2, True, True, 0)
    x, _ = _inputs(ours, False, 1)
    with warnings.catch_warnings():  # torch's TracerWarnings about packing
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(wrapper(ours), (x, torch.tensor([T, 2, 4])))
    x2, _ = _inputs(ours, False, 2)
    lengths = torch.tensor([3, T, 1])
    _close(traced(x2, lengths), Packing(ours.to_torch())(x2, lengths), 1e-12)


def test_torch_export_of_lengths_is_refused_in_one_line():
    """torch.export cannot record packing (torch.nn's fails on a PackedSequence too): the
    layers' lengths= says so and what to do."""
    ours = _module("GRU", 1, False, False, 0)
    x, _ = _inputs(ours, False, 1)
    with pytest.raises(RuntimeError, match=r"torch.export cannot record lengths=.*torch.jit"):
        torch.export.export(Padded(ours), (x, torch.tensor([T, 2, 4])))


@pytest.mark.parametrize("how", ["trace", "export"])
def test_implicit_cell_is_refused_in_one_line(how):
    """The implicit cell has no torch op: tracing or exporting it fails in one line."""
    ours = _module("GRU", 1, False, False, 0, cell="implicit")
    x, _ = _inputs(ours, False, 1)
    with pytest.raises(RuntimeError, match=r"^GRU: torch.* has no implicit cell: run") as info:
        if how == "trace":
            torch.jit.trace(Model(ours), (x,))
        else:
            torch.export.export(Model(ours), (x,))
    assert "\n" not in str(info.value)


def test_compiled_model_still_solves_with_the_library():
    """torch.compile is not export: the layer still runs (eagerly) through the library's
    solve, which records its stats."""
    ours = _module("GRU", 1, False, False, 0, solver="serial")
    x, _ = _inputs(ours, False, 1)
    ours.last_stats = None
    y = torch.compile(Model(ours), backend="eager")(x)
    assert ours.last_stats is not None and len(ours.last_stats.forward) == 1
    _close(y, Model(ours.to_torch())(x), 1e-12)


def _onnx_run(model, args, path, dynamo):
    ort = pytest.importorskip("onnxruntime")
    names = [f"in{i}" for i in range(len(_flat(args)))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), input_names=names, dynamo=dynamo)
    session = ort.InferenceSession(str(path))
    return lambda *a: [
        torch.from_numpy(o) for o in session.run(None, {n: t.numpy() for n, t in zip(names, a)})
    ]


def _flat(args):
    out = []
    for a in args:
        out.extend(a if isinstance(a, tuple) else [a])
    return tuple(out)


@pytest.mark.parametrize("config", [c for c in CONFIGS if not c[4]], ids=IDS[:-1])
def test_onnx_export_runs_as_torch(config, tmp_path):
    """torch.onnx.export (TorchScript-based, dynamo=False): the ONNX model, run by
    onnxruntime on another input, equals torch.nn's module (float32)."""
    pytest.importorskip("onnx")
    kind, layers, bidirectional, batch_first, proj, with_h0 = config
    ours = _module(kind, layers, bidirectional, batch_first, proj, dtype=torch.float32)
    ref = Model(ours.to_torch())
    x, hx = _inputs(ours, with_h0, 1, torch.float32)
    args = (x,) if hx is None else (x, hx)
    run = _onnx_run(Model(ours), args, tmp_path / "m.onnx", dynamo=False)
    x2, hx2 = _inputs(ours, with_h0, 2, torch.float32)
    args2 = (x2,) if hx2 is None else (x2, hx2)
    with torch.no_grad():
        _close(run(*_flat(args2)), ref(*args2), 1e-5)


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_onnx_dynamo_export_runs_as_torch(kind, tmp_path):
    """torch.onnx.export's default (dynamo=True, on torch.export) likewise."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    ours = _module(kind, 2, True, True, 0, dtype=torch.float32)
    x, hx = _inputs(ours, True, 1, torch.float32)
    run = _onnx_run(Model(ours), (x, hx), tmp_path / "m.onnx", dynamo=True)
    with torch.no_grad():
        _close(run(*_flat((x, hx))), Model(ours.to_torch())(x, hx), 1e-5)


def test_onnx_export_of_lengths(tmp_path):
    """lengths= in ONNX (dynamo=False): packing, with the lengths an input of the model."""
    pytest.importorskip("onnx")
    ours = _module("GRU", 2, True, False, 0, dtype=torch.float32)
    x, _ = _inputs(ours, False, 1, torch.float32)
    run = _onnx_run(Padded(ours), (x, torch.tensor([T, 2, 4])), tmp_path / "m.onnx", False)
    lengths = torch.tensor([3, T, 1])
    with torch.no_grad():
        _close(run(x, lengths), Packing(ours.to_torch())(x, lengths), 1e-5)


def test_onnx_export_of_projections_is_refused_in_one_line(tmp_path):
    """ONNX has no LSTM with projections (torch.nn.LSTM(proj_size=...) fails to export):
    one line saying how to deploy it instead."""
    ours = _module("LSTM", 1, False, False, 2, dtype=torch.float32)
    x, _ = _inputs(ours, False, 1, torch.float32)
    with pytest.raises(RuntimeError, match=r"ONNX has no LSTM with projections.*torch.export"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Model(ours), (x,), str(tmp_path / "m.onnx"), dynamo=False)


# NaN as padding (issue 39, item 4)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_nan_in_the_padding_is_not_read(config, solver):
    """NaN and Inf past each sequence's length: outputs, final states and gradients as
    torch.nn's on the packed input (whose padding is never read); no NaN in any gradient."""
    kind, layers, bidirectional, batch_first, proj, with_h0 = config
    opts = "serial" if solver == "serial" else mgrit_gru.MGRIT(cfactor=2, tol=1e-13)
    ours = _module(kind, layers, bidirectional, batch_first, proj, solver=opts)
    x, hx = _inputs(ours, with_h0, 1)
    lengths = torch.tensor([T, 2, 4])
    dirty = x.clone()
    steps = (
        (lambda b, s: (b, slice(s, None))) if batch_first else (lambda b, s: (slice(s, None), b))
    )
    dirty[steps(1, 2)] = float("nan")
    dirty[steps(2, 4)] = float("inf")
    dirty.requires_grad_()
    got = _flat(ours(dirty, hx, lengths=lengths))
    sum(t.sum() for t in got).backward()
    assert torch.isfinite(dirty.grad).all()
    packed = pack_padded_sequence(x, lengths, batch_first, enforce_sorted=False)
    y, h = ours.to_torch()(packed, hx)
    want = _flat((pad_packed_sequence(y, batch_first, total_length=T)[0], h))
    _close([t.detach() for t in got], [t.detach() for t in want], 1e-10)


@pytest.mark.parametrize("batch_first", [False, True])
def test_nan_within_the_lengths_is_refused_where_it_is(batch_first):
    """NaN in a real step is refused, naming the first such step and sequence; without
    lengths= the message says that padding would be allowed with it."""
    ours = _module("GRU", 1, False, batch_first, 0)
    x, _ = _inputs(ours, False, 1)
    where = (2, 1) if batch_first else (1, 2)  # step 1 of sequence 2
    x[where] = float("nan")
    with pytest.raises(
        ValueError, match=r"input contains NaN or Inf within the sequences' lengths \(first "
        r"at step 1 of sequence 2\)"
    ):  # fmt: skip
        ours(x, lengths=torch.tensor([T, T, 3]))
    with pytest.raises(ValueError, match=r"NaN or Inf \(first at step 1 of sequence 2\); if "
                       r"that is padding, pass lengths="):  # fmt: skip
        ours(x)
    ours(x, lengths=torch.tensor([T, T, 1]))  # past sequence 2's length: not read


# autocast (issue 39, item 5)


def _torch_dtypes(module, x, hx, lengths):
    """The dtypes torch.nn's module returns, or None where torch's op fails to run on this
    machine (oneDNN's LSTM without bf16 support)."""
    ref = module.to_torch()
    if lengths is not None:
        x = pack_padded_sequence(x, lengths, module.batch_first, enforce_sorted=False)
    try:
        y, h = ref(x, hx)
    except RuntimeError:
        return None
    y = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
    return [y.dtype] + ([h.dtype] if isinstance(h, torch.Tensor) else [t.dtype for t in h])


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("padded", [None, [T, 2, 4], [T - 1] * B], ids=["dense", "ragged", "equal"])
def test_autocast_returns_torchs_dtypes(config, input_dtype, padded):
    """Under torch.autocast("cpu", bf16) every output comes in the dtype torch.nn's module
    returns there (bf16 for the LSTM, as its oneDNN op is autocast; where that op cannot run
    on this CPU, the autocast dtype it would return); the numbers are the float32 solve's."""
    kind, layers, bidirectional, batch_first, proj, with_h0 = config
    ours = _module(kind, layers, bidirectional, batch_first, proj, dtype=torch.float32)
    x, hx = _inputs(ours, with_h0, 1, torch.float32)
    x = x.to(input_dtype)
    lengths = None if padded is None else torch.tensor(padded)
    exact = ours(x.float(), hx, lengths=lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x, hx, lengths=lengths)
        want = _torch_dtypes(ours, x, hx, lengths) or [torch.bfloat16] * len(_flat(got))
    assert [t.dtype for t in _flat(got)] == want
    for a, b in zip(_flat(got), _flat(exact)):
        assert torch.equal(a, b.to(a.dtype))


def test_autocast_lstm_is_bfloat16():
    """The issue's case: mgrit_gru.LSTM under CPU bf16 autocast returns bf16, as torch's."""
    lstm = mgrit_gru.LSTM(3, 4, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (h, c) = lstm(torch.randn(5, 2, 3, dtype=torch.float32))
    assert y.dtype == h.dtype == c.dtype == torch.bfloat16


# repr (issue 39, item 7)


@pytest.mark.parametrize(
    "make,text",
    [
        (lambda: mgrit_gru.GRU(3, 8), "GRU(3, 8, solver='auto')"),
        (
            lambda: mgrit_gru.GRU(3, 8, 2, batch_first=True, solver="serial"),
            "GRU(3, 8, num_layers=2, batch_first=True, solver='serial')",
        ),
        (
            lambda: mgrit_gru.GRU(3, 8, cell="implicit", solver="mgrit"),
            "GRU(3, 8, cell='implicit', solver='mgrit')",
        ),
        (
            lambda: mgrit_gru.LSTM(3, 8, proj_size=2, solver=mgrit_gru.MGRIT(cfactor=8)),
            "LSTM(3, 8, proj_size=2, solver=MGRIT(cfactor=8))",
        ),
        (
            lambda: mgrit_gru.LSTM(3, 8, solver=mgrit_gru.Auto(max_wait=8)),
            "LSTM(3, 8, solver=Auto(max_wait=8))",
        ),
    ],
)
def test_repr_is_torchs_plus_the_solver(make, text):
    module = make()
    assert repr(module) == text
    if "implicit" not in text:
        assert repr(module).startswith(repr(module.to_torch())[:-1])
