"""The FAS V-cycle of MGRIT, vectorised over chunks.

The cycle solves ``u_{k+1} = Phi_l(u_k; k) + g_k`` for ``k = 0 .. M-1`` with ``u_0`` given, on a
hierarchy of grids (see :mod:`mgrit_gru.core.grid`). It knows nothing about the problem: each
level supplies a :class:`Propagator` that applies that level's steps to a batch of states.

One V-cycle on level l: relax (F, FCF, FCFCF, ...), compute the C-point residual, form the
coarse FAS problem ``v_{k+1} = Phi_{l+1}(v_k) + g_c`` with ``g_c = (Phi_l-propagated C-point) -
Phi_{l+1}(previous C-point)``, recurse, inject the coarse solution into the C-points and, below
the finest level, F-relax so that every point of the level agrees with its corrected C-points.
The coarsest level is solved exactly by stepping through it.

A coarse propagator may be fixed for the solve (a rediscretised step) or rebuilt before each
coarse correction from what the finer level's last sweep saw (:mod:`mgrit_gru.core.coarse`):
such a propagator has a ``refresh`` method, and its finer level then provides
``chunk_factors()``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch
from torch import Tensor

from .. import trace
from .grid import Grid, chunk_ends, flat_points, to_chunks
from .stopping import StopTest

# An early-exiting F-relaxation (``MGRIT(early_exit=True)``) compares new and stored states
# every EXIT_EVERY steps: each comparison costs about a tenth of a batched step on the CPU, and
# the exit comes at most EXIT_EVERY - 1 steps late.
EXIT_EVERY = 4
# On CUDA a comparison is a few kernel launches and splits the sweep's one launch (the Triton
# sweeps) in two: every 16 steps there (not yet measured on a GPU: benchmarks/gpu_check.sh).
EXIT_EVERY_CUDA = 16
# ... and at most EXIT_CHECKS times a sweep: in longer chunks the checks spread out (every m /
# 32 steps), so that a sweep's checks stay few where each is a message between time-parallel
# ranks (a lagged all-reduce, 98-695 us over gloo's loopback here, against four steps of
# a rank's 64 rows in about 0.1 ms). Measured 2026-12-07, the main job's trained network, two
# ranks at T = 16384, B = 4, chunks of 512: 1417 checks took 0.77-0.79 s of the ranks' 1.9 s.
EXIT_CHECKS = 32


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


class _Lagged:
    """An early-exit comparison read without waiting for it: ``push`` starts copying a device
    scalar to the host; ``agreed`` says whether the last one pushed has arrived and was
    within the threshold (False while it is still on its way). One process's only: a time
    group's ranks must decide alike (:class:`_RanksLagged`)."""

    def __init__(self) -> None:
        self.value: Optional[Tensor] = None
        self.event = None

    def finish(self) -> None:
        pass

    def push(self, change: Tensor) -> None:
        if change.is_cuda:
            if self.value is None:
                self.value = torch.empty((), dtype=change.dtype, pin_memory=True)
            self.value.copy_(change, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.value = change

    def agreed(self, tol: float) -> bool:
        if self.value is None or (self.event is not None and not self.event.query()):
            return False
        return float(self.value) <= tol


class _RanksLagged:
    """The lagged decision across a time group's ranks: ``push`` starts the maximum of the
    comparison over the ranks without waiting (``comm.max_start``), the sweep goes on, and
    ``agreed`` at the next comparison waits for it (done by then, as a rule) and judges it:
    every rank the same value, the same decision, and no rank stalls the others every
    EXIT_EVERY steps. One process on the CPU judges the previous comparison the same way (it
    is there at once), so P ranks and one process exit at the same step there (one CUDA
    process reads it when its copy has arrived: :class:`_Lagged`)."""

    def __init__(self, comm) -> None:
        self.comm, self.pending = comm, None

    def push(self, change: Tensor) -> None:
        self.pending = self.comm.max_start(change)

    def agreed(self, tol: float) -> bool:
        if self.pending is None:
            return False
        pending, self.pending = self.pending, None  # waited for once, even if it fails
        return pending() <= tol

    def finish(self) -> None:
        """Wait for a maximum still under way (a sweep that ran to its end)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending()


class LocalComm:
    """How level-0 chunks meet when one process holds them all: they don't need to.

    A time-parallel backend (:mod:`mgrit_gru.distributed`) replaces this with one whose rank
    holds the chunks ``[c0, c1)`` of the finest level: it passes chunk-boundary states to the
    next rank, gathers C-point data for the coarse levels (which every rank then solves
    redundantly) and reduces residual norms. The cycle is otherwise the same.
    """

    first = True  # holds global point 0

    def __init__(self, reverse: Optional[bool] = None) -> None:
        self.reverse = reverse  # the pass runs through the ranks in reversed order (None: as
        # the pass under way: only a trace reads it)

    def span(self, n: int) -> tuple[int, int]:
        """This rank's chunks of the finest level, given its local chunk count."""
        return 0, n

    # Each exchange is noted in a trace being recorded (mgrit_gru.trace): what every rank of a
    # time group would send at this point of the algorithm.
    def shift(self, uend: Tensor) -> Optional[Tensor]:
        """Send this rank's last point on; the previous rank's last point (None on the first)."""
        trace.message(trace.SHIFT, uend, self.reverse)
        return None

    def gather(self, local: Tensor) -> Tensor:
        """Per-chunk values of all ranks in time order."""
        trace.message(trace.GATHER, local, self.reverse)
        return local

    def last(self, uend: Tensor) -> Tensor:
        """The global last point (held by the last rank) on every rank."""
        trace.message(trace.LAST, uend, self.reverse)
        return uend

    def broadcast_from(self, value: Tensor, pos: int) -> Tensor:
        """The value of the rank at position ``pos`` of the pass's order, on every rank."""
        trace.message(trace.FIRST if pos == 0 else trace.LAST, value, self.reverse)
        return value

    def sum_(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over the ranks, in place."""
        trace.message(trace.SUM, tensor, self.reverse)
        return tensor

    def recv_prev(self, like: Tensor) -> Optional[Tensor]:
        """A serial solve's start: the previous rank's end state (None on the first)."""
        trace.message(trace.RECV_PREV, like, self.reverse)
        return None

    def send_next(self, value: Tensor) -> None:
        """A serial solve's end state, to the next rank."""
        trace.message(trace.SEND_NEXT, value, self.reverse)

    def solve_coarse(self, solve: Callable[[], Tensor], n: int, like: Tensor) -> Tensor:
        """Run the coarse-grid solve (``solve()`` gives all level-1 points ``(N + 1, *S)``)
        and return this rank's ``n`` C-points and the next (``c0 .. c1``, both ends, of
        :meth:`span`). Here every rank runs it."""
        c0, c1 = self.span(n)
        return solve()[c0 : c1 + 1]

    def max(self, value: float) -> float:
        trace.message(trace.MAX, None, self.reverse)
        return value

    def max_start(self, value: Tensor) -> Callable[[], float]:
        """:meth:`max` of a scalar tensor begun without waiting: call the result for it."""
        trace.message(trace.MAX_LAGGED, None, self.reverse)
        return lambda: float(value)


def advance(
    op: Propagator,
    u: Tensor,
    g: Optional[Tensor],
    j0: int,
    j1: int,
    stored: Optional[Tensor] = None,
) -> Optional[Tensor]:
    """Steps ``j0 .. j1 - 1`` of every chunk: ``u[j + 1] = op(u[j], j) + g[j]``, in one call
    where the propagator offers a ``sweep`` (a compiled kernel), else step by step.

    ``stored`` (``u[j1]``'s shape, contiguous; ``j1 > j0``): an early exit's check. The states
    at ``u[j1]`` before the steps (a previous sweep's) are set aside there, and the largest
    absolute change of them is returned (a 0-dim tensor): inside the sweep where the
    propagator's kernel can (``checks`` True: each block of rows while it is in its core's
    cache, on the sweep's threads), else by a copy before and a comparison after."""
    if j1 <= j0:
        return None
    sweep = getattr(op, "sweep", None)
    if stored is not None:
        if sweep is not None and getattr(op, "checks", False):
            return sweep(u, g, j0, j1, stored)
        stored.copy_(u[j1])
        advance(op, u, g, j0, j1)
        return (u[j1] - stored).abs().max()
    if sweep is not None:
        sweep(u, g, j0, j1)
        return None
    for j in range(j0, j1):
        op(u[j], j, out=u[j + 1])
        if g is not None:
            u[j + 1].add_(g[j])
    return None


def cf_sweeps(relax: str) -> int:
    """The number of C-then-F sweeps after the first F-relaxation: "F" 0, "FCF" 1, "FCFCF" 2."""
    if not isinstance(relax, str) or not re.fullmatch(r"F(CF)*", relax):
        raise ValueError(f"relax={relax!r}: expected 'F' followed by 'CF' repeated (F, FCF, FCFCF)")
    return (len(relax) - 1) // 2


@dataclass
class SolveResult:
    """``stopped``: why an unconverged solve ended: ``"diverged"`` (a residual not finite, or
    the guard saw no progress), ``"cost"`` (the guard judged the rest dearer than the
    alternative), ``"cap"`` (``max_iters`` cycles), or None (converged, or one grid).
    ``at_floor``: converged to precision: the residual stopped falling within reach of the
    rounding floor (:meth:`mgrit_gru.core.stopping.StopTest.stalled`) above ``tol``."""

    u: Tensor  # (m, n, *S) level-0 points 0..M-1 in chunk layout
    uend: Tensor  # (*S) point M
    residuals: list[float] = field(default_factory=list)
    iterations: int = 0
    converged: bool = True
    stopped: Optional[str] = None
    at_floor: bool = False  # converged to precision: the residual stalled at rounding's floor

    @property
    def diverged(self) -> bool:
        return self.stopped == "diverged"


class _Solver:
    def __init__(
        self, grids: Sequence[Grid], ops: Sequence[Propagator], relax: str, comm, project=None
    ):
        self.grids = grids
        self.ops = ops
        for level, op in enumerate(ops):  # for traces: which level's work a step is
            if hasattr(op, "level"):
                op.level = level if len(grids) > 1 else trace.SERIAL
        self.sweeps = cf_sweeps(relax)
        self.comm = comm
        self.project = project  # applied in place to level 0's corrected C-points
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
        early: every :data:`EXIT_EVERY` steps (at most :data:`EXIT_CHECKS` times a sweep) it
        compares the new states with the stored
        ones and, once they differ by at most ``exit_tol`` everywhere, keeps the stored rest
        of every chunk. The trajectory then has one residual per chunk, at that step, of at
        most the returned difference; ``None``: the sweep ran to the end (no residual).

        A comparison is not waited for: the decision reads the previous comparison's. On
        CUDA (one process) its value is copied to the host in the background, if it has
        arrived (:class:`_Lagged`), so the stream never stalls; on a time group's ranks its
        maximum over the ranks runs while the sweep goes on (:class:`_RanksLagged`: before
        2026-12-05 each comparison was a blocking all-reduce, every EXIT_EVERY steps), and
        one process decides the same way. The exit then comes one comparison later, and the
        difference at the step where it comes is returned as it is, this rank's (the caller
        reduces it with the C-point residuals)."""
        op = self.ops[level]
        recording = getattr(op, "recording", None)
        if provisional and recording:
            op.recording = False
        # the decision reads the previous comparison: one process on CUDA without stalling
        # the stream (_Lagged), and everywhere else as ranks do (_RanksLagged), so that ranks
        # and one process exit alike
        if u.is_cuda and type(self.comm) is LocalComm:
            lagged = _Lagged()
        else:
            lagged = _RanksLagged(self.comm)
        steps = self.grids[level].m - 1
        try:
            if exit_tol is None:
                advance(op, u, g, 0, steps)
                return None
            every = max(EXIT_EVERY_CUDA if u.is_cuda else EXIT_EVERY, (steps + 1) // EXIT_CHECKS)
            done = 0  # steps taken; the checks at j = every - 1, 2 every - 1, ...
            for j in range(every - 1, steps, every):
                # one sweep through step j that sets the stored state at j + 1 aside and
                # measures its change (the check's step is the sweep's last: no call and
                # right-hand side of its own); an exit puts the stored state back
                stored = self._scratch(u)
                change = advance(op, u, g, done, j + 1, stored)
                done = j + 1
                if lagged.agreed(exit_tol):
                    u[j + 1].copy_(stored)
                    return change
                lagged.push(change)
            advance(op, u, g, done, steps)
        finally:
            lagged.finish()
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
        if level == 0 and len(self.grids) > 1:  # this rank's first C-point is the previous
            # rank's last point (a serial solve, one grid, gets its start before it begins)
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
        exit_tol: Optional[Callable[[Tensor], float]] = None,
        stored: bool = False,
    ) -> Optional[float]:
        """F-relaxation followed by ``self.sweeps`` C- and F-relaxations (F, FCF, FCFCF ...).
        ``exit_tol``: an F-relaxation that follows another may exit early (:meth:`f_relax`):
        every F after a C, and the first where ``stored`` (``u``'s F-points hold the last
        sweep's states: after a coarse correction); ``exit_tol(u)`` gives the threshold once
        the first F-relaxation has run (it may measure the states' size there). Returns the
        largest residual the exits left, or None. With C-sweeps the first F runs to the end
        (an exit there would leave a residual that a later exit does not measure); where a
        later one may exit early, the first records, since some of its F-points stay."""
        if self.sweeps == 0:
            threshold = exit_tol(u) if (exit_tol is not None and stored) else None
            return self.f_relax(level, u, g, exit_tol=threshold)
        self.f_relax(level, u, g, provisional=exit_tol is None)
        threshold = None if exit_tol is None else exit_tol(u)
        exits = []
        for sweep in range(self.sweeps):
            self.c_relax(level, u, uend, g)
            last = sweep == self.sweeps - 1
            exits.append(
                self.f_relax(
                    level, u, g, provisional=not last and exit_tol is None, exit_tol=threshold
                )
            )
        exits = [float(e) for e in exits if e is not None]  # a lagged exit's is on the device
        return max(exits) if exits else None

    # -- the cycle ------------------------------------------------------------------------
    def exact(self, level: int, u: Tensor, uend: Tensor, g: Optional[Tensor]) -> None:
        self.f_relax(level, u, g)
        self.c_relax(level, u, uend, g)

    def coarse_correct(self, level: int, u: Tensor, uend: Tensor, propagated: Tensor) -> None:
        """FAS coarse-grid correction of level ``level``'s C-points.

        ``propagated`` holds Phi_l(last F-point of chunk c) + g: the values C-points 1..n would
        take after a C-relaxation.
        """
        refresh = getattr(self.ops[level + 1], "refresh", None)
        factors = None if refresh is None else self.ops[level].chunk_factors()
        if level == 0:  # chunks may be spread over ranks: gather what the coarse level needs,
            # in one message per correction (its C-points, their propagated values and the
            # chunk factors side by side per chunk), not one each
            local = [u[0], propagated] + ([] if factors is None else [factors])
            gathered = self.comm.gather(torch.stack(local, 1))  # (chunks, 2 or 3, *S)
            c_points = torch.cat([gathered[:, 0], self.comm.last(uend).unsqueeze(0)])
            propagated = gathered[:, 1].contiguous()
            factors = None if factors is None else gathered[:, 2].contiguous()
            solve = functools.partial(self.coarse_solve, level, c_points, propagated, factors)
            solved = self.comm.solve_coarse(solve, u.shape[1], uend)
        else:
            c_points = torch.cat([u[0], uend.unsqueeze(0)])  # (n + 1, *S)
            solved = self.coarse_solve(level, c_points, propagated, factors)
        u[0] = solved[:-1]
        uend.copy_(solved[-1])
        if level == 0 and self.project is not None:  # never the given start point
            self.project(u[0, 1:] if self.comm.first else u[0])
            self.project(uend)

    def coarse_solve(
        self, level: int, c_points: Tensor, propagated: Tensor, factors: Optional[Tensor] = None
    ) -> Tensor:
        """The FAS coarse problem of level ``level``'s C-points ``(n + 1, *S)``, solved by a
        V-cycle on level ``level + 1``: the corrected C-points ``(n + 1, *S)``. ``factors``
        ``(n, *S)``: the finer level's chunk factors, for a coarse propagator that is rebuilt
        from them (its ``refresh``)."""
        if factors is not None:
            self.ops[level + 1].refresh(factors, c_points, propagated)
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


def _block_max(blocks: int, *tensors: Tensor) -> list[list[float]]:
    """Per tensor, the largest absolute value per block of its last axis (0 for an empty
    one), read from the device at once."""
    if tensors[0].numel() == 0:
        return [[0.0] * blocks for _ in tensors]
    split = (-1, blocks, tensors[0].shape[-1] // blocks)
    return torch.stack([t.abs().reshape(split).amax((0, 2)) for t in tensors]).tolist()


Guard = Callable[[list[float]], Optional[str]]
NO_TOLERANCE = StopTest()  # run the cycles asked for


class ProgressGuard:
    """A guard for :func:`solve` (the residual history after each relaxation goes in):

    - ``"diverged"`` once ``patience`` relaxations in a row bring no residual below the
      smallest so far (residuals at or below ``floor``, round-off, are not judged);
    - ``"cost"`` (given ``spent``, a callable with the cost the solve has run up so far, and
      ``alternative``, the cost of the other way to the answer) once the solve has spent the
      alternative's cost, or once finishing is predicted to cost more than the alternative
      from scratch: the last cycle's cost (the first relaxation's, before any cycle) times
      the cycles still needed, at least one; that is ``log(tol / r) / log(rate)`` with the
      last cycle's decay rate where the residual fell, else one (a residual that grew gives
      no rate: patience judges it).
    """

    def __init__(
        self,
        tol: float,
        patience: int,
        spent: Optional[Callable[[], float]] = None,
        alternative: Optional[float] = None,
        floor: float = 0.0,
    ) -> None:
        self.tol, self.patience, self.floor = tol, patience, floor
        self.spent, self.alternative = spent, alternative
        self.costs: list[float] = []  # spent after each relaxation

    def __call__(self, residuals: list[float]) -> Optional[str]:
        best = min(range(len(residuals)), key=residuals.__getitem__)
        if len(residuals) - 1 - best >= self.patience and residuals[-1] > self.floor:
            return "diverged"
        if self.spent is None or self.alternative is None:
            return None
        self.costs.append(self.spent())
        if self.costs[-1] >= self.alternative:
            return "cost"
        cycle = self.costs[-1] - (self.costs[-2] if len(self.costs) > 1 else 0.0)
        needed = 1
        if len(residuals) > 1 and 0 < residuals[-1] < residuals[-2]:
            rate = residuals[-1] / residuals[-2]
            needed = max(
                1, math.ceil(math.log(max(self.tol, 1e-300) / residuals[-1]) / math.log(rate))
            )
        return "cost" if needed * cycle > self.alternative else None


def solve(
    grids: Sequence[Grid],
    ops: Sequence[Propagator],
    u0: Tensor,
    g: Optional[Tensor] = None,
    *,
    relax: str = "FCF",
    stop: StopTest = NO_TOLERANCE,
    max_iters: int = 1,
    work: Optional[Tensor] = None,
    comm: Optional[LocalComm] = None,
    early_exit: bool = False,
    guard: Optional[Guard] = None,
    project: Optional[Callable[[Tensor], object]] = None,
    min_iters: int = 0,
) -> SolveResult:
    """Solve ``u_{k+1} = Phi_0(u_k; k) + g_k`` from ``u_0 = u0`` on the finest grid.

    Args:
        grids, ops: the hierarchy (finest first) and one propagator per level.
        u0: the initial state, shape ``S``.
        g: level-0 right-hand side in chunk layout ``(m, n, *S)``, or None for zero.
        relax: ``"F"``, ``"FCF"``, ``"FCFCF"``, ... (an F-relaxation, then C and F repeated).
        stop: the stopping test (:class:`mgrit_gru.core.stopping.StopTest`): the residual is
            the largest absolute C-point residual divided by the solution's size (the largest
            absolute C-point value after the relaxation, ``u0`` included, at least
            ``stop.data``), recorded in ``residuals``; converged at ``<= stop.tol``, or once
            it stalls at ``stop.floor`` (then ``at_floor``). ``tol=0`` with a ``max_iters``
            runs exactly that many cycles (a fixed budget).
        max_iters: cap on V-cycles.
        min_iters: V-cycles run whatever the residual (an adaptive cycle budget's minimum).
        early_exit: a level-0 F-relaxation that follows another (every F after a C; the final
            one after a coarse correction) stops once its states agree with the previous
            sweep's to ``tol`` times the solution's size (see :meth:`_Solver.f_relax`): the
            chunks have forgotten the change of their C-points, and the rest of each chunk is
            kept (not with ``stop.tol`` 0, a fixed budget: every sweep runs to its end). The
            residual is then the largest of the C-point residuals and that exit's
            (an earlier exit's that a later sweep left in place is within the threshold too,
            so a converged solve has every residual within ``tol``). Before the first
            residual the size is that of the first sweep's last F-points.
        work: optional ``(m, n, *S)`` tensor to hold the level-0 points (else allocated).
        comm: how this process's level-0 chunks meet the others' (default: it holds them all).
        guard: called after each relaxation that has not met the test with the residual
            history so far; a returned reason (``"diverged"``, ``"cost"``) abandons the solve.
            Without a guard only a residual that is not finite does.
        project: applied in place to the finest level's C-points after each coarse
            correction (e.g. a clamp to the states' range), or None. The first rank's first
            C-point is ``u0``, given data: it is left alone.

    Returns:
        :class:`SolveResult`. ``residuals`` holds the residual after each relaxation (one per
        V-cycle, then one for the final F-relaxation). An abandoned solve (``stopped``
        "diverged" or "cost") is returned as it stands; the caller decides what follows.
        With one grid the solve is the exact serial sweep and ``residuals`` is empty.
    """
    first = grids[0]
    u = u0.new_empty((first.m, first.n, *u0.shape)) if work is None else work
    # the C-points start at u0; the first F-relaxation runs to its end and writes every
    # F-point before anything reads one (a fill of all of them was a pass over the whole
    # sequence: 7 ms a solve, about 1.7% of MGRIT's training step at B = 16, one thread)
    u[0].copy_(u0.expand(first.n, *u0.shape))
    uend = u0.clone()
    comm = comm or LocalComm()
    solver = _Solver(grids, ops, relax, comm, project)
    if len(grids) == 1:
        solver.exact(0, u, uend, g)
        return SolveResult(u, uend)
    result = SolveResult(u, uend, converged=False)
    blocks = stop.blocks
    (start,) = _block_max(blocks, u0)
    sizes: Optional[list[float]] = None  # the solution's size per block at the last residual

    def threshold(points: Tensor) -> float:
        nonlocal sizes
        if sizes is None:  # the first sweep's last F-points
            (local,) = _block_max(blocks, points[-1])
            sizes = [max(a, comm.max(b)) for a, b in zip(start, local)]
        return stop.tol * min(stop.scale(size) for size in sizes)  # the smallest block's

    # a threshold of 0 (a fixed budget: tol 0) exits only where a sweep repeats the last one
    # bit for bit, and keeps then what it would compute: its checks would cost and change nothing
    exit_tol = threshold if early_exit and stop.tol > 0 else None
    for _ in range(max_iters + 1):
        final = result.iterations == max_iters
        if final:  # after a coarse correction the F-points hold the previous sweep's states
            tol_now = exit_tol(u) if (exit_tol and result.iterations) else None
            exited = solver.f_relax(0, u, g, exit_tol=tol_now)
        else:
            exited = solver.smooth(0, u, uend, g, exit_tol, stored=result.iterations > 0)
        propagated = solver.propagate_last(0, u, g)
        # per block: the largest C-point residual and the solution's size there
        local_res, local_sizes = _block_max(blocks, propagated - chunk_ends(u, uend), propagated)
        if exited is not None:  # an early exit's difference (of the whole state) counts in
            # every block: against the smallest block's size, in effect
            local_res = [max(r, float(exited)) for r in local_res]
        global_res = [comm.max(r) for r in local_res]
        sizes = [max(a, comm.max(b)) for a, b in zip(start, local_sizes)]
        # each block of the state judged by its own size (an LSTM's h beside its c)
        res = max(r / stop.scale(size) for r, size in zip(global_res, sizes))
        result.residuals.append(res)
        if not math.isfinite(res):
            result.stopped = "diverged"
            return result
        done = res <= stop.tol and result.iterations >= min_iters
        if not done and result.iterations >= min_iters and stop.stalled(result.residuals):
            done = result.at_floor = True
        if not done and not final and guard is not None:
            result.stopped = guard(result.residuals)
            if result.stopped is not None:
                return result
        if done or final:
            result.converged = done
            result.stopped = None if done else "cap"
            solver.set_c_points(0, u, uend, propagated)
            return result
        solver.coarse_correct(0, u, uend, propagated)
        result.iterations += 1
    raise AssertionError("unreachable")
