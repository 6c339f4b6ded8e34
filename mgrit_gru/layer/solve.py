"""One recurrent layer as MGRIT problems, for any cell (:mod:`mgrit_gru.layer.cell`): the
forward recurrence and its adjoint.

Forward: level 0 steps with the model's own cell, padded with identity steps to whole chunks.
The coarse levels follow ``MGRIT(coarse=...)``: ``"implicit"``: level l steps over ``m^l`` fine
steps with the implicit cell, ``dt`` = the number of real fine steps it spans and input gates
averaged over them (or injected); ``"frozen"`` / ``"secant"``: the chunk maps of
:mod:`mgrit_gru.core.coarse`, rebuilt from each sweep's gates (the forward step records its
diagonal factor per step for them: the GRU's ``1 - theta``, the LSTM's ``[0, f]``). A
layer's forward direction is padded at the end; its reverse direction (which runs from the
last input to the first) at the front, so that the chunks of both directions meet at the same
time points: the sequence start and every multiple of ``m^l`` (as time-parallel slices need).

Adjoint: ``lam_i = dL/du_i + J_i^T lam_{i+1}``, reversed in time, on the same points: its
level l is the forward level l flipped, the identity padding then on the other side. Coarse
adjoint steps are the VJPs of the coarse implicit steps, linearised at the forward state at
their coarse point, or the frozen/secant maps of the adjoint's own steps (whose diagonal
factor is the forward step's: ``D``).

The serial solve (one grid) of an unmasked layer over a small batch runs torch's own kernel
where the cell has one (``torch._VF.gru``, ``torch._VF.lstm``): per-step overhead dominates
there, and its C++ loop has less of it than any Python loop.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor

from .. import cost, kernels, trace, workspace
from ..core import (
    Grid,
    SolveResult,
    build_grids,
    chunk_view,
    flat_points,
    pad_steps,
    solve,
    stopping,
)
from ..core.coarse import DiagonalStep, SecantStep, chunk_product
from ..core.cycle import LocalComm, ProgressGuard
from ..core.stopping import StopTest
from ..options import MGRIT, Implicit, Secant, Stopping
from ..stats import SolveStats
from .cell import Cell
from .control import DivergenceError, DivergenceWarning, solve_guarded, warn_tol_raised

__all__ = ["DivergenceError", "DivergenceWarning", "adjoint_solve", "forward_solve"]

# Work buffers that the forward and the backward share (a layer's forward solve and a backward
# never run inside one another): the forward's input gates and the adjoint's coefficients C
# (a few H per step), the level-0 states of either solve in chunk layout. The backward's
# other buffers have their own names.
WIDE, CHUNKS = "gates", "level-0 chunks"


class _Compiled:
    """A propagator's compiled path (its ``_run(x0, out, g, j0, j1, check)`` calls the
    kernel): ``sweep``, many steps of every chunk in one call, and one step into ``out``."""

    def _use(self, kernel) -> None:
        # the compiled module that runs this level's steps (mgrit_gru.kernels), or None: the
        # cell's PyTorch step; with one, `sweep` runs many steps in one call, and the C++
        # module's checks an early exit's change in it (`checks`: core.cycle.advance)
        self.kernel = kernel
        self.sweep = None if kernel is None else self._sweep
        self.checks = kernel is not None and kernel.name == "compiled"

    def _sweep(
        self, u: Tensor, g: Optional[Tensor], j0: int, j1: int, stored: Optional[Tensor] = None
    ) -> Optional[Tensor]:
        """Steps ``j0 .. j1 - 1`` of every chunk in one compiled call: ``u[j + 1] =
        Phi(u[j]) + g[j]`` (``u`` in chunk layout ``(m, n, B, S)``); ``stored``: ``u[j1]``'s
        states are set aside there, and their largest absolute change is returned."""
        check = () if stored is None else (stored, stored.new_empty(()))
        gs = None if g is None else g[j0:j1]
        self._run(u[j0].unsqueeze(0), u[j0 + 1 : j1 + 1], gs, j0, j1, check)
        return check[1] if check else None

    def _step(self, u: Tensor, j: int, out: Optional[Tensor]) -> Tensor:
        out = torch.empty_like(u) if out is None else out
        self._run(u.unsqueeze(0), out.unsqueeze(0), None, j, j + 1)
        return out


class ForwardStep(_Compiled):
    """Propagator of a forward level: the cell's steps with input gates ``(M, B, gates * H)``
    and sizes ``dt``. ``factors`` ``(M, B, S)``: where each step leaves its diagonal factor, for
    :meth:`chunk_factors`; ``meter``: a :class:`mgrit_gru.cost.Meter` the steps report to."""

    level = 0  # its MGRIT level (-1: a serial sweep), set by the cycle: for traces

    def __init__(
        self, grid, gates, w_hh, rb, cell, dt=None, keep=None, factors=None, meter=None, kernel=None
    ):
        self.gx = chunk_view(gates, grid)  # computed with the cell's fold_bias
        self._use(kernel)
        self.factors = None if factors is None else chunk_view(factors, grid)
        self.meter = meter
        # keep (M, B, kept * H): where every step leaves its gates for the backward (level 0);
        # the cycle turns `recording` off for sweeps that a later one overwrites
        self.keep = None if keep is None else chunk_view(keep, grid)
        self.recording = keep is not None
        self.dt = None
        if dt is not None:  # (M,) per step, or (M, B) per step and sequence: -> (m, n, ., 1)
            self.dt = chunk_view(dt, grid).reshape(grid.m, grid.n, -1, 1)
        self.w_hh, self.rb, self.cell = w_hh, rb, cell
        # Level 0 carries no dt: its padding, steps [lo, hi) of chunk c, is kept as identity.
        self.pad = None
        if dt is None and grid.M > grid.N:
            last = grid.n - 1
            self.pad = (0, 0, grid.off) if grid.off else (last, grid.N - last * grid.m, grid.m)

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        if self.kernel is not None and j is not None:
            return self._step(u, j, out)
        gx = self.gx if j is None else self.gx[j]
        dt = None if self.dt is None else (self.dt if j is None else self.dt[j])
        keep = None
        if self.recording:
            keep = self.keep if j is None else self.keep[j]
        factor = None
        if self.factors is not None:
            factor = self.factors if j is None else self.factors[j]
        res = self.cell.step(u, gx, self.w_hh, self.rb, dt, out=out, keep=keep, factor=factor)
        if self.meter is not None:
            self.meter.add("step", u.numel() // u.shape[-1], level=self.level)
        if self.pad is not None:
            c, lo, hi = self.pad
            if j is None:
                res[lo:hi, c].copy_(u[lo:hi, c])
            elif lo <= j < hi:
                res[c].copy_(u[c])
                if factor is not None:
                    factor[c] = 1.0
        return res

    def _run(
        self, x0: Tensor, out: Tensor, g: Optional[Tensor], j0: int, j1: int, check=()
    ) -> None:
        S = j1 - j0
        keep = self.keep[j0:j1] if self.recording else None
        factor = None if self.factors is None else self.factors[j0:j1]
        dt = None if self.dt is None else self.dt[j0:j1].expand(*out.shape[:-1], 1)
        pad = (-1, 0, 0) if self.pad is None else self.pad
        self.cell.kernel_forward(
            self.kernel,
            x0,
            out,
            self.gx[j0:j1],
            self.w_hh,
            self.rb,
            g,
            keep,
            factor,
            dt,
            pad,
            j0,
            check,
        )
        if self.meter is not None:
            rows = out[0].numel() // out.shape[-1]
            self.meter.add("step", rows, S, level=self.level, cost_kind="sweep")

    def chunk_factors(self) -> Tensor:
        """Per chunk ``(n, B, S)``: the product of its steps' factors along the last sweep."""
        return chunk_product(self.factors, self.kernel)


