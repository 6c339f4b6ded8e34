"""Coarse propagators rebuilt from the finer level's last sweep: frozen factors and secants.

Along a fine sweep each step of many recurrences is close to elementwise affine in the state
(for a GRU, ``h' = z h + (1 - z) n`` with the gates frozen). A whole chunk ``c`` is then
``u_end ~ a_c * u_start + b_c`` with ``a_c`` the product of the steps' diagonal factors. Used
as the coarse propagator of FAS, the offset ``b_c`` cancels, and the coarse correction reads

    V_{c+1} = P_c + a_c * (V_c - U_c)

with ``U`` the current C-points, ``P_c`` the fine propagation of ``U_c`` over chunk ``c`` and
``V`` the corrected C-points: a Newton step on the C-points with the chunk Jacobian replaced
by its frozen diagonal. The maps compose: the next level's factor is the product of these.

:class:`SecantStep` adds, per chunk, the rank-q least-squares correction of that diagonal
that maps the last q differences of ``U_c`` between iterates onto those of ``P_c``
(a multisecant update), so that the coarse correction learns the coupling that the
frozen diagonal ignores. With fewer than two iterates it is the frozen map.

A finer level whose coarse level is one of these provides ``chunk_factors()``: the product
over each of its chunks of the steps' diagonal factors along its current trajectory,
``(n, *S)``. Both classes provide it themselves, so they stack on every level.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import trace
from .grid import Grid, chunk_view, pad_steps


class DiagonalStep:
    """Coarse propagator ``v -> a_k * v`` on ``grid``, ``a`` refreshed from the finer level's
    chunk factors before each coarse solve (padding steps are the identity)."""

    level = 1  # its MGRIT level, set by the cycle: for traces

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.a: Optional[Tensor] = None  # (m, n, *S) chunk layout

    def refresh(self, factors: Tensor, c_points: Tensor, propagated: Tensor) -> None:
        """``factors`` ``(N, *S)``: the finer level's chunk factors, one per step of this
        level; ``c_points`` ``(N + 1, *S)`` and ``propagated`` ``(N, *S)``: the finer level's
        C-points and their fine propagation (unused here)."""
        self.a = chunk_view(pad_steps(factors, self.grid, 1.0), self.grid)

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        a = self.a if j is None else self.a[j]
        trace.work("map", u.numel() // max(u.shape[-1], 1), u.shape[-1], level=self.level)
        return torch.mul(u, a, out=out)

    def chunk_factors(self) -> Tensor:
        return self.a.prod(0)


class SecantStep(DiagonalStep):
    """:class:`DiagonalStep` plus a per-step multisecant correction from the last ``depth``
    differences of the finer level's C-points ``U`` and propagated values ``P`` between
    coarse corrections of one solve.

    Per step ``k`` (one finer chunk) and per row of the state (a sequence of the batch), with
    ``dU``, ``dP`` the ``(q, H)`` differences and ``W = dP - a * dU``::

        v -> a * v + W^T (dU dU^T + eps)^{-1} dU v

    which maps every ``dU_i`` onto ``dP_i`` (up to ``eps``). The pairs are scaled to unit
    ``dU_i`` and solved in float64; ``eps`` (a hundredth of the square root of the states'
    dtype resolution) keeps the solve well posed where differences are (nearly) parallel; a
    difference that vanishes (the first chunk's start never moves) adds nothing, and where a
    solve still fails the map stays the diagonal one."""

    def __init__(self, grid: Grid, depth: int) -> None:
        super().__init__(grid)
        self.depth = depth
        self.history: list[tuple[Tensor, Tensor]] = []  # (U, P), each (N, *S)
        self.coupling: Optional[tuple[Tensor, Tensor]] = None  # chunk-layout (W, G^-1 dU)

    def refresh(self, factors: Tensor, c_points: Tensor, propagated: Tensor) -> None:
        super().refresh(factors, c_points, propagated)
        N = propagated.shape[0]
        self.history.append((c_points[:N].clone(), propagated.clone()))
        del self.history[: -(self.depth + 1)]
        self.coupling = None
        if len(self.history) < 2:
            return
        U, P = self.history[-1]
        wide = torch.float64  # the differences shrink with the residual: solve in float64
        dU = torch.stack([U.to(wide) - u.to(wide) for u, _ in self.history[:-1]], dim=-2)
        dP = torch.stack([P.to(wide) - p.to(wide) for _, p in self.history[:-1]], dim=-2)
        # Each pair scaled to a unit dU: the same map, with coefficients of order one (the
        # projector of tiny differences would otherwise overflow the states' dtype).
        norm = dU.norm(dim=-1, keepdim=True)
        norm = torch.where(norm > 0, norm, torch.ones_like(norm))
        dU, dP = dU / norm, dP / norm
        W = dP - factors.to(wide).unsqueeze(-2) * dU
        gram = dU @ dU.transpose(-1, -2)  # (N, *R, q, q), unit diagonal where dU != 0
        eye = torch.eye(gram.shape[-1], dtype=wide, device=gram.device)
        ridge = 0.01 * torch.finfo(U.dtype).eps ** 0.5  # near-parallel pairs stay solvable
        proj, info = torch.linalg.solve_ex(gram + ridge * eye, dU)  # (N, *R, q, H)
        proj = torch.where((info == 0)[..., None, None], proj, torch.zeros_like(proj))
        self.coupling = (self._steps(W.to(U.dtype)), self._steps(proj.to(U.dtype)))

    def _steps(self, per_chunk: Tensor) -> Tensor:
        """Per finer chunk ``(N, ...)`` -> this level's chunk layout, zero in the padding."""
        return chunk_view(pad_steps(per_chunk, self.grid, 0.0), self.grid)

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        res = super().__call__(u, j, out)
        if self.coupling is not None:
            W, proj = self.coupling
            if j is not None:
                W, proj = W[j], proj[j]
            coeff = (proj @ u.unsqueeze(-1)).squeeze(-1)  # (..., q)
            res += (coeff.unsqueeze(-2) @ W).squeeze(-2)
        return res
