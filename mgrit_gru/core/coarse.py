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

Given a compiled module with ``map_sweep`` (the C++ kernels, :mod:`mgrit_gru.kernels`; the
source is ``coarse_cpu.cpp`` beside this file), a map offers ``sweep``: many of its steps of
every chunk in one call, where stepping costs four to six PyTorch operators per step; and
:func:`chunk_product` (``chunk_product``) forms the chunk factors in one pass over them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import trace
from .grid import Grid, chunk_view, pad_steps


def chunk_product(factors: Tensor, kernel=None) -> Tensor:
    """Per chunk ``(n, *S)``: the product of ``factors`` ``(m, n, *S)`` along its ``m`` steps.

    With a compiled module that has ``chunk_product`` (the C++ kernels; CPU, float32 and
    float64, a contiguous last axis, no graph to record) one pass over the factors in their
    own layout, the rows in blocks over the threads; a running product below the dtype's
    smallest normal number is flushed to zero there (the factor of a chunk whose states
    forget their start, and subnormal arithmetic costs tens of times a normal multiply on x86
    cores). With factors of magnitude at most 1, as the cells' are at step sizes up to 1,
    that is the product's own limit; a later factor above 1 does not raise a flushed product
    again. Otherwise ``factors.prod(0)``."""
    run = getattr(kernel, "chunk_product", None)
    if (
        run is None
        or factors.dtype not in (torch.float32, torch.float64)
        or factors.device.type != "cpu"
        or factors.dim() < 3
        or factors.numel() == 0
        or factors.stride(-1) != 1
        or (factors.requires_grad and torch.is_grad_enabled())
    ):
        return factors.prod(0)
    m, n, width = factors.shape[0], factors.shape[1], factors.shape[-1]
    out = factors.new_empty(factors.shape[1:])
    run(factors.reshape(m, n, -1, width), out.view(n, -1, width))
    return out


class DiagonalStep:
    """Coarse propagator ``v -> a_k * v`` on ``grid``, ``a`` refreshed from the finer level's
    chunk factors before each coarse solve (padding steps are the identity)."""

    level = 1  # its MGRIT level, set by the cycle: for traces

    def __init__(self, grid: Grid, kernel=None) -> None:
        self.grid = grid
        self.a: Optional[Tensor] = None  # (m, n, *S) chunk layout
        # a compiled module that runs many steps in one call (its map_sweep), else None
        self.kernel = kernel if hasattr(kernel, "map_sweep") else None
        self.sweep = None if self.kernel is None else self._sweep

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
        return chunk_product(self.a, self.kernel)

    def _coupling(self, j0: int, j1: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
        return None, None

    def _sweep(self, u: Tensor, g: Optional[Tensor], j0: int, j1: int) -> None:
        """Steps ``j0 .. j1 - 1`` of every chunk in one compiled call: ``u[j + 1] = map_j(u[j])
        + g[j]`` (``u`` in chunk layout ``(m, n, *S)``, its state axes viewed as rows of H)."""
        S, (n, H) = j1 - j0, (u.shape[1], u.shape[-1])
        W, P = self._coupling(j0, j1)

        def rows(t: Tensor) -> Tensor:  # (steps, n, R, H)
            return t.view(t.shape[0], n, -1, H)

        def pair(t: Tensor) -> Tensor:  # (steps, n, R, q, H)
            return t.view(S, n, -1, *t.shape[-2:])

        self.kernel.map_sweep(
            rows(u[j0 : j0 + 1]),
            rows(u[j0 + 1 : j1 + 1]),
            rows(self.a[j0:j1]),
            None if g is None else rows(g[j0:j1]),
            None if W is None else pair(W),
            None if P is None else pair(P),
        )
        trace.work("map", u[0].numel() // max(H, 1), H, calls=S, level=self.level)


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

    def __init__(self, grid: Grid, depth: int, kernel=None) -> None:
        super().__init__(grid, kernel)
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
        # contiguous: LAPACK leaves the solution column-major, the compiled sweep reads rows
        W, proj = W.to(U.dtype).contiguous(), proj.to(U.dtype).contiguous()
        self.coupling = (self._steps(W), self._steps(proj))

    def _steps(self, per_chunk: Tensor) -> Tensor:
        """Per finer chunk ``(N, ...)`` -> this level's chunk layout, zero in the padding."""
        return chunk_view(pad_steps(per_chunk, self.grid, 0.0), self.grid)

    def _coupling(self, j0: int, j1: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
        if self.coupling is None:
            return None, None
        W, proj = self.coupling
        return W[j0:j1], proj[j0:j1]

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        res = super().__call__(u, j, out)
        if self.coupling is not None:
            W, proj = self.coupling
            if j is not None:
                W, proj = W[j], proj[j]
            coeff = (proj @ u.unsqueeze(-1)).squeeze(-1)  # (..., q)
            res += (coeff.unsqueeze(-2) @ W).squeeze(-2)
        return res
