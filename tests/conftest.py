"""Shared fixtures: float64 by default, GRU pairs (torch.nn.GRU, mgrit_gru.GRU), comparisons."""

from __future__ import annotations

import os

import pytest
import torch

# Without a GPU the Triton kernels run on the CPU through Triton's interpreter in the tests
# (tests/test_triton.py): it must be on before triton is imported (torch does not import it).
# With one, tests/test_cuda.py runs them compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mgrit_gru

# The cost model's built-in table, whatever this machine has calibrated (mgrit-gru calibrate):
# decisions under test are the same on every machine. Subprocesses inherit it.
os.environ["MGRIT_GRU_CALIBRATION"] = "builtin"
# ... priced at one thread, whatever this machine's core count (tests that mean the thread
# count's effect set it themselves).
os.environ["MGRIT_GRU_COST_THREADS"] = "1"
# test.sh runs the suite in two worker processes (pytest-xdist) on a machine's cores: each
# worker and what it starts runs one thread (two workers of two threads on two cores would
# wait at every parallel region for a thread the other holds); tests about threads set them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _float64_and_seed():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


def make_ref(
    input_size=3,
    hidden=5,
    layers=1,
    bidirectional=False,
    batch_first=False,
    zbias=0.0,
    bias=True,
    dtype=torch.float64,
):
    """A torch.nn.GRU; ``zbias`` raises every z-gate bias (long memory)."""
    ref = torch.nn.GRU(
        input_size,
        hidden,
        layers,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
        dtype=dtype,
    )
    if zbias and bias:
        with torch.no_grad():
            for name, p in ref.named_parameters():
                if name.startswith("bias_hh"):
                    p[hidden : 2 * hidden] += zbias
    return ref


def grads_of(module, x, h0, y_weight, h_weight):
    """y and h_n of ``module(x, h0)`` and the gradients of a random linear loss w.r.t. x, h0 and
    every parameter."""
    x = x.detach().clone().requires_grad_()
    h0 = None if h0 is None else h0.detach().clone().requires_grad_()
    y, hn = module(x, h0)
    loss = (y * y_weight).sum() + (hn * h_weight).sum()
    inputs = [x] + ([h0] if h0 is not None else []) + list(module.parameters())
    return y.detach(), hn.detach(), torch.autograd.grad(loss, inputs)


def max_errors(ref, ours, x, h0=None):
    """(y error, h_n error, worst gradient error), each a max abs difference."""
    with torch.no_grad():
        y, hn = ref(x, h0)
    wy, wh = torch.randn_like(y), torch.randn_like(hn)
    y_r, h_r, g_r = grads_of(ref, x, h0, wy, wh)
    y_o, h_o, g_o = grads_of(ours, x, h0, wy, wh)
    grad_err = max((a - b).abs().max().item() for a, b in zip(g_r, g_o))
    return (y_r - y_o).abs().max().item(), (h_r - h_o).abs().max().item(), grad_err


def tight(**kw):
    """MGRIT iterated to round-off: no guard, so that any cycle count is seen through."""
    base = dict(tol=1e-13, max_iters=400, guard=mgrit_gru.Guard(patience=400, cost=False))
    base.update(kw)
    return mgrit_gru.MGRIT(**base)


# A training run small enough for the app's tests: 48 sequences of 40 steps, 3 batches, with
# MGRIT on every call (the automatic choice would solve such short sequences serially).
APP_SMALL = dict(
    solver="mgrit",
    dataset="adding",
    length=40,
    max_train=48,
    max_test=24,
    hidden=8,
    batch_size=16,
    epochs=2,
    cfactor=4,
    threads=1,
)


def flags(cfg: dict) -> list[str]:
    """A config dict as command-line flags."""
    return [x for k, v in cfg.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.fixture
def f32():
    """The training application trains in float32."""
    torch.set_default_dtype(torch.float32)
