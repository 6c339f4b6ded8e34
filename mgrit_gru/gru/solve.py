"""The GRU layer as MGRIT problems: the forward recurrence and its adjoint.

Forward: level 0 steps with the model's own cell, padded at the end with identity steps;
coarse level l steps from fine point ``k m^l`` with the implicit cell, ``dt`` = the number of
real fine steps it spans and input gates averaged over them (or injected).

Adjoint: ``lam_i = dL/du_i + J_i^T lam_{i+1}``, reversed in time, on the same points: its
level l is the forward level l flipped, the identity padding then at the front. Coarse adjoint
steps are the VJPs of the coarse implicit steps, linearised at the forward state at their
coarse point.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..core import Grid, SolveResult, build_grids, chunk_view, flat_points, pad_steps, solve
from ..options import MGRIT
from ..stats import SolveStats
from . import cell as gru


class DivergenceError(RuntimeError):
    """Raised for a diverging MGRIT solve when ``MGRIT(on_divergence="raise")``."""


class ForwardStep:
    """Propagator of a forward level: GRU steps with gates ``(M, B, 3H)`` and sizes ``dt``."""

    def __init__(self, grid, gates, w_hh, b_hh, cell, dt=None):
        self.gx = chunk_view(gates, grid)
        self.dt = None if dt is None else chunk_view(dt, grid)[..., None, None]
        self.w_hh, self.b_hh, self.cell = w_hh, b_hh, cell
        # Level 0 carries no dt: its padding is the tail of the last chunk, kept as identity.
        self.tail = grid.N - (grid.n - 1) * grid.m if dt is None and grid.M > grid.N else None

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        gx = self.gx if j is None else self.gx[j]
        dt = None if self.dt is None else (self.dt if j is None else self.dt[j])
        res = gru.step(u, gx, self.w_hh, self.b_hh, self.cell, dt, out=out)
        if self.tail is not None and (j is None or j >= self.tail):
            res[..., -1, :, :].copy_(u[..., -1, :, :])
        return res


class AdjointStep:
    """Propagator of an adjoint level: ``lam -> D * lam + (C * lam3) @ W_hh``."""

    def __init__(self, grid, D, C, w_hh):
        self.D, self.C, self.w_hh = chunk_view(D, grid), chunk_view(C, grid), w_hh

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        if j is None:
            return gru.adjoint_step(u, self.D, self.C, self.w_hh, out)
        return gru.adjoint_step(u, self.D[j], self.C[j], self.w_hh, out)


@dataclass
class Hierarchy:
    """Forward grids and the per-level (real, unpadded) gates and step sizes."""

    grids: list[Grid]
    gates: list[Tensor]  # level l: (N_l, B, 3H)
    dts: list[Tensor]  # level l: (N_l,)


def build_hierarchy(gx: Tensor, options: MGRIT, levels: Optional[int] = None) -> Hierarchy:
    T = gx.shape[0]
    grids = build_grids(T, options.cfactor, levels or options.num_levels(T))
    gates, dts = [gx], [gx.new_ones(T)]
    for fine in grids[:-1]:
        g = pad_steps(gates[-1], fine).view(fine.n, fine.m, *gx.shape[1:])
        w = pad_steps(dts[-1], fine).view(fine.n, fine.m)
        dt = w.sum(1)
        if options.coarse_gates == "average":
            flat = g.reshape(fine.n, fine.m, -1)
            avg = torch.bmm(w.unsqueeze(1), flat).squeeze(1) / dt.unsqueeze(1)
            gates.append(avg.view(fine.n, *gx.shape[1:]))
        else:
            gates.append(g[:, 0].clone())
        dts.append(dt)
    return Hierarchy(grids, gates, dts)


def _stats(pass_, where, grids, result: SolveResult, fell_back) -> SolveStats:
    layer, reverse = where
    return SolveStats(
        pass_=pass_,
        layer=layer,
        reverse=reverse,
        steps=grids[0].N,
        levels=len(grids),
        iterations=result.iterations,
        residuals=tuple(result.residuals),
        converged=result.converged and not result.diverged,
        fell_back=fell_back,
    )


def _diverged(pass_: str, options: MGRIT, result: SolveResult) -> None:
    message = f"MGRIT {pass_} solve diverged (residuals {[f'{r:.2e}' for r in result.residuals]})"
    if options.on_divergence == "raise":
        raise DivergenceError(message + "; use a smaller cfactor, more levels or relax='FCF'")
    warnings.warn(message + "; falling back to the exact serial solve for this call", stacklevel=4)


def forward_solve(
    gx: Tensor,
    h0: Tensor,
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: str,
    options: MGRIT,
    where=(0, False),
) -> tuple[Tensor, Hierarchy, SolveStats]:
    """Solve one layer forward. Returns all points ``(T + 1, B, H)`` (point 0 is h0)."""
    T = gx.shape[0]
    hier = build_hierarchy(gx, options)

    def run(h: Hierarchy) -> SolveResult:
        ops = [
            ForwardStep(
                g,
                pad_steps(gates, g),
                w_hh,
                b_hh,
                cell if lvl == 0 else "implicit",
                None if lvl == 0 else pad_steps(dt, g),
            )
            for lvl, (g, gates, dt) in enumerate(zip(h.grids, h.gates, h.dts))
        ]
        return solve(
            h.grids, ops, h0, relax=options.relax, tol=options.tol, max_iters=options.max_iters
        )

    result, fell_back, grids = run(hier), False, hier.grids
    if result.diverged:
        _diverged("forward", options, result)
        serial = build_hierarchy(gx, options, levels=1)
        stats_result = result
        result, fell_back, grids = run(serial), True, serial.grids
        result.residuals, result.iterations = stats_result.residuals, stats_result.iterations
    points = flat_points(result.u, result.uend)[: T + 1]
    return points, hier, _stats("forward", where, grids, result, fell_back)


def adjoint_solve(
    points: Tensor,
    gx: Tensor,
    hier: Hierarchy,
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: str,
    options: MGRIT,
    d_out: Tensor,
    d_last: Tensor,
    where=(0, False),
) -> tuple[Tensor, gru.Linearisation, SolveStats]:
    """Solve the adjoint of one layer.

    Args:
        points: forward points ``(T + 1, B, H)``; gx: fine input gates ``(T, B, 3H)``.
        d_out: dL/dy ``(T, B, H)``; d_last: dL/dh_n ``(B, H)``.

    Returns:
        ``lam`` ``(T + 1, B, H)`` with ``lam_0 = dL/dh0``, the fine linearisation, stats.
    """
    T = gx.shape[0]
    fine = gru.linearise(points[:T], gx, w_hh, b_hh, cell)
    forcing = torch.zeros_like(points)
    forcing[1:] = d_out
    forcing[T] += d_last
    scale = forcing.abs().max().item()

    def run(levels: int) -> tuple[list[Grid], SolveResult]:
        grids = build_grids(T, options.cfactor, levels, front=True)
        M = grids[0].M
        f_pad = pad_steps(forcing, Grid(N=T + 1, m=M + 1, n=1))  # (M + 1, B, H), zeros at the end
        ops = [
            AdjointStep(
                grids[0],
                pad_steps(fine.D.flip(0), grids[0], 1.0),
                pad_steps(fine.C.flip(0), grids[0]),
                w_hh,
            )
        ]
        for lvl in range(1, len(grids)):
            stride = options.cfactor**lvl
            lin = gru.linearise(
                points[0:T:stride],
                hier.gates[lvl],
                w_hh,
                b_hh,
                "implicit",
                hier.dts[lvl][:, None, None],
            )
            ops.append(
                AdjointStep(
                    grids[lvl],
                    pad_steps(lin.D.flip(0), grids[lvl], 1.0),
                    pad_steps(lin.C.flip(0), grids[lvl]),
                    w_hh,
                )
            )
        g0 = chunk_view(f_pad[:M].flip(0), grids[0]).contiguous()
        bwd_tol = options.bwd_tol
        result = solve(
            grids,
            ops,
            f_pad[M],
            g0,
            relax=options.relax,
            tol=bwd_tol,
            max_iters=options.bwd_max_iters,
            scale=scale,
        )
        return grids, result

    levels = 1 if not torch.isfinite(forcing).all() else len(hier.grids)
    grids, result = run(levels)
    fell_back = False
    if result.diverged:
        _diverged("backward", options, result)
        diverged = result
        grids, result = run(1)
        result.residuals, result.iterations, fell_back = (
            diverged.residuals,
            diverged.iterations,
            True,
        )
    lam = flat_points(result.u, result.uend).flip(0)[: T + 1]
    return lam, fine, _stats("backward", where, grids, result, fell_back)
