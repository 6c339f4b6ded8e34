"""The LSTM with projections (``torch.nn.LSTM(proj_size=P)``) as a plain LSTM problem.

torch's projected LSTM carries ``h`` of ``P < H`` values::

    a_t = W_ih x_t + b + W_hh h_{t-1}          (W_hh: 4H x P)
    c_t = f c_{t-1} + i g,    h_t = W_hr (o * tanh(c_t))     (W_hr: P x H)

With ``m_t = o * tanh(c_t)`` (H values, ``h_t = W_hr m_t``) the recurrence reads ``a_t =
W_ih x_t + b + (W_hh W_hr) m_{t-1}``: the plain LSTM on the state ``[m, c]`` with the
recurrent weight ``W_hh W_hr`` (4H x H). So the layer solve, its kernels, its coarse
corrections (the frozen-gate factor is still ``[0, f]``: ``m'`` depends on ``c'`` and the
gates alone), its stopping tests, its adjoint and time-parallel ranks run unchanged on that
problem, and the outputs are projected afterwards in one GEMM for all steps. Autograd takes
the gradients of ``W_hh`` and ``W_hr`` through the product and the projection.

The initial ``h0`` has no ``m0`` (``W_hr`` has no inverse): its only effect is the term
``W_hh h0`` in the gates of each sequence's first real step. Where every sequence starts at
the slice's first step (one process, forward, or reverse without lengths) that step is taken
here in plain autograd code (the cell's reference step) and the solve starts from its
``[m_1, c_1]``. Elsewhere (reverse with lengths, time-parallel ranks) the term enters through
the input: the layer sees ``x' = [x, e h0]`` and ``W_ih' = [W_ih, W_hh]``, where ``e`` is 1 at
each sequence's first real step in this direction (time 0 forward; its last step in reverse)
and 0 elsewhere, and starts from ``m0 = 0``. Where ``h0`` is zero and needs no gradient (no
``hx``, the usual case) neither is needed.

Costs against torch's kernel: the recurrent product is ``4H x H`` per step where torch's is
``4H x P`` plus the ``P x H`` projection (``4H^2`` against ``5HP`` multiply-adds: 1.6x at
``P = H / 2``); the outputs' projection is one GEMM after the solve; an ``h0`` entering
through the input adds ``P`` columns to the input GEMM (1.14x a training step at T = 4096,
B = 4 and at T = 1024, B = 32 when it always did; with the first step taken apart 0.99-1.03x:
``python benchmarks/lstm_proj_h0.py``, AMD EPYC).

The stopping tests judge the residual of ``[m, c]``, the state the recurrence carries (``h``
is a fixed linear map of ``m``, not a state of its own): ``m`` lies in (-1, 1) as an
unprojected LSTM's ``h`` does, so a tolerance means what it means there; the outputs' error is
``W_hr`` times ``m``'s, and as the test is relative the size of ``W_hr`` cancels (only a
``W_hr`` that amplifies the error's directions more than ``m``'s would separate them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional, Union

import torch
from torch import Tensor

from .cell import reference_layer

FIRST_STEP = "first step"  # solve_projected's h0_entry: every sequence starts at step 0


def first_steps(
    T: int, t0: int, steps: int, lengths: Optional[Tensor], reverse: bool, like: Tensor
) -> Tensor:
    """``e`` ``(T, B)``: 1 at each sequence's first real step among this slice's ``T`` steps
    (global times ``t0 .. t0 + T - 1`` of ``steps``) in this direction's order, else 0.
    Forward it is global time 0; in reverse a sequence starts at its last step (``lengths``
    ``(B,)``, None: all ``steps`` long), and the slice is flipped in time."""
    ends = (lengths if lengths is not None else torch.full((like.shape[1],), steps)) - 1
    first = torch.zeros_like(ends) if not reverse else ends
    local = first - t0
    if reverse:
        local = T - 1 - local
    t = torch.arange(T).unsqueeze(1)
    return (t == local.unsqueeze(0)).to(device=like.device, dtype=like.dtype)


def needs_h0(h0: Tensor, always: bool) -> bool:
    """Whether ``h0`` must enter the solve: it is nonzero or needs a gradient (``always``:
    under a transform, which cannot branch on values)."""
    return always or h0.requires_grad or bool(h0.any())


def solve_projected(
    solve: Callable[..., tuple[Tensor, Tensor]],
    x: Tensor,
    u0: Tensor,
    weights: tuple,
    w_hr: Tensor,
    h0_entry: Union[None, str, Callable[[], Tensor]],
    summed: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """One projected layer and direction: its outputs ``h`` ``(T, B, P)`` and final state
    ``[h_n, c_n]`` ``(B, P + H)``, from ``x`` ``(T, B, I)`` and ``u0 = [h0, c0]`` ``(B, P +
    H)``. ``solve(x, u0, w_ih, w_hh, b_ih, b_hh, rest=False)`` solves a plain LSTM layer
    (states ``(T, B, 2H)``, last state ``(B, 2H)``; ``rest``: the steps after the first).
    ``h0_entry``, how ``h0`` enters: None (left out: :func:`needs_h0`), ``FIRST_STEP`` (every
    sequence starts at step 0, taken here in plain autograd code; ``T > 1``), or a callable
    giving :func:`first_steps` (through the input). ``summed``: the identity, whose gradient
    is summed over a time group's ranks (:class:`SummedGradient`: what a rank computes
    outside the solve, the projection, sees only its own steps)."""
    w_ih, w_hh, b_ih, b_hh = weights
    P, H = w_hr.shape
    h0, c0 = u0[..., :P], u0[..., P:]
    w_out = summed(w_hr)
    if h0_entry == FIRST_STEP:  # torch's step from [h0, c0]: W_hh's width is h0's, P
        _, u1 = reference_layer(x[:1], u0, w_ih, w_hh, b_ih, b_hh)
        states, last = solve(x[1:], u1, w_ih, w_hh @ w_hr, b_ih, b_hh, rest=True)
        y = torch.cat([(u1[..., :H] @ w_out.t()).unsqueeze(0), states[..., :H] @ w_out.t()])
    else:
        if h0_entry is not None:
            x = torch.cat([x, h0_entry().unsqueeze(-1) * summed(h0)], dim=-1)
            w_ih = torch.cat([w_ih, w_hh], dim=1)
        start = torch.cat([c0.new_zeros(c0.shape), c0], dim=-1)
        states, last = solve(x, start, w_ih, w_hh @ w_hr, b_ih, b_hh)
        y = torch.matmul(states[..., :H], w_out.t())
    return y, torch.cat([last[..., :H] @ w_out.t(), last[..., H:]], dim=-1)


class SummedGradient(torch.autograd.Function):
    """Identity forward; the gradient summed over a time group's ranks (``comm.sum_``)."""

    @staticmethod
    def forward(ctx, t: Tensor, comm) -> Tensor:
        ctx.comm = comm
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return ctx.comm.sum_(grad.clone(memory_format=torch.contiguous_format)), None
