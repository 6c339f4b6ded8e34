"""The FAS V-cycle of MGRIT, vectorised over chunks.

The cycle solves ``u_{k+1} = Phi_l(u_k; k) + g_k`` for ``k = 0 .. M-1`` with ``u_0`` given, on a
hierarchy of grids (see :mod:`mgrit_gru.core.grid`). It knows nothing about the problem: each
level supplies a :class:`Propagator` that applies that level's steps to a batch of states.

One V-cycle on level l: relax (F or FCF), compute the C-point residual, form the coarse FAS
problem ``v_{k+1} = Phi_{l+1}(v_k) + g_c`` with ``g_c = (Phi_l-propagated C-point) -
Phi_{l+1}(previous C-point)``, recurse, inject the coarse solution into the C-points and, below
the finest level, F-relax so that every point of the level agrees with its corrected C-points.
The coarsest level is solved exactly by stepping through it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch
from torch import Tensor

from .grid import Grid, chunk_ends, flat_points, to_chunks

# An early-exiting F-relaxation (``MGRIT(early_exit=True)``) compares new and stored states
# every EXIT_EVERY steps: each comparison costs about a tenth of a batched step on the CPU, and
# the exit comes at most EXIT_EVERY - 1 steps late.
EXIT_EVERY = 4


class Propagator(Protocol):
    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        """Apply the level's steps without the right-hand side ``g``.

        ``j`` an int: step ``j`` of every chunk; ``u`` has shape ``(n, *S)``.
        ``j`` None: every step at once; ``u`` has shape ``(m, n, *S)`` in chunk layout.
        Steps outside the grid's real range must be the identity.

        A propagator that records something per step for later use (the forward GRU steps
        keep their gates for the backward) may expose a boolean attribute ``recording``: the
        cycle sets it False during sweeps whose F-points the next sweep overwrites.
        """
        ...


class LocalComm:
    """How level-0 chunks meet when one process holds them all: they don't need to.

    A time-parallel backend (:mod:`mgrit_gru.distributed`) replaces this with one whose rank
    holds the chunks ``[c0, c1)`` of the finest level: it passes chunk-boundary states to the
    next rank, gathers C-point data for the coarse levels (which every rank then solves
    redundantly) and reduces residual norms. The cycle is otherwise the same.
    """

    first = True  # holds global point 0

    def span(self, n: int) -> tuple[int, int]:
        """This rank's chunks of the finest level, given its local chunk count."""
        return 0, n

    def shift(self, uend: Tensor) -> Optional[Tensor]:
        """Send this rank's last point on; the previous rank's last point (None on the first)."""
        return None

    def gather(self, local: Tensor) -> Tensor:
        """Per-chunk values of all ranks in time order."""
        return local

    def last(self, uend: Tensor) -> Tensor:
        """The global last point (held by the last rank) on every rank."""
        return uend

    def solve_coarse(self, solve: Callable[[], Tensor], n: int, like: Tensor) -> Tensor:
        """Run the coarse-grid solve (``solve()`` gives all level-1 points ``(N + 1, *S)``)
        and return this rank's ``n`` C-points and the next (``c0 .. c1``, both ends, of
        :meth:`span`). Here every rank runs it."""
        c0, c1 = self.span(n)
        return solve()[c0 : c1 + 1]

    def max(self, value: float) -> float:
        return value


@dataclass
class SolveResult:
    u: Tensor  # (m, n, *S) level-0 points 0..M-1 in chunk layout
    uend: Tensor  # (*S) point M
    residuals: list[float] = field(default_factory=list)
    iterations: int = 0
    converged: bool = True
    diverged: bool = False