class AdjointStep(_Compiled):
    """Propagator of an adjoint level: ``lam -> J^T lam``, the cell's adjoint step with
    coefficients ``D`` and ``C`` (GRU: ``D * lam + (C * lam3) @ W_hh``)."""

    level = 0  # as ForwardStep's

    def __init__(self, grid, D, C, w_hh, cell, meter=None, kernel=None):
        self.D, self.C, self.w_hh = chunk_view(D, grid), chunk_view(C, grid), w_hh
        self.cell = cell
        self.meter = meter
        self._factors: Optional[Tensor] = None
        self._use(kernel)

    def _run(
        self, x0: Tensor, out: Tensor, g: Optional[Tensor], j0: int, j1: int, check=()
    ) -> None:
        D, C = self.D[j0:j1], self.C[j0:j1]
        self.cell.kernel_adjoint(self.kernel, x0, out, D, C, self.w_hh, g, check)
        if self.meter is not None:
            rows = out[0].numel() // out.shape[-1]
            self.meter.add("adjoint", rows, j1 - j0, level=self.level, cost_kind="sweep_adjoint")

    def __call__(self, u: Tensor, j: Optional[int], out: Optional[Tensor] = None) -> Tensor:
        if self.kernel is not None and j is not None:
            return self._step(u, j, out)
        if self.meter is not None:
            self.meter.add("adjoint", u.numel() // u.shape[-1], level=self.level)
        if j is None:
            return self.cell.adjoint_step(u, self.D, self.C, self.w_hh, out)
        return self.cell.adjoint_step(u, self.D[j], self.C[j], self.w_hh, out)

    def chunk_factors(self) -> Tensor:
        """Per chunk ``(n, B, S)``: the product of ``D`` (the frozen-gate part of ``J^T``)."""
        if self._factors is None:  # a linear recurrence: the same in every cycle
            self._factors = chunk_product(self.D, self.kernel)
        return self._factors


@dataclass
class Hierarchy:
    """Forward grids and the coarse levels' (real, unpadded) gates and step sizes.

    ``gates[l]`` ``(N_l, B, gates * H)`` and ``dts[l]`` ``(N_l,)`` for levels ``l >= 1``
    (implicit coarse levels only); index 0 is None: the fine input gates are recomputed where
    needed rather than kept. ``kept``: the fine steps' gates ``(T, B, kept * H)`` (the GRU's
    ``[r, z, n, gh_n]``, the LSTM's ``[i, f, g, o]``) from the forward's last sweep (a
    leased workspace tensor, see :func:`release_kept`), or None: recomputed in the backward.
    """

    grids: list[Grid]
    gates: list[Optional[Tensor]]
    dts: list[Optional[Tensor]]
    front: bool = False  # padded at the front (a reverse direction)
    c_points: Optional[Tensor] = None  # time-parallel: all ranks' forward C-point states
    kept: Optional[Tensor] = None
    # the forward's points hold h only between the ends (a cell's fused forward whose kernel
    # returns no more): Cell.complete_points fills the rest where the backward needs it
    partial: bool = False
    # torch's kernel ran the serial forward under autograd (the compiled kernels' choice,
    # _serial_by_torch): its graph, which the backward's torch kernel runs back through
    graph: Optional[tuple] = None

    def release_kept(self) -> None:
        """Hand the kept gates back to the workspace (a later backward recomputes them)."""
        if self.kept is not None:
            workspace.give_back(self.kept)
            self.kept = None

    def coarse_points(self, points: Tensor, level: int, cfactor: int) -> Tensor:
        """Forward states at the starts of level ``level``'s real steps: from fine point 0 in
        strides of ``m^level``, or, with front padding, back from the last point (a start
        inside the padding is point 0)."""
        source, stride = points, cfactor**level
        if self.c_points is not None:  # level-1 points
            source, stride = self.c_points, cfactor ** (level - 1)
        last = source.shape[0] - 1
        if not self.front:
            return source[0:last:stride]
        steps = torch.arange(self.grids[level].N, 0, -1, device=source.device)
        return source[(last - stride * steps).clamp_min(0)]


def input_gates(x: Tensor, w_ih: Tensor, b_ih: Optional[Tensor], out: Optional[Tensor] = None):
    """``W_ih x_t + b_ih`` for all t at once ``(T, B, gates * H)``: one GEMM over ``T * B``
    rows."""
    flat = x.reshape(-1, x.shape[-1])
    shape = (*x.shape[:-1], w_ih.shape[0])
    if out is None:
        out = x.new_empty(shape)
    if b_ih is None:
        torch.mm(flat, w_ih.t(), out=out.view(-1, shape[-1]))
    else:
        torch.addmm(b_ih, flat, w_ih.t(), out=out.view(-1, shape[-1]))
    return out


def step_weights(grid: Grid, mask: Optional[Tensor], like: Tensor) -> Tensor:
    """Fine step sizes padded to the grid: 1 per real step, or the per-sequence ``mask``
    ``(T, B)`` (1 up to each sequence's length, then 0: identity steps)."""
    real = like.new_ones(grid.N) if mask is None else mask
    return pad_steps(real, grid)


def column(dt: Tensor) -> Tensor:
    """Step sizes ``(N,)`` or ``(N, B)`` as a ``(N, 1 or B, 1)`` factor on states."""
    return dt.reshape(dt.shape[0], -1, 1)


def coarsen(g_fine: Tensor, w_fine: Tensor, fine: Grid, options: MGRIT) -> tuple[Tensor, Tensor]:
    """One coarsening: per chunk of ``fine``, the coarse step's input gates and ``dt`` from the
    padded fine gates ``(M, B, 3H)`` and step sizes ``(M,)`` or ``(M, B)``."""
    g = g_fine.view(fine.n, fine.m, *g_fine.shape[1:])
    w = w_fine.view(fine.n, fine.m, *w_fine.shape[1:])
    dt = w.sum(1)
    if options.coarse.gates == "inject":  # a sequence's real steps are a prefix
        return g[:, 0].clone(), dt
    if w.dim() == 2:  # dt-weighted mean over the real fine steps: one batched GEMM
        avg = torch.bmm(w.unsqueeze(1), g.reshape(fine.n, fine.m, -1)).squeeze(1)
        return (avg / dt.unsqueeze(1)).view(fine.n, *g_fine.shape[1:]), dt
    # per-sequence weights; an all-padding interval gets zero gates (dt = 0)
    avg = torch.einsum("cjb,cjbk->cbk", w, g)
    return avg / dt.clamp_min(1.0).unsqueeze(-1), dt


def build_hierarchy(
    gx_pad: Tensor, grids: list[Grid], options: MGRIT, w0: Tensor, gather=None, front=False
) -> Hierarchy:
    """Coarse gates from the fine gates ``gx_pad`` ``(M_0, B, 3H)`` (zero past T) and the fine
    step sizes ``w0`` ``(M_0,)`` or ``(M_0, B)``. A coarse step's ``dt`` is the number of real
    fine steps it spans (per sequence, with a mask). ``gather`` joins the level-1 values of
    all ranks when the fine level is spread over processes. Only the implicit coarse
    correction reads these; the others get a hierarchy without them."""
    gates, dts = [None], [None]
    if not isinstance(options.coarse, Implicit):
        return Hierarchy(grids, [None] * len(grids), [None] * len(grids), front)
    g_fine, w_fine = gx_pad, w0
    for lvl, (fine, coarse) in enumerate(zip(grids[:-1], grids[1:])):
        gate, dt = coarsen(g_fine, w_fine, fine, options)
        if lvl == 0 and gather is not None:
            gate, dt = gather(gate), gather(dt)
        gates.append(gate)
        dts.append(dt)
        g_fine, w_fine = pad_steps(gate, coarse), pad_steps(dt, coarse)
    return Hierarchy(grids, gates, dts, front)


def _solve_on(comm, grids, ops, u0, g, work, **options):
    """The core solve on this process's part of the finest level. Without coarse levels the
    ranks step through their slices in turn: each starts from the previous rank's end."""
    if len(grids) == 1:
        comm = comm or LocalComm()
        start = comm.recv_prev(u0)
        result = solve(grids, ops, u0 if start is None else start, g, work=work)
        comm.send_next(result.uend)
        return result
    return solve(grids, ops, u0, g, work=work, comm=comm, **options)


def _grids(T_local: int, options: MGRIT, levels: int, front: bool, tg):
    """The hierarchy; with a time-parallel context its finest level is this rank's chunks."""
    T = T_local if tg is None else tg.steps
    grids = build_grids(T, options.cfactor, levels or options.num_levels(T), front=front)
    if tg is None:
        return grids
    if len(grids) == 1:  # no coarse level: each rank steps through its slice in turn
        return [Grid(N=T_local, m=T_local, n=1)]
    c0, c1 = tg.spans[tg.rank]
    m = options.cfactor
    local = Grid(N=T_local, m=m, n=c1 - c0, off=((c1 - c0) * m - T_local) if front else 0)
    return [local] + grids[1:]


# Keeping a step's gates costs a fixed ~20 us per batched step on the CPU (a scratch lookup,
# views, a copy) and saves ~0.4 us per row in the backward (no GEMM, less gate math): it pays
# from about 50 rows per step. So MGRIT's wide steps keep them; the serial sweep over a small
# batch (B rows per step) recomputes. Decided on the global grid, so that time-parallel ranks
# decide as one process would.
KEEP_MIN_ROWS = 64


def _worth_keeping(grids: list[Grid], batch: int, steps: int) -> bool:
    """Whether the fine steps of ``grids`` (MGRIT's, or one serial grid) over a sequence of
    ``steps`` (all ranks') are wide enough to keep their gates."""
    chunks = 1 if len(grids) == 1 else -(-steps // grids[0].m)
    return chunks * batch >= KEEP_MIN_ROWS


# The serial forward runs torch.nn.GRU's own CPU loop where that is faster than the library's
# step: below about FUSED_MAX = batch x hidden (per-step overhead dominates; torch's C++ loop
# has less of it). Above it the library's step (fewer elementwise passes) wins. Measured on
# the CPU with benchmarks/step_cost.py (one thread, H = 32-128).
FUSED_MAX = 4096


def _torch_kernel_fits(x, w_hh, b_ih, b_hh, mask, tg) -> bool:
    """Whether torch's own kernel can take this layer's serial solve: in one process, every
    step real, both biases or none, and a shape where it is faster: its CPU loop below
    FUSED_MAX = batch x hidden, cuDNN on CUDA always (no Python loop competes with it)."""
    if mask is not None or tg is not None or (b_ih is None) != (b_hh is None):
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and x.shape[1] * w_hh.shape[1] <= FUSED_MAX


def compiled_kernel(cell: Cell, x: Tensor):
    """The compiled module that runs this layer's sweeps (:mod:`mgrit_gru.kernels`, by the
    cell's choice or the process default), or None: the cell's PyTorch steps. Not while a
    trace counts operators (the device models priced by operators count the PyTorch
    steps'); a trace otherwise records the compiled steps as the "sweep" kinds."""
    return kernel_for(cell.kernels, x)


def kernel_for(choice: Optional[str], like: Tensor):
    """:func:`compiled_kernel` for kernels ``choice`` (None: the process default) on
    ``like``'s device and dtype."""
    if trace.counting():
        return None
    return kernels.compiled_for(kernels.check(choice or kernels.process_default()), like)


def step_kind(choice: Optional[str] = None, device: str = "cpu", dtype=torch.float32) -> str:
    """The cost model's kind of the fine steps that a solve on ``device`` in ``dtype`` runs
    under kernels ``choice`` (None: the process default), for ``cfactor="auto"``: "sweep"
    where the compiled CPU sweeps run them (a few rows' worth of fixed cost a step, where the
    PyTorch steps have some 80-110: the rule then takes longer chunks), else "step" (the
    PyTorch steps; also beside the Triton sweeps, whose costs are projected, not measured, and
    while a trace counts operators, as :func:`compiled_kernel`). Never raises: where the
    kernels asked for do not serve (a solve would say so), "step"."""
    if str(device).split(":")[0] != "cpu":
        return "step"
    try:
        kernel = kernel_for(choice, torch.empty(0, dtype=dtype))
    except (RuntimeError, ValueError):
        return "step"
    return "sweep" if kernel is not None and kernels_name(kernel, False) == "compiled" else "step"


def kernels_name(kernel, torch_kernel: bool) -> str:
    """What :attr:`mgrit_gru.stats.SolveStats.kernels` reports: "torch" (torch's own kernel
    solved it serially), the compiled module's name ("compiled" for the C++ one, "triton"),
    or "pytorch"."""
    if torch_kernel:
        return "torch"
    return "pytorch" if kernel is None else getattr(kernel, "name", "compiled")


def compiled_passes(cell: Cell, kernel) -> bool:
    """Whether the cell runs the whole-sequence passes around MGRIT's adjoint (coefficients,
    gate gradients) as compiled calls for ``kernel`` (else PyTorch code per time block)."""
    offered = getattr(cell, "compiled_passes", None)
    return kernel is not None and offered is not None and offered(kernel)


def _torch_serial(kernel) -> bool:
    """Whether a serial solve takes torch's own kernel where it fits the layer: without a
    compiled one, and beside the Triton sweeps (cuDNN's loop walks a serial sequence faster
    than a sweep kernel; they serve MGRIT and the shapes cuDNN refuses). Beside the compiled
    CPU sweeps the cost model decides (:func:`_serial_by_torch`)."""
    return kernel is None or getattr(kernel, "serial_by_torch", False)


def serial_prices(cell: Cell, x: Tensor, H: int, train: bool) -> Optional[tuple[float, float]]:
    """``(torch's kernel, the compiled sweeps)``: the cost model's price of this layer's
    serial solve each way on the CPU (:data:`mgrit_gru.cost.SERIAL_KINDS`; the forward, and
    the adjoint where ``train``), or None for a cell that states no such prices."""
    kinds = getattr(cell, "serial_kinds", None)
    if not kinds:
        return None
    T, B = x.shape[:2]
    torch_fwd, torch_adj, sweep_fwd, sweep_adj = kinds
    ways = ((torch_fwd, torch_adj), (sweep_fwd, sweep_adj))
    return tuple(
        sum(cost.serial_solve_us(k, T, B, H, x.dtype) for k in (fwd, adj)[: 1 + int(train)])
        for fwd, adj in ways
    )


_forced_way: Optional[str] = None  # serial_way's


@contextlib.contextmanager
def serial_way(way: str):
    """Inside the block, where :func:`_serial_by_torch` decides, the serial solve takes
    ``way`` ("torch" or "sweep") whatever the cost model says: for the calibration, which
    measures both (never a library call's choice)."""
    global _forced_way
    if way not in ("torch", "sweep"):
        raise ValueError(f"serial_way: give 'torch' or 'sweep', not {way!r}")
    old, _forced_way = _forced_way, way
    try:
        yield
    finally:
        _forced_way = old


def _serial_by_torch(cell: Cell, kernel, x, w_hh, b_ih, b_hh, mask, tg, train: bool) -> bool:
    """Beside the compiled CPU sweeps: whether the serial solve takes torch's kernel (a cell
    with one and with prices for both ways, torch's conditions met (every step real, one
    process, both biases or none), no trace recording (a trace stands for ranks, which run
    the sweeps), and the cost model's price of torch's way below the sweeps' (forward and
    adjoint where a backward follows: ``train``; the forward alone else). A function of
    counts and the table in use only."""
    if kernel is None or _torch_serial(kernel) or x.device.type != "cpu" or not cell.fused:
        return False
    if mask is not None or tg is not None or (b_ih is None) != (b_hh is None) or trace.active():
        return False
    if _forced_way is not None:  # the calibration's measurement of each way
        return _forced_way == "torch" and getattr(cell, "serial_kinds", None) is not None
    prices = serial_prices(cell, x, w_hh.shape[1], train)
    return prices is not None and prices[0] < prices[1]


def coarse_forward_ops(
    hier: Hierarchy, options: MGRIT, w_hh, rb, cell: Cell, meter, kernel=None
) -> list:
    """The propagators of the forward's coarse levels."""
    grids = hier.grids
    if isinstance(options.coarse, Implicit):
        return [
            ForwardStep(
                g,
                pad_steps(hier.gates[lvl], g),
                w_hh,
                rb,
                implicit_of(cell),
                pad_steps(hier.dts[lvl], g),
                meter=meter,
                kernel=kernel,
            )
            for lvl, g in enumerate(grids)
            if lvl > 0
        ]
    return chunk_map_ops(grids, options, kernel)


def chunk_map_ops(grids: list[Grid], options: MGRIT, kernel=None) -> list:
    """Frozen (or, on level 1, secant) chunk maps for every coarse level; ``kernel``: the
    layer's compiled module, whose ``map_sweep`` (where it has one) runs their sweeps."""
    ops = []
    for lvl, g in enumerate(grids):
        if lvl == 1 and isinstance(options.coarse, Secant):
            ops.append(SecantStep(g, options.coarse.depth, kernel))
        elif lvl > 0:
            ops.append(DiagonalStep(g, kernel))
    return ops


def _least(grids: list[Grid], kind: str, B: int, H: int, x: Tensor, cell: Cell, tg) -> float:
    """The modelled least cost of an MGRIT solve on ``grids`` (its first F-relaxation on level
    0, :func:`mgrit_gru.cost.first_relaxation_us`), for the automatic choice; 0 (no a-priori
    test) for a serial grid or a time group's ranks (whose slices differ: they decide on what
    their solves cost, alike)."""
    if len(grids) == 1 or tg is not None:
        return 0.0
    fine = grids[0]
    device, costs, threads = x.device.type, cell.costs, cost.pricing_threads()
    return cost.first_relaxation_us(
        kind, fine.m, fine.n, B, H, device, costs, x.dtype, len(grids), threads
    )


def _guard(options: MGRIT, rule: Stopping, meter: cost.Meter, serial: float, tg):
    """The guard of one solve: none under a budget; the cost part only in one process (the
    ranks of a time group must decide alike, and their meters count their own slices)."""
    if options.budget is not None:
        return None
    if tg is not None or not options.guard.cost:
        return ProgressGuard(rule.tol, options.guard.patience, floor=rule.floor)
    return ProgressGuard(rule.tol, options.guard.patience, lambda: meter.spent, serial, rule.floor)


def _stopping(options: MGRIT, pass_: str, grids: list[Grid], x: Tensor) -> Stopping:
    """The stopping rule of one solve in ``x``'s dtype on its device, for the chunk length
    of ``grids``; a tolerance below the rounding floor is raised to it (one warning)."""
    kind = x.device.type
    m = grids[0].m if len(grids) > 1 else 1
    rule = options.stopping(
        pass_, stopping.roundoff(x.dtype, kind), stopping.floor(x.dtype, kind, m)
    )
    if rule.asked is not None and len(grids) > 1:
        warn_tol_raised(pass_, rule, x.dtype)
    return rule


def _budget_plan(options: MGRIT, pass_: str, grids: list[Grid], x: Tensor, where, control):
    """A cycle budget's rule for this solve from the module's memory (None: no budget, the
    serial grid, or no memory), and the stopping rule it makes."""
    memory = getattr(control, "budget", None)
    if options.budget is None or len(grids) == 1 or memory is None:
        return None, None
    plan = memory.plan((pass_, *where), options.budget)
    floor = stopping.floor(x.dtype, x.device.type, grids[0].m) if plan.tol > 0.0 else 0.0
    return plan, Stopping(max(plan.tol, floor) if plan.tol > 0.0 else 0.0, plan.max_iters, floor)


def _relative(a: Tensor, b: Tensor, norm: str) -> float:
    """``a``'s error against ``b``, relative to ``b``: in the largest value ("max") or the
    2-norm ("two"), in float64."""
    d = (a.double() - b.double()).nan_to_num(posinf=1e300, neginf=1e300)
    if norm == "max":
        return float(d.abs().max() / b.double().abs().max().clamp_min(1e-300))
    return float(d.norm() / b.double().norm().clamp_min(1e-300))


def _learn(control, pass_, where, plan, result, measured, options, name) -> None:
    memory = control.budget
    key = (pass_, *where)
    memory.learn(key, plan, result.residuals, result.iterations, measured)
    if pass_ == "backward" and measured is not None:
        from ..options import DEFAULT_THETA

        memory.judge(key, options.budget, DEFAULT_THETA, name)


def implicit_of(cell: Cell) -> Cell:
    """The cell's variant that steps Implicit coarse levels; an error where it has none."""
    if cell.implicit is None:
        name = cell.name.upper()
        raise ValueError(
            f"{name}: MGRIT(coarse='implicit') steps coarse levels with the implicit GRU, "
            f"which the {name} has no analogue of; use coarse='secant' (the default) or "
            "'frozen'"
        )
    return cell.implicit


def forward_solve(
    x: Tensor,
    h0: Tensor,
    w_ih: Tensor,
    b_ih: Optional[Tensor],
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: Cell,
    options: MGRIT,
    where=(0, False),
    mask: Optional[Tensor] = None,
    tg=None,
    keep: bool = False,
    control=None,
) -> tuple[Tensor, Hierarchy, SolveStats]:
    """Solve one layer of ``cell`` forward for x ``(T, B, I)``, h0 ``(B, S)`` (the cell's
    start state, ``S = cell.state * H``); ``mask`` ``(T, B)`` (1 up to
    each sequence's length, 0 after) makes the steps past a sequence's end identity steps.
    ``where`` is (layer, reverse): a reverse direction gets x already flipped in time and is
    padded at the front. With ``tg`` (a :class:`mgrit_gru.distributed.TimeContext`), x is
    this rank's time slice and the returned points are its slice's; a reverse direction
    passes the slices in reversed rank order. ``keep``: the fine steps of the last sweep
    keep their gates for the backward (``hier.kept``). ``control``: see
    :func:`mgrit_gru.layer.control.solve_guarded`.

    Returns all points ``(T + 1, B, S)`` (point 0 is h0; a fresh tensor), the hierarchy (for
    the adjoint) and the stats.
    """
    T, B = x.shape[:2]
    front = where[1]
    trace.phase("forward", reverse=front)
    comm = None if tg is None else tg.comm(reverse=front)
    grids = _grids(T, options, 0, front, tg)
    M, off = grids[0].M, grids[0].off
    H = w_hh.shape[1]
    S = h0.shape[-1]
    rb = cell.recurrent_bias(b_hh, H)
    steps = T if tg is None else tg.steps
    kernel = compiled_kernel(cell, x)
    fused = (
        _torch_serial(kernel) and cell.fused and _torch_kernel_fits(x, w_hh, b_ih, b_hh, mask, tg)
    )
    # beside the compiled CPU sweeps, torch's kernel where the cost model prices it lower;
    # where a backward follows (keep) it runs under autograd and keeps its graph for it
    by_torch = _serial_by_torch(cell, kernel, x, w_hh, b_ih, b_hh, mask, tg, keep)
    fused = fused or by_torch
    threads = cost.pricing_threads(tg is not None)
    meter = cost.Meter(H, x.device.type, cell.costs, x.dtype, threads)
    # (torch's kernel beside the sweeps: priced in the sweeps' units, below)
    serial_kind = "fused" if fused and not by_torch else ("sweep" if kernel is not None else "step")
    serial_cost = cost.serial_us(
        serial_kind, steps, B, H, x.device.type, cell.costs, x.dtype, threads
    )
    if by_torch:  # in the sweeps' units that MGRIT's meter counts: theirs, times torch's
        # kernel's price over theirs
        torch_us, sweep_us = serial_prices(cell, x, H, False)
        serial_cost *= torch_us / sweep_us
    least = _least(grids, "sweep" if kernel is not None else "step", B, H, x, cell, tg)
    # a compiled step keeps its gates in its own loop, at a cost of a copy: always worth it
    worth_keeping = kernel is not None or _worth_keeping(grids, B, steps)
    hier = Hierarchy(grids, [None] * len(grids), [None] * len(grids), front)
    # the input gates, made on their first use; the fused solve's points, and whether it ran
    state: dict = {"fused": fused}

    def gates() -> Tensor:
        if "gx" not in state:
            gx = workspace.buffer(WIDE, (M, B, w_ih.shape[0]), x)
            gx[:off] = 0.0
            with trace.bulk("gates", T * B, H, x):
                input_gates(x, w_ih, cell.fold_bias(b_ih, b_hh, H), out=gx[off : off + T])
            gx[off + T :] = 0.0
            state["gx"] = gx
        return state["gx"]

    def coarse_gates() -> None:  # of the MGRIT grids; gathered over a time group's ranks
        if hier.gates[-1] is None:
            gather = None if comm is None else comm.gather
            w0 = step_weights(grids[0], mask, gates())
            built = build_hierarchy(gates(), grids, options, w0, gather, front)
            hier.gates, hier.dts = built.gates, built.dts

    kept = None
    if keep and worth_keeping:
        kept = workspace.lease((M, B, cell.kept * H), x)
    if tg is not None and len(grids) > 1 and isinstance(options.coarse, Implicit):
        coarse_gates()  # a collective: every rank, whichever grid it runs

    rule = _stopping(options, "forward", grids, x)
    plan, planned = _budget_plan(options, "forward", grids, x, where, control)
    rule = planned or rule

    def run(grids: list[Grid]) -> SolveResult:
        fine = grids[0]  # or the serial grid, without padding
        if len(grids) == 1 and state["fused"]:
            # noted as a time group's serial solve would run (before the loop: its operators
            # belong to the steps' event); a refused shape notes it again below, harmlessly
            trace.message(trace.RECV_PREV, h0)
            if by_torch and keep:
                state["points"], hier.graph = cell.fused_forward_graph(
                    x, h0, w_ih, w_hh, b_ih, b_hh
                )
            else:
                state["points"] = cell.fused_forward(x, h0, w_ih, w_hh, b_ih, b_hh)
            if state["points"] is not None:
                meter.add("fused", B, T, level=trace.SERIAL)
                trace.message(trace.SEND_NEXT, state["points"][T])
                return SolveResult(state["points"][:T].unsqueeze(1), state["points"][T])
            state["fused"] = False  # cuDNN refused the shape: the library's own loop solves it
        gx = gates()
        dt = None if mask is None else step_weights(fine, mask, gx)
        lo = off - fine.off
        k = kept[lo : lo + fine.M] if kept is not None else None
        coarse_ops = []
        factors = None
        if len(grids) > 1:
            if isinstance(options.coarse, Implicit):
                coarse_gates()  # the implicit coarse steps' gates
            else:
                factors = workspace.buffer("fwd.factors", (fine.M, B, S), x)  # chunk maps'
            coarse_ops = coarse_forward_ops(hier, options, w_hh, rb, cell, meter, kernel)
        fine_op = ForwardStep(
            fine, gx[lo : lo + fine.M], w_hh, rb, cell, dt, k, factors, meter, kernel
        )
        if len(grids) == 1:  # the serial grid's chunk layout is time order: solve in the
            # points themselves (no copy out of a work buffer)
            state["points"] = h0.new_empty((fine.M + 1, *h0.shape))
            work = state["points"][: fine.M].view(fine.m, fine.n, *h0.shape)
        else:
            work = workspace.buffer(CHUNKS, (fine.m, fine.n, *h0.shape), h0)
        return _solve_on(
            comm,
            grids,
            [fine_op] + coarse_ops,
            h0,
            None,
            work,
            relax=options.relax,
            stop=StopTest(rule.tol, rule.floor, blocks=cell.state),
            max_iters=rule.max_iters,
            early_exit=options.early_exit,
            guard=_guard(options, rule, meter, serial_cost, tg),
            project=cell.state_clamp(h0) if options.budget and options.budget.clamp else None,
            min_iters=0 if plan is None else plan.min_iters,
        )

    grids, result, stats = solve_guarded(
        "forward",
        options,
        run,
        grids,
        where,
        control,
        lambda: meter.spent,
        serial_cost,
        cell.name.upper(),
        least,
    )
    fused = state["fused"]
    if kept is not None:  # whichever grid ran, the real steps sit at [off, off + T)
        hier.kept = kept[off : off + T]
        if not (kernel is not None or _worth_keeping(grids, B, steps)) or (
            len(grids) == 1 and fused
        ):
            hier.release_kept()
    off = grids[0].off
    if len(grids) == 1 and fused:
        points = state["points"]
        hier.partial = not cell.fused_complete
    elif len(grids) == 1:  # solved in place (run): the last point completes them
        points = state["points"]
        points[T] = result.uend
    else:
        points = flat_points(result.u, result.uend)[off : off + T + 1]
    # a budget learns its error; at a check against the exact states (not while a trace
    # records: a trace stands for the ranks' training step, which the check is not part of)
    if plan is not None:
        measured = None
        if plan.check and tg is None and not trace.active():
            with torch.no_grad():
                exact, _ = cell.reference_layer(x, h0, w_ih, w_hh, b_ih, b_hh, mask)
            measured = _relative(points[1:], exact, "max")
        _learn(control, "forward", where, plan, result, measured, options, cell.name.upper())
    if comm is not None and len(grids) > 1:  # the ranks' C-points, for the adjoint's coarse
        hier.c_points = torch.cat([comm.gather(result.u[0]), comm.last(result.uend)[None]])
    elif len(grids) > 1:  # what a time group would exchange here
        trace.message(trace.GATHER, result.u[0])
        trace.message(trace.LAST, result.uend)
    ran = kernels_name(kernel, len(grids) == 1 and fused)
    stats = replace(stats, kernels=ran, row_steps=meter.row_steps)
    return points, hier, stats


BLOCK_ROWS = 2048  # rows (steps x batch) per block of whole-sequence elementwise work
# on a GPU: a block is a few kernel launches whatever its rows, and no cache to stay in
DEVICE_BLOCK_ROWS = 1 << 20


def reversed_time(src: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``src`` in reversed order along dim 0 (time), written into ``out`` if given: one pass,
    where ``out[...] = src.flip(0)`` makes a flipped temporary and copies it (2.2x the time
    here)."""
    steps = torch.arange(src.shape[0] - 1, -1, -1, device=src.device)
    return torch.index_select(src, 0, steps, out=out)


def time_blocks(T: int, B: int, like: Tensor):
    """Blocks ``[k0, k1)`` of time steps of about BLOCK_ROWS rows on the CPU: the elementwise
    chains over all steps then run on cache-resident temporaries instead of whole-sequence
    tensors. On another device (``like``'s) DEVICE_BLOCK_ROWS: there a block costs its launches
    (at T = 16384, B = 16 the CPU's blocks made 3/4 of a training step's operators)."""
    rows = BLOCK_ROWS if like.device.type == "cpu" else DEVICE_BLOCK_ROWS
    size = max(1, rows // max(B, 1))
    for k0 in range(0, T, size):
        yield k0, min(T, k0 + size)


def fine_coefficients(
    points, x, w_ih, b_ih, w_hh, b_hh, cell, M, off, mask=None, kept=None, kernel=None
):
    """Adjoint coefficients of every fine step, reversed in time and padded to ``M`` steps
    with identity steps, ``off`` of them in front: step ``k`` lands at reversed index
    ``off + T - 1 - k``. From the forward's ``kept`` gates ``(T, B, kept * H)`` when given
    (no GEMM): in one compiled pass over all steps where the cell offers one for ``kernel``
    (``kernel_coefficients``), else per block in PyTorch; without kept gates recomputed per
    block (two small GEMMs: input and recurrent gates).

    Returns ``D_rev`` ``(M, B, S)``, ``C_rev`` ``(M, B, coeffs * H)`` and the cell's extra
    ``(T, B, extra * H)`` (forward order, only needed for the gate gradients; None if the
    cell has none), all workspace buffers.
    """
    T, B, H, S = x.shape[0], x.shape[1], w_hh.shape[1], points.shape[-1]
    b_in, rb = cell.fold_bias(b_ih, b_hh, H), cell.recurrent_bias(b_hh, H)
    D_rev = workspace.buffer("bwd.D", (M, B, S), points)
    C_rev = workspace.buffer(WIDE, (M, B, cell.coeffs * H), points)
    A_n = workspace.buffer("bwd.extra", (T, B, cell.extra * H), points) if cell.extra else None
    for pad in (slice(0, off), slice(off + T, M)):
        D_rev[pad] = 1.0
        C_rev[pad] = 0.0
    end = off + T
    if kept is not None and compiled_passes(cell, kernel):
        dt = (
            None if mask is None else mask.reshape(T, -1).expand(T, B).to(points.dtype).contiguous()
        )
        D, C = D_rev[off:end], C_rev[off:end]
        cell.kernel_coefficients(kernel, points[:T], kept.contiguous(), dt, D, C, A_n)
        return D_rev, C_rev, A_n
    for k0, k1 in time_blocks(T, B, points):
        dt = None if mask is None else column(mask[k0:k1])
        C = workspace.buffer("bwd.block C", (k1 - k0, B, cell.coeffs * H), points)
        if kept is not None:
            lin = cell.linearise_kept(points[k0:k1], kept[k0:k1], dt, C)
        else:
            gx = input_gates(x[k0:k1], w_ih, b_in)
            lin = cell.linearise(points[k0:k1], gx, w_hh, rb, dt, C)
        reversed_time(lin.D, out=D_rev[end - k1 : end - k0])
        reversed_time(lin.C, out=C_rev[end - k1 : end - k0])
        if A_n is not None:
            A_n[k0:k1] = lin.extra
    return D_rev, C_rev, A_n


def reversed_forcing(
    d_out: Tensor, d_last: Tensor, M: int, off: int, f_first: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """The adjoint's right-hand side in reversed time ``(M, B, H)`` with ``off`` padding steps
    in front, and ``f_T`` (its initial value when ``off`` is 0). ``g[j]`` enters at reversed
    point ``j + 1``, which is forward point ``k = off + T - 1 - j``; there it is
    ``f_k = dL/du_k`` directly: ``dL/dy_{k-1}``, plus ``dL/dh_n`` at ``k = T``, and
    ``f_first`` (default zero) at ``k = 0``: a time slice's first point is the previous
    slice's last output. Zero in the padding."""
    T, B = d_out.shape[:2]
    end = off + T
    g = workspace.buffer("bwd.g", (M, *d_out.shape[1:]), d_out)
    g[: max(off - 1, 0)] = 0.0
    g[end:] = 0.0
    g[end - 1] = 0.0 if f_first is None else f_first
    # dL/dy_i is f_{i+1}, at reversed index end - 2 - i (i < T - 1: f_T is handled below).
    for k0, k1 in time_blocks(T - 1, B, d_out):
        reversed_time(d_out[k0:k1], out=g[end - 1 - k1 : end - 1 - k0])
    f_T = d_out[T - 1] + d_last
    if off > 0:
        g[off - 1] = f_T
    return g, f_T


@dataclass
class Adjoint:
    """The solved adjoint of one layer, in reversed time: ``lam_k = lam_rev[T - k]``."""

    lam_rev: Optional[Tensor]  # (T + 1, B, S)
    C_rev: Optional[Tensor]  # (T, B, coeffs * H) fine coefficients, reversed
    extra: Optional[Tensor]  # (T, B, extra * H) forward order: the cell's (GRU: A_n)
    stats: SolveStats
    # torch's kernel solved it: (dx, du0, dW_ih, dW_hh, db_ih, db_hh) instead of lam
    grads: Optional[tuple] = None
    # a compiled serial adjoint solved it: (d_gx, d_gh, du0, sums), the gradients of every
    # step's gate pre-activations (T, B, gates * H) (work buffers) instead of lam, and the
    # biases' gradients (db_ih, db_hh) where the kernel summed them (else None)
    gates: Optional[tuple] = None

    def blocks(self, T: int, B: int):
        """Per time block ``[k0, k1)``: ``lam_{k0+1 .. k1}``, ``C`` and the cell's extra in
        forward order.
        ``lam`` and ``C`` are work buffers that the next block overwrites."""
        for k0, k1 in time_blocks(T, B, self.lam_rev):
            lam = self.lam_rev[T - k1 : T - k0]
            C = self.C_rev[T - k1 : T - k0]
            yield (
                k0,
                k1,
                reversed_time(lam, out=workspace.buffer("bwd.block lam", lam.shape, lam)),
                reversed_time(C, out=workspace.buffer("bwd.block C", C.shape, C)),
                None if self.extra is None else self.extra[k0:k1],
            )


def adjoint_solve(
    points: Tensor,
    x: Tensor,
    w_ih: Tensor,
    b_ih: Optional[Tensor],
    hier: Hierarchy,
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: Cell,
    options: MGRIT,
    d_out: Tensor,
    d_last: Tensor,
    where=(0, False),
    mask: Optional[Tensor] = None,
    tg=None,
    control=None,
) -> Adjoint:
    """Solve the adjoint of one layer.

    Args:
        points: forward points ``(T + 1, B, S)``; x: the layer input ``(T, B, I)``.
        d_out: dL/du of the states after every step ``(T, B, S)``; d_last: dL/du_T ``(B, S)``.
        where: (layer, reverse) as for :func:`forward_solve`; all of these in that direction's
            own time order.
        tg: time-parallel context (then all of these are this rank's slice; d_last counts only
            on the rank that holds the direction's last point).
        control: see :func:`mgrit_gru.layer.control.solve_guarded`.
    """
    T, B = x.shape[:2]
    H = w_hh.shape[1]
    reverse = where[1]
    comm = LocalComm(not reverse) if tg is None else tg.comm(reverse=not reverse)
    mgrit_grids = _grids(T, options, len(hier.grids), not reverse, tg)
    M, off = mgrit_grids[0].M, mgrit_grids[0].off
    trace.phase("backward", reverse=not reverse)
    kernel = compiled_kernel(cell, x)
    fused = _torch_serial(kernel) and _fused_adjoint(cell, x, w_hh, b_ih, b_hh, mask, tg, d_out)
    # beside the compiled CPU sweeps: torch's backward where the forward took torch's kernel
    # and kept its graph (the forward's choice, priced for both passes), the sweeps else
    graph, hier.graph = hier.graph, None
    by_torch = (
        graph is not None and not _torch_serial(kernel) and _fused_adjoint_on(cell, w_hh, d_out)
    )
    fused = fused or by_torch
    # the serial adjoint in one compiled call with the gate gradients, from the kept gates
    # (one process: a time group's serial pipeline passes lam between the ranks' loops)
    # (not while a trace records: a trace stands for ranks, which pass lam through the ranks'
    # sweeps, as _fused_adjoint says)
    whole = (
        not fused and kernel is not None and hier.kept is not None and tg is None
        and not hier.partial and not trace.active()
    )  # fmt: skip
    state: dict = {"graph": graph}

    def coefficients() -> tuple:
        """The fine steps' adjoint coefficients (not needed where torch's kernel solves)."""
        if "coefficients" not in state:
            full = points
            if hier.partial:  # the states' other blocks, which the linearisation reads
                full = cell.complete_points(points, x, w_ih, w_hh, b_ih, b_hh)
            with trace.bulk("coefficients", T * B, H, x):
                state["coefficients"] = fine_coefficients(
                    full, x, w_ih, b_ih, w_hh, b_hh, cell, M, off, mask, hier.kept, kernel
                )
            hier.release_kept()
        return state["coefficients"]

    if not (fused or whole):
        coefficients()  # here, as a trace of ranks expects them

    def forcing() -> tuple:
        """The right-hand side in reversed time, its initial value and its size (not
        needed where torch's kernel solves)."""
        if "forcing" not in state:
            # dL/dy at a slice's first point was the previous rank's last output
            forward_order = LocalComm(reverse) if tg is None else tg.comm(reverse=reverse)
            f_first = forward_order.shift(d_out[T - 1])
            with trace.bulk("forcing", T * B, H, x):
                g_rev, f_T = reversed_forcing(d_out, d_last, M, off, f_first)
                low, high = torch.aminmax(g_rev)
                scale = max(-low.item(), high.item(), f_T.abs().max().item())
            state["forcing"] = g_rev, f_T, comm.max(scale)
        return state["forcing"]

    serial_only = len(mgrit_grids) == 1
    # the forcing in reversed time: here on ranks (a collective) and in a trace (which stands
    # for ranks); one process whose serial solve does without it (torch's kernel, the
    # compiled serial adjoint) makes it only where MGRIT is tried (solve_guarded's ready):
    # the automatic choice's serial calls skip a pass over the gradients (4% of a step)
    lazy = (fused or whole) and tg is None and not trace.active()
    if not ((fused or whole) and serial_only) and not lazy:
        forcing()
    steps = T if tg is None else tg.steps
    threads = cost.pricing_threads(tg is not None)
    meter = cost.Meter(H, x.device.type, cell.costs, x.dtype, threads)
    serial_kind = (
        "fused_adjoint" if fused and not by_torch else ("sweep_adjoint" if kernel else "adjoint")
    )
    serial_cost = cost.serial_us(
        serial_kind, steps, B, H, x.device.type, cell.costs, x.dtype, threads
    )
    if by_torch:  # in the sweeps' units, as the forward's
        forward_and_adjoint = serial_prices(cell, x, H, True)
        forward = serial_prices(cell, x, H, False)
        serial_cost *= (forward_and_adjoint[0] - forward[0]) / (forward_and_adjoint[1] - forward[1])
    least = _least(mgrit_grids, "sweep_adjoint" if kernel else "adjoint", B, H, x, cell, tg)

    def coarse_ops(grids: list[Grid]) -> list:
        if "ops" not in state:
            if isinstance(options.coarse, Implicit):
                state["ops"] = _coarse_adjoint_ops(
                    hier, mgrit_grids, points, x, w_ih, b_ih, w_hh, b_hh, cell, mask, options,
                    meter, kernel,
                )  # fmt: skip
            else:
                state["ops"] = chunk_map_ops(mgrit_grids, options, kernel)
        return state["ops"][: len(grids) - 1]

    rule = _stopping(options, "backward", mgrit_grids, x)
    plan, planned = _budget_plan(options, "backward", mgrit_grids, x, where, control)
    rule = planned or rule

    def run(grids: list[Grid]) -> SolveResult:
        if len(grids) == 1 and whole and hier.kept is not None:  # (an MGRIT try before
            # this fallback linearised from the kept gates and released them)
            dt = None if mask is None else mask.contiguous()
            state["gates"] = cell.kernel_vjp(
                kernel, points, hier.kept, dt, w_hh, d_out.contiguous(), d_last.contiguous()
            )
            meter.add("adjoint", B, T, level=trace.SERIAL, cost_kind="sweep_adjoint")
            return SolveResult(d_last.new_empty(0), d_last)
        if len(grids) == 1 and fused:
            if by_torch:  # back through the forward's graph (taken: a second backward of
                # the same forward finds none and runs the sweeps' adjoint)
                grads = cell.fused_vjp(
                    x, points[0], w_ih, w_hh, b_ih, b_hh, d_out, d_last, graph=state.pop("graph")
                )
            else:
                grads = cell.fused_vjp(x, points[0], w_ih, w_hh, b_ih, b_hh, d_out, d_last)
            if grads is not None:  # else cuDNN refused the shape: the library's loop
                meter.add("fused", B, T, level=trace.SERIAL, cost_kind="fused_adjoint")
                state["grads"] = grads
                return SolveResult(d_last.new_empty(0), d_last)
        if len(grids) > 1 and fused:  # MGRIT's one try (solve_guarded runs it once)
            # what torch's serial backward does without, in the cost of MGRIT's try: the
            # coefficients, c rebuilt and the gradients' GEMMs, each about a step over all
            # rows (not traced: a fused adjoint is off while a trace records)
            meter.charge("step", T * B, 2 + int(hier.partial))
        elif len(grids) > 1 and whole and compiled_passes(cell, kernel):
            # likewise for the compiled serial adjoint, which forms the coefficients and gate
            # gradients inside its loop: MGRIT's compiled passes over all rows for them
            meter.charge("sweep_adjoint", round(cost.COMPILED_PASSES * T * B), 1)
        elif len(grids) > 1 and whole:  # the same passes in PyTorch code (coefficients,
            # reversals, forcing, gate gradients) cost about one PyTorch step over all rows
            meter.charge("step", T * B, 1)
        fine = grids[0]  # M steps, or T for the serial grid: then the padding is skipped
        lo = off - fine.off
        D_rev, C_rev, _ = coefficients()
        D, C = D_rev[lo : lo + fine.M], C_rev[lo : lo + fine.M]
        g_rev, f_T, scale = forcing()
        fine_op = AdjointStep(fine, D, C, w_hh, cell, meter, kernel)
        ops = [fine_op] + (coarse_ops(grids) if len(grids) > 1 else [])
        u0 = f_T if fine.off == 0 else torch.zeros_like(f_T)
        work = workspace.buffer(CHUNKS, (fine.m, fine.n, *f_T.shape), f_T)
        g0 = chunk_view(g_rev[lo : lo + fine.M], fine)
        if len(grids) > 1:  # every rank starts from the global u0
            u0 = comm.broadcast_from(u0, 0)
        return _solve_on(
            comm,
            grids,
            ops,
            u0,
            g0,
            work,
            relax=options.bwd_relax,
            stop=StopTest(rule.tol, rule.floor, data=scale, blocks=cell.state),
            max_iters=rule.max_iters,
            early_exit=options.early_exit,
            guard=_guard(options, rule, meter, serial_cost, tg),
            min_iters=0 if plan is None else plan.min_iters,
        )

    # A NaN or Inf gradient flows on as in autograd: where MGRIT would be tried, the serial
    # solve instead, without a try or a fallback (a call that the control sends to the serial
    # solve anyway is its call, as any other: counted, and reported as skipped).
    grids, result, stats = solve_guarded(
        "backward",
        options,
        run,
        mgrit_grids,
        where,
        control,
        lambda: meter.spent,
        serial_cost,
        cell.name.upper(),
        least,
        ready=lambda: math.isfinite(forcing()[2]),
    )
    ran = kernels_name(kernel, "grads" in state)
    stats = replace(stats, kernels=ran, row_steps=meter.row_steps)
    if "gates" in state:
        hier.release_kept()
        return Adjoint(None, None, None, stats, gates=state["gates"])
    if "grads" in state:
        hier.release_kept()
        return Adjoint(None, None, None, stats, state["grads"])
    Mg, off_g = grids[0].M, grids[0].off
    lam = workspace.buffer("bwd.lam", (Mg + 1, *d_last.shape), d_last)
    lam_rev = flat_points(result.u, result.uend, out=lam)[off_g : off_g + T + 1]
    if plan is not None and len(grids) > 1:  # a budget learns its error; at a check against
        # the exact adjoint at the same states (the library's own serial loop, whose result
        # is lam as the budget's is)
        measured = None
        if plan.check and tg is None and not trace.active():
            fused = whole = False  # noqa: F841 (read by run)
            exact = run([Grid(N=T, m=T, n=1)])
            measured = _relative(lam_rev, flat_points(exact.u, exact.uend), "two")
        _learn(control, "backward", where, plan, result, measured, options, cell.name.upper())
    _, C_rev, extra = coefficients()
    return Adjoint(lam_rev, C_rev[off : off + T], extra, stats)


def _fused_adjoint(cell: Cell, x, w_hh, b_ih, b_hh, mask, tg, d_out: Tensor) -> bool:
    """Whether a serial adjoint of this layer runs torch's own backward kernel (a cell with
    one, where its kernel fits as for the forward, and no gradient on the output's other
    state blocks: torch's kernel takes one on h only). Not while a trace records: a trace
    stands for ranks, which run the library's loop."""
    if not cell.fused_adjoint or trace.active():
        return False
    if not _torch_kernel_fits(x, w_hh, b_ih, b_hh, mask, tg):
        return False
    return _fused_adjoint_on(cell, w_hh, d_out)


def _fused_adjoint_on(cell: Cell, w_hh, d_out: Tensor) -> bool:
    """Whether torch's backward can take these output gradients: a cell with one, no trace
    recording, and no gradient on the states' other blocks (torch's kernel takes h's only)."""
    if not cell.fused_adjoint or trace.active():
        return False
    H = w_hh.shape[1]
    return d_out.shape[-1] == H or not bool(d_out[..., H:].any())


def _coarse_adjoint_ops(
    hier, grids, points, x, w_ih, b_ih, w_hh, b_hh, cell, mask, options, meter, kernel=None
):
    """The adjoint's implicit coarse levels: VJPs of the forward's coarse implicit steps,
    linearised at the forward states of their coarse points (the coarse gates are made here
    if the forward ran serially and never built them)."""
    H = w_hh.shape[1]
    implicit = implicit_of(cell)
    rb = cell.recurrent_bias(b_hh, H)
    if len(hier.grids) > 1 and hier.gates[1] is None:
        fwd = hier.grids[0]
        gx = x.new_zeros((fwd.M, *x.shape[1:-1], w_ih.shape[0]))
        input_gates(x, w_ih, cell.fold_bias(b_ih, b_hh, H), out=gx[fwd.off : fwd.off + x.shape[0]])
        built = build_hierarchy(gx, hier.grids, options, step_weights(fwd, mask, gx))
        hier.gates, hier.dts = built.gates, built.dts
    ops = []
    for lvl in range(1, len(grids)):
        lin = implicit.linearise(
            hier.coarse_points(points, lvl, options.cfactor),
            hier.gates[lvl],
            w_hh,
            rb,
            column(hier.dts[lvl]),
        )
        grid = grids[lvl]
        ops.append(
            AdjointStep(
                grid,
                pad_steps(lin.D.flip(0), grid, 1.0),
                pad_steps(lin.C.flip(0), grid),
                w_hh,
                implicit,
                meter,
                kernel,
            )
        )
    return ops
