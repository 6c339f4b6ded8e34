"""Solver options: one frozen, validated object whose families are small named values.

``MGRIT(cfactor=..., relax="FCFCF", coarse="secant", guard=Guard(...), budget=Budget(...))``:
each family takes a plain string for the common case or its own small frozen object where it
has parameters (a secant's depth, a cycle budget). ``"auto"`` as a GRU's ``solver`` is
:class:`Auto`: MGRIT or the serial solve, whichever the cost model says is faster, per layer,
direction and pass.

References: Falgout et al., "Parallel time integration with multigrid", SISC 2014 (MGRIT);
Moon & Cyr, "Parallel Training of GRU Networks with a Multi-Grid Solver for Long Sequences",
ICLR 2022.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Optional, Union

from . import cost

COARSE_CHOICES = ("implicit", "frozen", "secant")
COARSE_GATES_CHOICES = ("average", "inject")
ON_DIVERGENCE_CHOICES = ("fallback", "backoff", "raise")
ON_UNCONVERGED_CHOICES = ("fallback", "warn", "raise")
GRADIENT_CHOICES = ("adjoint", "unrolled")
RELAX_CHOICES = ("F", "FCF", "FCFCF", "FCFCFCF")  # the common ones; any F(CF)* is legal


def _bad(owner: str, field: str, value: object, legal: str) -> ValueError:
    return ValueError(f"{owner}: invalid {field}={value!r}; {legal}")


def _check_int(owner: str, field: str, value: object, low: int, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(owner, field, value, f"expected an integer >= {low}{alternative}")


def _check_tol(field: str, value: object) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad("MGRIT", field, value, "expected a finite number >= 0 or 'auto'")
    if not math.isfinite(value) or value < 0:
        raise _bad("MGRIT", field, value, "expected a finite number >= 0 or 'auto'")


def _check_relax(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"F(CF)*", value):
        raise _bad(owner, name, value, "expected 'F' followed by 'CF' repeated: F, FCF, FCFCF, ...")


# -- coarse corrections --------------------------------------------------------------------


@dataclass(frozen=True)
class Implicit:
    """Coarse steps are implicit GRU steps (Moon & Cyr 2022) of size dt = the number of fine
    steps they span, reading the fine input gates ``"average"``d over the interval or
    ``"inject"``ed from its first step (as in the paper's code)."""

    name = "implicit"
    gates: Literal["average", "inject"] = "average"

    def __post_init__(self) -> None:
        if self.gates not in COARSE_GATES_CHOICES:
            raise _bad("Implicit", "gates", self.gates, f"choose one of {COARSE_GATES_CHOICES}")


@dataclass(frozen=True)
class Frozen:
    """The frozen-gate affine map of each chunk (``mgrit_gru.core.coarse``): with the last
    sweep's gates held fixed a chunk is ``h_end = A * h_start + b``, ``A`` the product of its
    steps' ``z`` (classic cell); the coarse correction is ``V' = P + A (V - U)``, forward and
    (transposed) adjoint, composed over levels. No GEMM on the coarse levels."""

    name = "frozen"


@dataclass(frozen=True)
class Secant:
    """:class:`Frozen` plus a rank-``depth`` multisecant correction of each chunk's map from
    the last ``depth`` differences of its start and end between cycles (level 1; deeper
    levels compose the frozen part). With fewer than two cycles it is :class:`Frozen`."""

    name = "secant"
    depth: int = 3

    def __post_init__(self) -> None:
        _check_int("Secant", "depth", self.depth, 1)


Coarse = Union[Implicit, Frozen, Secant]
_COARSE = {"implicit": Implicit, "frozen": Frozen, "secant": Secant}


# -- when to abandon a solve ---------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    """When an MGRIT solve is abandoned before its cycle cap (what follows is
    ``on_divergence``'s choice).

    Args:
        patience: the solve has diverged once this many cycles in a row bring no residual
            below the smallest so far (or a residual is not finite). Trained GRUs may grow
            for a cycle or two and then converge fast.
        cost: abandon the solve once it has spent what the serial solve costs, or its cost
            model (:mod:`mgrit_gru.cost`) predicts that finishing it costs more than the
            serial solve from scratch: the cycle's measured cost times the cycles that the
            residuals' decay rate still needs. The serial solve then runs: MGRIT pays or
            stops early. Off for an explicit ``MGRIT()`` (a user who asks for MGRIT gets it,
            to the tolerance); :class:`Auto`, the module's default, always runs MGRIT with it.
    """

    patience: int = 4
    cost: bool = False

    def __post_init__(self) -> None:
        _check_int("Guard", "patience", self.patience, 1)
        if not isinstance(self.cost, bool):
            raise _bad("Guard", "cost", self.cost, "expected True or False")


# -- a fixed cycle budget (the paper's training) -------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A fixed number of cycles, no tolerance, no fallback: the paper's way to train (Moon &
    Cyr 2022 use 2 forward cycles and 1 adjoint cycle with F-relaxation). The network then
    trains through what the solver computes, and should be evaluated with the same budget.

    Args:
        forward, backward: V-cycles of the forward and the adjoint solve (0: relaxation only).
        backward_relax: the adjoint's relaxation (None: the options' ``relax``).
        gradient: ``"adjoint"``: the adjoint solved with ``backward`` cycles, linearised at
            the budget's (inexact) forward states, as in the paper; ``"unrolled"``: the exact
            gradient of the budgeted forward itself, by differentiating through its cycles
            (each sweep batched over chunks; memory grows with the cycles).
        clamp: clamp the C-points to [-1, 1] (a GRU state's range) after each forward coarse
            correction, which may push them out of it.
    """

    forward: int = 2
    backward: int = 1
    backward_relax: Optional[str] = None
    gradient: Literal["adjoint", "unrolled"] = "adjoint"
    clamp: bool = False

    def __post_init__(self) -> None:
        _check_int("Budget", "forward", self.forward, 0)
        _check_int("Budget", "backward", self.backward, 0)
        if self.backward_relax is not None:
            _check_relax("Budget", "backward_relax", self.backward_relax)
        if self.gradient not in GRADIENT_CHOICES:
            raise _bad("Budget", "gradient", self.gradient, f"choose one of {GRADIENT_CHOICES}")
        if not isinstance(self.clamp, bool):
            raise _bad("Budget", "clamp", self.clamp, "expected True or False")

    @property
    def adaptive(self) -> bool:
        """Whether the cycles are chosen per solve (:class:`AdaptiveBudget`)."""
        return False


# The adaptive budget's defaults: the bound on the gradient's relative error, the calls between
# two exact checks of a layer and pass, the cycle caps.
DEFAULT_THETA = 0.1


@dataclass(frozen=True)
class AdaptiveBudget(Budget):
    """A cycle budget that chooses each solve's cycles so that the gradient's relative error
    stays below ``theta`` (the inexact-gradient rule of stochastic optimisation,
    ``||g_budget - g|| <= theta ||g||``): at least ``forward`` / ``backward`` cycles (the
    paper's 2/1), more where the network needs them, at most ``max_forward`` /
    ``max_backward``. No guard, no fallback, as :class:`Budget`.

    Each layer, direction and pass estimates its error as its residual after the cycles times
    a ratio that an exact check calibrates: every ``every``-th call (the first included) also
    runs the serial solve and measures the budget's error against it (the forward's states in
    the largest-value norm, which is what a max-pooled head reads; the adjoint's states in the
    2-norm, which is what the weight gradient sums). A solve then cycles until its estimated
    error is at most ``theta / 2`` (the forward's and the adjoint's shares of the gradient's
    error), deciding from residuals and cycle counts only, never a clock; the state lives in
    the module (:meth:`mgrit_gru.GRU.solver_state`) and survives a checkpoint. Measured on
    trained networks: docs/convergence.md, "Training through a cycle budget".

    Args:
        theta: the bound on the gradient's relative error, in (0, 1).
        every: calls of a layer and pass between two exact checks (>= 1; 1: every call,
            which costs a serial solve each).
        max_forward, max_backward: cycle caps (>= ``forward`` / ``backward``).
        forward, backward, backward_relax, clamp: as :class:`Budget` (the minimum cycles).
    """

    theta: float = DEFAULT_THETA
    every: int = 16
    max_forward: int = 8
    max_backward: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gradient != "adjoint":
            raise _bad(
                "AdaptiveBudget", "gradient", self.gradient, "only 'adjoint' (the solved adjoint)"
            )
        ok = isinstance(self.theta, (int, float)) and not isinstance(self.theta, bool)
        if not ok or not (0.0 < self.theta < 1.0):
            raise _bad("AdaptiveBudget", "theta", self.theta, "expected a number in (0, 1)")
        _check_int("AdaptiveBudget", "every", self.every, 1)
        _check_int("AdaptiveBudget", "max_forward", self.max_forward, self.forward)
        _check_int("AdaptiveBudget", "max_backward", self.max_backward, self.backward)

    @property
    def adaptive(self) -> bool:
        return True


# The default tolerance in 32-bit arithmetic (float32 solves, and float16/bfloat16 models,
# which solve in float32); float64 solves default to their rounding floor. The default cycle
# cap: 10 cycles for those 5 digits, 2 per digit for a tighter tolerance.
AUTO_TOL = 1e-5
AUTO_DIGITS = 5
AUTO_CYCLES_PER_DIGIT = 2


@dataclass(frozen=True)
class Stopping:
    """One solve's stopping rule (:meth:`MGRIT.stopping`): the tolerance on the relative
    residual (0: none, run ``max_iters`` cycles), the cycle cap, the rounding floor (0: not
    judged) and, where a tolerance below the floor was raised to it, the one ``asked``."""

    tol: float
    max_iters: int
    floor: float
    asked: Optional[float] = None


@dataclass(frozen=True)
class MGRIT:
    """Options of the multigrid-reduction-in-time solve of one GRU layer.

    Args:
        cfactor: coarsening factor m: level l keeps every m-th point of level l-1 (>= 2), or
            ``"auto"``: chosen per call from T, batch, hidden size, device and the number of
            time-parallel ranks by :func:`auto_cfactor`.
        levels: number of time grids (1 = the exact serial solve), or ``"auto"``: coarsen
            until the coarsest grid has at most ``cfactor`` intervals.
        relax: ``"F"`` (F-relaxation), ``"FCF"`` (F, then C, then F), ``"FCFCF"``, ...: more
            C-F sweeps converge in fewer cycles at a higher cost per cycle.
        coarse: the coarse correction: ``"implicit"`` (:class:`Implicit`), ``"frozen"``
            (:class:`Frozen`), ``"secant"`` (:class:`Secant`), or one of those objects.
        tol: forward stopping tolerance on the relative residual: the largest C-point
            residual divided by the solution's size there (its largest absolute value; a
            GRU state lies in (-1, 1), so for the forward this is close to an absolute
            error). ``"auto"``: ``AUTO_TOL`` (1e-5) in 32-bit arithmetic, the rounding floor
            in float64 (as exact as the dtype allows). A tolerance below the floor of the
            arithmetic that runs (``mgrit_gru.core.stopping.floor``: float32 about 3e-6 at
            32-step chunks; TF32 and bfloat16 matrix products far more) is raised to it with
            one warning naming both; a residual that stops falling near the floor ends the
            solve as converged to precision (``SolveStats.at_floor``). 0: no tolerance (run
            ``max_iters`` cycles).
        max_iters: cap on forward V-cycles (0 = no cycle: one relaxation sweep only), or
            ``"auto"``: 10 for a tolerance of 1e-5, in proportion to the digits for a tighter
            one (``AUTO_CYCLES_PER_DIGIT``).
        backward_tol: the adjoint's tolerance, with the same meaning (its solution is the
            adjoint state dL/dh_t, which sums the incoming gradients over the network's
            memory). ``None``: same as ``tol``.
        backward_max_iters: cap on adjoint V-cycles. ``None``: same as ``max_iters``.
        guard: when a solve is abandoned before its cap (:class:`Guard`): no progress for a
            few cycles, or a predicted cost above the serial solve's.
        on_divergence: an abandoned solve (diverged, or stopped by the cost guard) either makes
            the call ``"fallback"`` to the exact serial solve or ``"raise"``;
            ``"backoff"`` falls back too and then solves that layer and pass serially for the
            next 1, 2, 4, ... 64 calls after consecutive failures, without trying MGRIT (a
            converged MGRIT solve resets it). A divergence warns once; a cost stop is silent.
        on_unconverged: a solve that reaches ``max_iters`` above ``tol``: ``"fallback"``
            (the serial solve's exact result, one warning), ``"warn"`` (keep MGRIT's result,
            one warning) or ``"raise"``.
        budget: a fixed cycle :class:`Budget` instead of the tolerance: no guard, no
            fallback (a non-finite state raises).
        keep_gates: the forward keeps every fine step's gates (4H floats per step and
            sequence) so that the backward linearises without GEMMs; ``False`` recomputes
            them in the backward instead, when memory is the limit.
        early_exit: an F-relaxation that follows another (after a C-relaxation, or after a
            coarse correction) stops once its new states agree with the previous sweep's to
            the tolerance, everywhere: each chunk has then forgotten the change of its start,
            and the rest of the chunk is kept. The residual it leaves counts in the stopping
            test, so a converged solve meets ``tol`` as without it. ``False``: every sweep
            runs to the end of its chunks, as every sweep of a fixed :class:`Budget` does
            (its tolerance 0 would let a sweep exit only where it repeats the last one).

    ``MGRIT.serial()`` is the exact sequential reference on the same kernels.
    """

    cfactor: Union[int, Literal["auto"]] = "auto"
    levels: Union[int, Literal["auto"]] = "auto"
    relax: str = "FCF"
    coarse: Union[str, Coarse] = "secant"
    tol: Union[float, Literal["auto"]] = "auto"
    max_iters: Union[int, Literal["auto"]] = "auto"
    backward_tol: Union[float, Literal["auto"], None] = None
    backward_max_iters: Union[int, Literal["auto"], None] = None
    guard: Guard = field(default_factory=Guard)
    on_divergence: Literal["fallback", "backoff", "raise"] = "fallback"
    on_unconverged: Literal["fallback", "warn", "raise"] = "fallback"
    budget: Optional[Budget] = None
    keep_gates: bool = True
    early_exit: bool = True

    def __post_init__(self) -> None:
        if self.cfactor != "auto":
            _check_int("MGRIT", "cfactor", self.cfactor, 2, " or 'auto'")
        if self.levels != "auto":
            _check_int("MGRIT", "levels", self.levels, 1)
        _check_relax("MGRIT", "relax", self.relax)
        if isinstance(self.coarse, str):
            if self.coarse not in _COARSE:
                raise _bad("MGRIT", "coarse", self.coarse, f"choose one of {COARSE_CHOICES}")
            object.__setattr__(self, "coarse", _COARSE[self.coarse]())
        elif not isinstance(self.coarse, (Implicit, Frozen, Secant)):
            raise _bad(
                "MGRIT",
                "coarse",
                self.coarse,
                f"choose one of {COARSE_CHOICES} or Implicit(...), Frozen(), Secant(...)",
            )
        _check_tol("tol", self.tol)
        if self.max_iters != "auto":
            _check_int("MGRIT", "max_iters", self.max_iters, 0, " or 'auto'")
        if self.backward_tol is not None:
            _check_tol("backward_tol", self.backward_tol)
        if self.backward_max_iters not in (None, "auto"):
            _check_int("MGRIT", "backward_max_iters", self.backward_max_iters, 0, " or 'auto'")
        if not isinstance(self.guard, Guard):
            raise _bad("MGRIT", "guard", self.guard, "expected a mgrit_gru.Guard(...)")
        if self.on_divergence not in ON_DIVERGENCE_CHOICES:
            raise _bad(
                "MGRIT",
                "on_divergence",
                self.on_divergence,
                f"choose one of {ON_DIVERGENCE_CHOICES}",
            )
        if self.on_unconverged not in ON_UNCONVERGED_CHOICES:
            raise _bad(
                "MGRIT",
                "on_unconverged",
                self.on_unconverged,
                f"choose one of {ON_UNCONVERGED_CHOICES}",
            )
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise _bad("MGRIT", "budget", self.budget, "expected None or a mgrit_gru.Budget(...)")
        for name in ("keep_gates", "early_exit"):
            if not isinstance(getattr(self, name), bool):
                raise _bad("MGRIT", name, getattr(self, name), "expected True or False")

    @classmethod
    def serial(cls) -> MGRIT:
        """The exact sequential solve (one level) on the same kernels."""
        return cls(levels=1)

    @property
    def is_serial(self) -> bool:
        return self.levels == 1

    def stopping(self, pass_: str, roundoff: float, floor: float) -> Stopping:
        """The stopping rule of one ``pass_`` ("forward" or "backward") in arithmetic of
        machine epsilon ``roundoff`` whose relative residual cannot get below ``floor``
        (:mod:`mgrit_gru.core.stopping`)."""
        if self.budget is not None:
            cycles = self.budget.forward if pass_ == "forward" else self.budget.backward
            return Stopping(0.0, cycles, 0.0)
        tol, cap = self.tol, self.max_iters
        if pass_ != "forward":
            tol = tol if self.backward_tol is None else self.backward_tol
            cap = cap if self.backward_max_iters is None else self.backward_max_iters
        asked = None
        if tol == "auto":
            tol = AUTO_TOL if roundoff > 1e-10 else 0.0
            tol = max(tol, floor)
        elif 0.0 < tol < floor:
            asked, tol = tol, floor
        if cap == "auto":
            digits = -math.log10(tol) if tol > 0.0 else 2 * AUTO_DIGITS
            cap = math.ceil(AUTO_CYCLES_PER_DIGIT * max(digits, AUTO_DIGITS))
        return Stopping(float(tol), int(cap), floor if tol > 0.0 else 0.0, asked)

    @property
    def bwd_relax(self) -> str:
        if self.budget is not None and self.budget.backward_relax is not None:
            return self.budget.backward_relax
        return self.relax

    def resolve(
        self,
        steps: int,
        batch: int,
        hidden: int,
        device: str = "cpu",
        ranks: int = 1,
        kind: str = "step",
    ) -> MGRIT:
        """These options for one call of ``steps`` (global) time steps over ``ranks``
        time-parallel ranks whose fine steps are the cost model's ``kind``:
        ``cfactor="auto"`` replaced by :func:`auto_cfactor`."""
        if self.cfactor != "auto":
            return self
        m = auto_cfactor(steps, batch, hidden, device, self, ranks, kind)
        return replace(self, cfactor=m)

    def num_levels(self, steps: int) -> int:
        """Levels actually used for a sequence of ``steps`` time steps."""
        if self.cfactor == "auto":
            raise ValueError("MGRIT: cfactor='auto' must be resolved first (MGRIT.resolve)")
        if self.levels != "auto":
            return self.levels
        levels, n = 1, steps
        while n > self.cfactor:
            n = -(-n // self.cfactor)
            levels += 1
        return levels

    def replace(self, **changes: object) -> MGRIT:
        return replace(self, **changes)

    def describe(self) -> str:
        """The fields that differ from the defaults, e.g. ``mgrit(cfactor=64,relax=FCFCF)``."""
        default = MGRIT()
        changed = [
            f"{f.name}={_short(getattr(self, f.name))}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return "mgrit(" + (",".join(changed) if changed else "default") + ")"


def _short(value: object) -> str:
    """A coarse correction with its default parameters by its name, anything else as is."""
    if isinstance(value, (Implicit, Frozen, Secant)) and value == type(value)():
        return value.name
    return str(value)


@dataclass(frozen=True)
class Auto:
    """The solver choice per layer, direction and pass (forward / adjoint): MGRIT with
    ``mgrit``'s options (and its cost guard on) while its modelled cost (:mod:`mgrit_gru.cost`,
    from the cycles it needed) stays below the serial solve's, else the serial solve, with
    MGRIT tried again after 4, 8, 16, ... ``max_wait`` calls so that a network that becomes
    easy (or hard) is followed. Decisions depend on cycle counts only, never on a clock (a
    resumed training run makes the same choices); their state lives in the module
    (:meth:`mgrit_gru.GRU.solver_state`)."""

    mgrit: MGRIT = field(default_factory=MGRIT)
    max_wait: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.mgrit, MGRIT):
            raise _bad("Auto", "mgrit", self.mgrit, "expected a mgrit_gru.MGRIT(...)")
        if self.mgrit.is_serial or self.mgrit.budget is not None:
            raise _bad(
                "Auto", "mgrit", self.mgrit, "a budget or serial MGRIT leaves nothing to choose"
            )
        _check_int("Auto", "max_wait", self.max_wait, 1)
        if not self.mgrit.guard.cost:  # the choice is about cost: its solves stop when dear
            guard = replace(self.mgrit.guard, cost=True)
            object.__setattr__(self, "mgrit", replace(self.mgrit, guard=guard))


# The cost model of cfactor="auto" (docs/design.md, "The automatic choices"). A pass's time is
# dominated by the relaxation sweeps: sequential batched steps over the T/m chunks' B rows at once,
# each costing o + c per row (mgrit_gru.cost). FCF's first sweep takes m - 1 steps; with early
# exit its second stops after about EXIT_STEPS (where an untrained GRU has forgotten its
# chunk's start to tol 1e-5, measured), so a pass costs about (m - 1 + EXIT_STEPS)(o + c T B /
# m), least at m = sqrt(EXIT_STEPS * T * B * c / o). Without early exit both sweeps take
# m - 1 steps; the older rule then aims at about ROWS_PER_STEP * 64 / H rows per batched
# step, as many as stay in the core's cache. Chunks shorter than MIN_CFACTOR steps leave a
# GRU's state too little room to forget its (wrong) start within a chunk, so the default
# tolerance then needs V-cycles that longer chunks avoid.
EXIT_STEPS = 28
ROWS_PER_STEP = {"cpu": 1024, "cuda": 65536}  # cuda: not calibrated
MIN_CFACTOR, MAX_CFACTOR = 32, 512


def auto_cfactor(
    steps: int,
    batch: int,
    hidden: int,
    device: str = "cpu",
    options: Optional[MGRIT] = None,
    ranks: int = 1,
    kind: str = "step",
) -> int:
    """The chunk length m for ``cfactor="auto"``: the power of two at or below
    ``sqrt(EXIT_STEPS * steps * batch / rows)`` with ``rows`` the fixed part of a fine step
    of the cost model's ``kind`` in rows (:func:`mgrit_gru.cost.overhead_rows`: "sweep" for
    the compiled CPU sweeps, :func:`mgrit_gru.layer.solve.step_kind`; "step" for the PyTorch
    steps), or without early exit nearest to ``steps * batch / (ROWS_PER_STEP[device] * 64 /
    hidden)``; clamped to [MIN_CFACTOR, MAX_CFACTOR]. Rounding
    down: a trained network needs cycles, each a full sweep of its chunks, which the random-
    init model behind the square root does not count; the trained-model benchmark favoured
    the shorter of the two neighbours (docs/measurements.md, "Trained networks").

    With ``ranks`` time-parallel ranks the rule is one process's, on the whole sequence,
    halved only until there are at least as many chunks as ranks; every rank derives the same
    value from the global shape. So P ranks solve with one process's chunk length, and a
    fixed budget gives one process's result at any rank count. (Until 2026-12-05 the rule
    took each rank's share of the sequence, which shrank m as ranks grew; the coarse grid,
    T / m steps solved whole on every rank, then grew with the ranks: with the compiled
    sweeps it was 37-57% of the critical path at 8-16 ranks in the projection, and one
    process's m projected 1.2-1.4x faster there: docs/time-parallel.md, "Scaling".)"""
    m = _auto_cfactor(steps, batch, hidden, device, options, kind)
    while m > 2 and -(-steps // m) < ranks:
        m //= 2
    return m


def _auto_cfactor(steps, batch, hidden, device, options, kind) -> int:
    early_exit = True if options is None else options.early_exit
    where = str(device).split(":")[0]
    if where not in ROWS_PER_STEP:
        where = "cpu"
    if early_exit:
        # (a step's fixed part counted as at least one row: the compiled sweeps' is about
        # zero at small H in the table, where the rule would divide by it)
        rows = max(cost.overhead_rows(hidden, device, kind), 1.0)
        ideal = math.sqrt(EXIT_STEPS * steps * batch / rows)
        m = 2 ** math.floor(math.log2(max(ideal, 1.0)))
    else:
        ideal = steps * batch / (ROWS_PER_STEP[where] * 64 / max(hidden, 1))
        m = 2 ** round(math.log2(max(ideal, 1.0)))
    return int(min(max(m, MIN_CFACTOR), MAX_CFACTOR))


def as_options(solver: object, name: str = "GRU") -> Union[MGRIT, Auto]:
    """Turn the ``solver=`` argument of :class:`mgrit_gru.GRU` (or ``mgrit_gru.LSTM``:
    ``name`` names the module in the error) into options."""
    if isinstance(solver, (MGRIT, Auto)):
        return solver
    if solver == "serial":
        return MGRIT.serial()
    if solver == "mgrit":
        return MGRIT()
    if solver == "auto":
        return Auto()
    raise ValueError(
        f"{name}: unknown solver={solver!r}; pass 'auto' (the default), 'mgrit', 'serial', an "
        "mgrit_gru.MGRIT(...) or an mgrit_gru.Auto(...) object"
    )