class _Solver:
    def __init__(self, grids: Sequence[Grid], ops: Sequence[Propagator], relax: str, comm):
        self.grids = grids
        self.ops = ops
        self.relax = relax
        self.comm = comm
        self.scratch: Optional[Tensor] = None

    # -- relaxation ---------------------------------------------------------------------
    def f_relax(
        self,
        level: int,
        u: Tensor,
        g: Optional[Tensor],
        provisional: bool = False,
        exit_tol: Optional[float] = None,
    ) -> Optional[float]:
        """F-relaxation; ``provisional``: the next F-relaxation overwrites its F-points.

        ``exit_tol``: ``u``'s F-points already hold a trajectory of these same steps (from
        the previous sweep, which recorded if the propagator records) and the sweep may stop
        early: every :data:`EXIT_EVERY` steps it compares the new states with the stored
        ones and, once they differ by at most ``exit_tol`` everywhere, keeps the stored rest
        of every chunk. The trajectory then has one residual per chunk, at that step, of at
        most the returned difference; ``None``: the sweep ran to the end (no residual)."""
        op = self.ops[level]
        recording = getattr(op, "recording", None)
        if provisional and recording:
            op.recording = False
        try:
            for j in range(self.grids[level].m - 1):
                if exit_tol is not None and j % EXIT_EVERY == EXIT_EVERY - 1:
                    new = op(u[j], j, out=self._scratch(u))
                    if g is not None:
                        new.add_(g[j])
                    # one decision for all ranks, as one process holding all chunks would
                    change = self.comm.max((new - u[j + 1]).abs().max().item())
                    if change <= exit_tol:
                        return change
                    u[j + 1].copy_(new)
                    continue
                op(u[j], j, out=u[j + 1])
                if g is not None:
                    u[j + 1].add_(g[j])
        finally:
            if recording is not None:
                op.recording = recording
        return None

    def _scratch(self, u: Tensor) -> Tensor:
        if self.scratch is None or self.scratch.shape != u.shape[1:]:
            self.scratch = u.new_empty(u.shape[1:])
        return self.scratch

    def propagate_last(self, level: int, u: Tensor, g: Optional[Tensor]) -> Tensor:
        """Phi applied at the last step of every chunk: the candidate C-points 1..n."""
        m = self.grids[level].m
        out = self.ops[level](u[m - 1], m - 1)
        if g is not None:
            out = out + g[m - 1]
        return out

    def set_c_points(self, level: int, u: Tensor, uend: Tensor, values: Tensor) -> None:
        u[0, 1:] = values[:-1]
        uend.copy_(values[-1])
        if level == 0:  # this rank's first C-point is the previous rank's last point
            received = self.comm.shift(uend)
            if received is not None:
                u[0, 0] = received

    def c_relax(self, level: int, u: Tensor, uend: Tensor, g: Optional[Tensor]) -> None:
        self.set_c_points(level, u, uend, self.propagate_last(level, u, g))

    def smooth(
        self,
        level: int,
        u: Tensor,
        uend: Tensor,
        g: Optional[Tensor],
        exit_tol: Optional[float] = None,
        stored: bool = False,
    ) -> Optional[float]:
        """F or FCF relaxation. ``exit_tol``: an F-relaxation that follows another may exit
        early (:meth:`f_relax`): FCF's second, and F's only one where ``stored`` (``u``'s
        F-points hold the last sweep's states: after a coarse correction). Returns the
        residual the exit left, or None. FCF's first sweep runs to the end (an exit there
        would leave a residual that the second sweep's exit does not measure); where the
        second may exit early, the first records, since some of its F-points stay."""
        if self.relax == "F":
            return self.f_relax(level, u, g, exit_tol=exit_tol if stored else None)
        self.f_relax(level, u, g, provisional=exit_tol is None)
        self.c_relax(level, u, uend, g)
        return self.f_relax(level, u, g, exit_tol=exit_tol)

    # -- the cycle ------------------------------------------------------------------------
    def exact(self, level: int, u: Tensor, uend: Tensor, g: Optional[Tensor]) -> None:
        self.f_relax(level, u, g)
        self.c_relax(level, u, uend, g)

    def coarse_correct(self, level: int, u: Tensor, uend: Tensor, propagated: Tensor) -> None:
        """FAS coarse-grid correction of level ``level``'s C-points.

        ``propagated`` holds Phi_l(last F-point of chunk c) + g: the values C-points 1..n would
        take after a C-relaxation.
        """
        if level == 0:  # chunks may be spread over ranks: gather what the coarse level needs
            c_points = torch.cat([self.comm.gather(u[0]), self.comm.last(uend).unsqueeze(0)])
            propagated = self.comm.gather(propagated)
            solve = functools.partial(self.coarse_solve, level, c_points, propagated)
            solved = self.comm.solve_coarse(solve, u.shape[1], uend)
        else:
            c_points = torch.cat([u[0], uend.unsqueeze(0)])  # (n + 1, *S)
            solved = self.coarse_solve(level, c_points, propagated)
        u[0] = solved[:-1]
        uend.copy_(solved[-1])

    def coarse_solve(self, level: int, c_points: Tensor, propagated: Tensor) -> Tensor:
        """The FAS coarse problem of level ``level``'s C-points ``(n + 1, *S)``, solved by a
        V-cycle on level ``level + 1``: the corrected C-points ``(n + 1, *S)``."""
        coarse, Mc, off = self.grids[level + 1], self.grids[level + 1].M, self.grids[level + 1].off
        n = c_points.shape[0] - 1
        v_flat = c_points.new_empty((Mc + 1, *c_points.shape[1:]))
        v_flat[:off] = c_points[0]
        v_flat[off : off + n + 1] = c_points
        v_flat[off + n + 1 :] = c_points[n]
        v = to_chunks(v_flat[:Mc], coarse)
        vend = v_flat[Mc].clone()
        phi = self.ops[level + 1](v, None)  # coarse propagation of every coarse point
        phi_flat = phi.transpose(0, 1).reshape(Mc, *phi.shape[2:])
        g_flat = torch.zeros_like(phi_flat)
        g_flat[off : off + n] = propagated - phi_flat[off : off + n]
        g_c = to_chunks(g_flat, coarse)
        self.vcycle(level + 1, v, vend, g_c)
        return flat_points(v, vend)[off : off + n + 1]

    def vcycle(self, level: int, u: Tensor, uend: Tensor, g: Optional[Tensor]) -> None:
        if level == len(self.grids) - 1:
            self.exact(level, u, uend, g)
            return
        self.smooth(level, u, uend, g)
        self.coarse_correct(level, u, uend, self.propagate_last(level, u, g))
        self.f_relax(level, u, g)


