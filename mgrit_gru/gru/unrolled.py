"""A budgeted MGRIT forward as one differentiable computation
(``MGRIT(budget=Budget(..., gradient="unrolled"))``).

Under a fixed budget the forward does not solve the GRU: it computes a function of its own
(a few V-cycles from a guess), and the network trains through that function. The adjoint
gradient (the paper's) is the gradient of the exact GRU at the budget's states; this module
gives instead the exact gradient of the budgeted forward itself, by running the same cycles as
:mod:`mgrit_gru.core.cycle` out of place, so that autograd records them. Every sweep is one
batched step over all chunks, so the backward is as parallel as the forward; its memory is the
states of every sweep (about ``sweeps x T x B x H`` floats, several times the exact solve's).

The cycles are the core's: relaxation ``F(CF)*`` on each level, FAS coarse problems on the
hierarchy of :func:`mgrit_gru.core.build_grids`, the coarsest level solved by stepping, a final
F-relaxation and C-relaxation on the finest; coarse corrections "implicit", "frozen" and
"secant" as in :mod:`mgrit_gru.layer.solve` (the last two built from the sweep's own factors,
differentiably). Early exit is off: every sweep runs to its end.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..core import Grid, build_grids, chunk_view, pad_steps, to_chunks
from ..core.cycle import cf_sweeps
from ..layer.solve import build_hierarchy, chunk_map_ops, step_weights
from ..options import MGRIT, Implicit
from . import cell as gru
from .reference import step


class Steps:
    """A level of GRU steps: gates ``(M, B, 3H)``, sizes ``dt`` ``(M,)``/``(M, B)`` or None."""

    def __init__(self, grid: Grid, gates, w_hh, b_hn, cell: str, dt=None) -> None:
        self.gx = chunk_view(gates, grid)
        self.dt = None if dt is None else chunk_view(dt, grid).reshape(grid.m, grid.n, -1, 1)
        self.w_hh, self.b_hn, self.cell = w_hh, b_hn, cell
        self.factors: list[Optional[Tensor]] = [None] * grid.m  # the last sweep's, per j

    def __call__(self, u: Tensor, j: Optional[int], out=None) -> Tensor:
        gx = self.gx if j is None else self.gx[j]
        dt = None if self.dt is None else (self.dt if j is None else self.dt[j])
        res, factor = step(u, gx, self.w_hh, self.b_hn, self.cell, dt)
        if j is not None:
            self.factors[j] = factor
        return res

    def chunk_factors(self) -> Tensor:
        return torch.stack(self.factors).prod(0)


class _Cycles:
    """The V-cycle of :class:`mgrit_gru.core.cycle._Solver`, on lists of per-position states
    (``u[j]`` is position j of every chunk, ``(n, *S)``), every update out of place."""

    def __init__(self, grids, ops, relax: str, clamp: Optional[float] = None) -> None:
        self.grids, self.ops, self.sweeps = grids, ops, cf_sweeps(relax)
        self.clamp = clamp  # the states' bound, or None

    def f_relax(self, level, u, g):
        for j in range(self.grids[level].m - 1):
            new = self.ops[level](u[j], j)
            u[j + 1] = new if g is None else new + g[j]

    def propagate_last(self, level, u, g):
        m = self.grids[level].m
        out = self.ops[level](u[m - 1], m - 1)
        return out if g is None else out + g[m - 1]

    def set_c_points(self, u, values):
        u[0] = torch.cat([u[0][:1], values[:-1]])
        return values[-1]

    def smooth(self, level, u, uend, g):
        self.f_relax(level, u, g)
        for _ in range(self.sweeps):
            uend = self.set_c_points(u, self.propagate_last(level, u, g))
            self.f_relax(level, u, g)
        return uend

    def coarse_correct(self, level, u, uend, propagated):
        c_points = torch.cat([u[0], uend.unsqueeze(0)])
        coarse_op = self.ops[level + 1]
        if hasattr(coarse_op, "refresh"):
            coarse_op.refresh(self.ops[level].chunk_factors(), c_points, propagated)
        coarse = self.grids[level + 1]
        Mc, off, n = coarse.M, coarse.off, c_points.shape[0] - 1
        parts = [c_points[:1].expand(off, *c_points.shape[1:]), c_points]
        parts.append(c_points[n:].expand(Mc + 1 - off - n - 1, *c_points.shape[1:]))
        v_flat = torch.cat(parts)
        v = list(to_chunks(v_flat[:Mc], coarse).unbind(0))
        phi = coarse_op(torch.stack(v), None)
        phi_flat = phi.transpose(0, 1).reshape(Mc, *phi.shape[2:])
        g_flat = torch.cat(
            [
                torch.zeros_like(phi_flat[:off]),
                propagated - phi_flat[off : off + n],
                torch.zeros_like(phi_flat[off + n :]),
            ]
        )
        vend = self.vcycle(level + 1, v, v_flat[Mc], to_chunks(g_flat, coarse))
        flat = torch.stack(v).transpose(0, 1).reshape(Mc, *v_flat.shape[1:])
        solved = torch.cat([flat, vend[None]])[off : off + n + 1]
        if level == 0 and self.clamp is not None:  # never the given start point
            solved = torch.cat([solved[:1], solved[1:].clamp(-self.clamp, self.clamp)])
        u[0] = solved[:-1]
        return solved[-1]

    def vcycle(self, level, u, uend, g):
        if level == len(self.grids) - 1:
            self.f_relax(level, u, g)
            return self.set_c_points(u, self.propagate_last(level, u, g))
        uend = self.smooth(level, u, uend, g)
        uend = self.coarse_correct(level, u, uend, self.propagate_last(level, u, g))
        self.f_relax(level, u, g)
        return uend


def solve_budget(
    grids, ops, u0: Tensor, relax: str, cycles: int, clamp: bool = False
) -> tuple[Tensor, list[float]]:
    """All level-0 points ``(M + 1, *S)`` after ``cycles`` V-cycles from the guess ``u0``
    everywhere (the core's :func:`mgrit_gru.core.solve` with ``tol=0``), and the relative
    residual after each relaxation, as the core measures it (detached, for the statistics).
    ``clamp``: the C-points after each coarse correction are clamped to the states' range
    ``max(1, |u0|)`` (a GRU step mixes its state with a tanh in (-1, 1)), ``u0`` itself never."""
    first = grids[0]
    u = [u0.expand(first.n, *u0.shape)] * first.m
    uend = u0
    cyc = _Cycles(grids, ops, relax, max(1.0, u0.abs().max().item()) if clamp else None)
    start = u0.detach().abs().max().item()
    residuals = []
    if len(grids) == 1:
        cycles = 0
    for k in range(cycles + 1):
        if k == cycles:
            cyc.f_relax(0, u, None)
        else:
            uend = cyc.smooth(0, u, uend, None)
        propagated = cyc.propagate_last(0, u, None)
        ends = torch.cat([u[0][1:], uend.unsqueeze(0)])
        size = max(start, propagated.detach().abs().max().item(), torch.finfo().tiny)
        residuals.append((propagated - ends).detach().abs().max().item() / size)
        if k == cycles:
            uend = cyc.set_c_points(u, propagated)
            break
        uend = cyc.coarse_correct(0, u, uend, propagated)
    points = torch.stack(u).transpose(0, 1).reshape(first.M, *u0.shape)
    return torch.cat([points, uend.unsqueeze(0)]), residuals


def layer(
    x: Tensor,
    h0: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Optional[Tensor],
    b_hh: Optional[Tensor],
    cell: str,
    options: MGRIT,
    reverse: bool = False,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, list[float], int]:
    """``y (T, B, H), h_n (B, H)`` of one layer and direction under ``options.budget``, as a
    differentiable computation; also the residual history and the number of levels. ``x`` is
    in this direction's time order (a reverse direction's grid is padded at the front)."""
    T, B = x.shape[:2]
    H = w_hh.shape[1]
    grids = build_grids(T, options.cfactor, options.num_levels(T), front=reverse)
    fine = grids[0]
    gx = x @ w_ih.t()
    bias = gru.fold_bias(b_ih, b_hh, H)
    if bias is not None:
        gx = gx + bias
    gx_pad = pad_steps(gx, fine)
    b_hn = None if b_hh is None else b_hh[2 * H :]
    dt0 = step_weights(fine, mask, gx_pad)  # 1 per real step, 0 in the padding (identity)
    fine_dt = None if mask is None and fine.M == fine.N else dt0
    ops = [Steps(fine, gx_pad, w_hh, b_hn, cell, fine_dt)]
    if len(grids) > 1:
        if isinstance(options.coarse, Implicit):
            hier = build_hierarchy(gx_pad, grids, options, dt0, None, reverse)
            for lvl, g in enumerate(grids[1:], start=1):
                gates, dts = pad_steps(hier.gates[lvl], g), pad_steps(hier.dts[lvl], g)
                ops.append(Steps(g, gates, w_hh, b_hn, "implicit", dts))
        else:
            ops += chunk_map_ops(grids, options)
    budget = options.budget
    points, residuals = solve_budget(grids, ops, h0, options.relax, budget.forward, budget.clamp)
    points = points[fine.off : fine.off + T + 1]
    return points[1:], points[T], residuals, len(grids)


__all__ = ["layer", "solve_budget"]
