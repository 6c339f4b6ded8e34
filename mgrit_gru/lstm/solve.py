"""One LSTM layer as MGRIT problems on the core: the forward recurrence on ``u = [h, c]`` and
its adjoint, with the frozen-gate (or secant) chunk maps as coarse corrections.

The frozen-gate map of a step is diagonal in ``c`` (``c' = f c + i g``) and carries no ``h``
(with the gates held, ``h'`` depends on ``c'`` alone): the per-step factor is ``[0, f]``, and
a chunk's is its product. The adjoint's is the same ``[0, f]`` (``lam_c = f s``). Padding steps
(the grid's whole chunks past ``T``) are identity steps with factor 1.

``mgrit_gru.LSTM`` (:mod:`mgrit_gru.lstm.module`) runs each layer and direction through
them; they are tested against torch.nn.LSTM and autograd.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..core import build_grids, chunk_view, flat_points, pad_steps, solve
from ..core.stopping import StopTest
from ..layer.solve import chunk_map_ops
from ..options import MGRIT
from . import cell


class ForwardStep:
    """Level-0 propagator: LSTM steps with input gates ``(M, B, 4H)`` and step sizes ``(M,)``
    in {0, 1}; records each step's frozen-gate factor for :meth:`chunk_factors`."""

    level = 0

    def __init__(self, grid, gates: Tensor, dt: Tensor, w_hh: Tensor) -> None:
        self.gx = chunk_view(gates, grid)
        self.dt = chunk_view(dt, grid).reshape(grid.m, grid.n, 1, 1)
        self.w_hh = w_hh
        self.factors = chunk_view(
            gates.new_ones(gates.shape[0], gates.shape[1], 2 * w_hh.shape[1]), grid
        )

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        gx = self.gx if j is None else self.gx[j]
        dt = self.dt if j is None else self.dt[j]
        H = self.w_hh.shape[1]
        i, f, g, o = cell.gates(u, gx, self.w_hh)
        c_new = f * u[..., H:] + i * g
        new = torch.where(dt > 0, torch.cat([o * torch.tanh(c_new), c_new], -1), u)
        factor = torch.where(dt > 0, torch.cat([torch.zeros_like(f), f], -1), 1.0)
        if j is None:
            self.factors.copy_(factor)
        else:
            self.factors[j] = factor
        return new if out is None else out.copy_(new)

    def chunk_factors(self) -> Tensor:
        return self.factors.prod(0)


class AdjointStep:
    """Level-0 propagator of the adjoint: ``J^T`` of the steps, reversed in time."""

    level = 0

    def __init__(self, grid, coeffs: Tensor, dt: Tensor, w_hh: Tensor) -> None:
        self.coeffs = chunk_view(coeffs, grid)
        self.dt = chunk_view(dt, grid).reshape(grid.m, grid.n, 1, 1)
        self.w_hh = w_hh
        H = w_hh.shape[1]
        f = coeffs[..., 5 * H :]
        factor = torch.cat([torch.zeros_like(f), f], -1)
        factor = torch.where(dt.reshape(-1, 1, 1) > 0, factor, 1.0)
        self._factors = chunk_view(factor, grid).prod(0)

    def __call__(self, lam: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        coeffs = self.coeffs if j is None else self.coeffs[j]
        dt = self.dt if j is None else self.dt[j]
        return cell.adjoint_step(lam, coeffs, self.w_hh, dt, out=out)

    def chunk_factors(self) -> Tensor:
        return self._factors


def _grids(T: int, options: MGRIT, batch: int, hidden: int):
    options = options.resolve(T, batch, hidden)
    return build_grids(T, options.cfactor, options.num_levels(T)), options


def _solve(grids, fine_op, u0, g, options: MGRIT, tol: float, iters: int):
    ops = [fine_op] + chunk_map_ops(grids, options)
    return solve(
        grids,
        ops,
        u0,
        g,
        relax=options.relax,
        stop=StopTest(tol),
        max_iters=iters,
        early_exit=False,
    )


def forward(
    x: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_ih,
    w_hh,
    b_ih,
    b_hh,
    options: MGRIT,
    tol=1e-12,
    iters=100,
) -> tuple[Tensor, object]:
    """All points ``(T + 1, B, 2H)`` (``[h, c]``; point 0 the start) of one layer for x
    ``(T, B, I)``, solved by MGRIT with ``options``' grids and relaxation to ``tol``."""
    T, B = x.shape[:2]
    H = w_hh.shape[1]
    grids, options = _grids(T, options, B, H)
    fine = grids[0]
    gx = x @ w_ih.t()
    bias = cell.fold_bias(b_ih, b_hh)
    if bias is not None:
        gx = gx + bias
    gates = pad_steps(gx, fine)
    dt = pad_steps(x.new_ones(T), fine)
    u0 = torch.cat([h0, c0], -1)
    result = _solve(grids, ForwardStep(fine, gates, dt, w_hh), u0, None, options, tol, iters)
    points = flat_points(result.u, result.uend)[: T + 1]
    return points, result


def backward(
    points: Tensor,
    x: Tensor,
    w_ih,
    w_hh,
    b_ih,
    b_hh,
    d_out: Tensor,
    d_hn: Tensor,
    d_cn: Tensor,
    options: MGRIT,
    tol=1e-12,
    iters=100,
) -> tuple[Tensor, ...]:
    """Gradients ``(dx, dh0, dc0, dW_ih, dW_hh, db)`` of one layer whose forward points are
    ``points`` ``(T + 1, B, 2H)``, from ``dL/dy`` ``(T, B, H)``, ``dL/dh_n`` and ``dL/dc_n``;
    the adjoint ``lam_t = dL/du_t`` solved by MGRIT reversed in time. ``db`` is the gradient
    of both biases (they enter the same pre-activations)."""
    T, B = x.shape[:2]
    H = w_hh.shape[1]
    gx = x @ w_ih.t()
    bias = cell.fold_bias(b_ih, b_hh)
    if bias is not None:
        gx = gx + bias
    coeffs = cell.linearise(points[:T], gx, w_hh)  # step t: u_t -> u_{t+1}
    grids, options = _grids(T, options, B, H)
    fine = grids[0]
    # reversed time: v_k = lam_{T-k}; v_{k+1} = J_{T-1-k}^T v_k + [dL/dy_{T-2-k}, 0]
    g = torch.zeros(T, B, 2 * H, dtype=x.dtype, device=x.device)
    g[: T - 1, :, :H] = d_out[: T - 1].flip(0)
    dt = pad_steps(x.new_ones(T), fine)
    op = AdjointStep(fine, pad_steps(coeffs.flip(0), fine), dt, w_hh)
    v0 = torch.cat([d_out[T - 1] + d_hn, d_cn], -1)
    g_chunks = chunk_view(pad_steps(g, fine), fine)
    result = _solve(grids, op, v0, g_chunks, options, tol, iters)
    lam = flat_points(result.u, result.uend)[: T + 1].flip(0)  # lam_0 .. lam_T
    d = cell.gate_grads(lam[1:], coeffs)  # (T, B, 4H)
    flat_d = d.reshape(-1, 4 * H)
    dx = (flat_d @ w_ih).view(T, B, -1)
    d_w_ih = flat_d.t() @ x.reshape(-1, x.shape[-1])
    d_w_hh = flat_d.t() @ points[:T, :, :H].reshape(-1, H)
    db = flat_d.sum(0)
    return dx, lam[0, :, :H], lam[0, :, H:], d_w_ih, d_w_hh, db, result