def _residual_norm(propagated: Tensor, u: Tensor, uend: Tensor) -> float:
    return (propagated - chunk_ends(u, uend)).abs().max().item()


def solve(
    grids: Sequence[Grid],
    ops: Sequence[Propagator],
    u0: Tensor,
    g: Optional[Tensor] = None,
    *,
    relax: str = "FCF",
    tol: float = 0.0,
    max_iters: int = 1,
    scale: float = 1.0,
    work: Optional[Tensor] = None,
    comm: Optional[LocalComm] = None,
    early_exit: bool = False,
) -> SolveResult:
    """Solve ``u_{k+1} = Phi_0(u_k; k) + g_k`` from ``u_0 = u0`` on the finest grid.

    Args:
        grids, ops: the hierarchy (finest first) and one propagator per level.
        u0: the initial state, shape ``S``.
        g: level-0 right-hand side in chunk layout ``(m, n, *S)``, or None for zero.
        relax: ``"F"`` or ``"FCF"``.
        tol, scale: stop when the largest absolute residual divided by ``scale`` is
            ``<= tol``; ``residuals`` are recorded divided by ``scale`` too.
        max_iters: cap on V-cycles.
        early_exit: a level-0 F-relaxation that follows another (FCF's second; the final
            one after a coarse correction) stops once its states agree with the previous
            sweep's to ``tol * scale`` (see :meth:`_Solver.f_relax`): the chunks have
            forgotten the change of their C-points, and the rest of each chunk is kept. The
            residual is then the largest of the C-point residuals and that exit's (an earlier
            exit's that a later sweep left in place is at most ``tol * scale`` too, so a
            converged solve has every residual within ``tol``).
        work: optional ``(m, n, *S)`` tensor to hold the level-0 points (else allocated).
        comm: how this process's level-0 chunks meet the others' (default: it holds them all).

    Returns:
        :class:`SolveResult`. ``residuals`` holds the residual after each relaxation (one per
        V-cycle, then one for the final F-relaxation). ``diverged`` is set, and the solve
        abandoned, when a residual is not finite or exceeds the first one (the residual of
        relaxation alone); the caller decides what follows. (Multilevel F-relaxation can grow
        transiently and then converge; FCF is the robust choice.)
        With one grid the solve is the exact serial sweep and ``residuals`` is empty.
    """
    first = grids[0]
    u = u0.new_empty((first.m, first.n, *u0.shape)) if work is None else work
    u.copy_(u0.expand(first.m, first.n, *u0.shape))
    uend = u0.clone()
    comm = comm or LocalComm()
    solver = _Solver(grids, ops, relax, comm)
    if len(grids) == 1:
        solver.exact(0, u, uend, g)
        return SolveResult(u, uend)
    result = SolveResult(u, uend, converged=False)
    floor = 100.0 * torch.finfo(u0.dtype).eps
    scale = max(scale, torch.finfo(u0.dtype).tiny)
    exit_tol = tol * scale if early_exit else None
    for _ in range(max_iters + 1):
        final = result.iterations == max_iters
        if final:  # after a coarse correction the F-points hold the previous sweep's states
            exited = solver.f_relax(0, u, g, exit_tol=exit_tol if result.iterations else None)
        else:
            exited = solver.smooth(0, u, uend, g, exit_tol, stored=result.iterations > 0)
        propagated = solver.propagate_last(0, u, g)
        res = _residual_norm(propagated, u, uend)
        res = comm.max(res if exited is None else max(res, exited)) / scale
        history = result.residuals
        # Diverged: worse than after the first relaxation alone, i.e. the coarse grid hurts.
        grew = bool(history) and res > history[0] and res > max(floor, tol)
        if not math.isfinite(res) or grew:
            history.append(res)
            result.diverged = True
            return result
        history.append(res)
        if res <= tol or final:
            result.converged = res <= tol
            solver.set_c_points(0, u, uend, propagated)
            return result
        solver.coarse_correct(0, u, uend, propagated)
        result.iterations += 1
    raise AssertionError("unreachable")
