"""What happens around one MGRIT solve: the guard's verdicts, fallbacks, warnings, the
memory of ``on_divergence="backoff"`` and the automatic solver choice (``solver="auto"``).

A call solves one layer, direction and pass (forward or adjoint). Before it, a controller may
say "serial" (backoff after divergences, or the automatic choice); after it, the controller
learns what the call cost. The cost is the model of :mod:`mgrit_gru.cost` (counted steps, not
a clock), so every decision is reproducible.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from .. import cost as cost_model
from ..core import Grid, SolveResult
from ..options import MGRIT
from ..stats import SolveStats


class DivergenceError(RuntimeError):
    """An MGRIT solve diverged (``MGRIT(on_divergence="raise")``) or stopped unconverged
    (``on_unconverged="raise"``), or a state became NaN or Inf under a fixed budget."""


class DivergenceWarning(UserWarning):
    """An MGRIT solve diverged and its call fell back to the serial solve."""


class ConvergenceWarning(UserWarning):
    """An MGRIT solve reached its cycle cap above the tolerance."""


@dataclass
class Outcome:
    """What one call of a layer and pass ran and cost (model microseconds)."""

    mgrit: bool  # MGRIT was tried
    spent: float  # everything the call ran, a fallback included
    serial: float  # what the serial solve alone costs
    stopped: Optional[str] = None


class DivergenceMemory:
    """For ``on_divergence="backoff"``: per layer, direction and pass, how many coming calls
    skip MGRIT. A divergence skips the next 1 call, a second one in a row the next 2, then 4,
    ... up to MAX_SKIP; a converged MGRIT solve resets the count. Ranks of a time group see
    the same divergences, so they keep the same memory."""

    MAX_SKIP = 64
    skip_is_fallback = True  # a skipped call falls back after divergences
    warns = True  # a divergence is news to the user

    def __init__(self) -> None:
        self._state: dict[tuple, list[int]] = {}  # key -> [calls left to skip, next skip]

    def skip(self, key: tuple) -> Optional[str]:
        state = self._state.get(key)
        if state is None or state[0] == 0:
            return None
        state[0] -= 1
        return "backing off after divergence"

    def record(self, key: tuple, outcome: Outcome) -> None:
        if not outcome.mgrit:
            return
        if outcome.stopped is None:
            self._state.pop(key, None)
            return
        state = self._state.setdefault(key, [0, 1])
        state[0], state[1] = state[1], min(2 * state[1], self.MAX_SKIP)

    def state_dict(self) -> dict:
        return {"/".join(map(str, k)): list(v) for k, v in self._state.items()}

    def load_state_dict(self, state: dict) -> None:
        self._state = {_key(k): list(v) for k, v in state.items()}
        self._budget = None  # a new memory: the module's "budget" state is loaded apart

    @property
    def budget(self) -> BudgetMemory:
        """The cycle budget's memory (calibration and statistics) of the same module."""
        if getattr(self, "_budget", None) is None:  # (a memory pickled before it existed)
            self._budget = BudgetMemory()
        return self._budget


class BudgetWarning(UserWarning):
    """A fixed cycle budget whose estimated gradient error stays above the bound."""


@dataclass(frozen=True)
class BudgetPlan:
    """One budgeted solve's rule: run at least ``min_iters`` cycles, then stop once the
    relative residual is at most ``tol`` (0: never), at ``max_iters`` at the latest; ``check``:
    also measure the result against the exact solve (calibrates the residual's ratio)."""

    min_iters: int
    max_iters: int
    tol: float
    check: bool
    ratio: float


class BudgetMemory:
    """Per layer, direction and pass of one module: what a cycle budget
    (:class:`mgrit_gru.Budget`, :class:`mgrit_gru.AdaptiveBudget`) has learnt about its error.

    The error of a budgeted solve is estimated as ``ratio * r``, ``r`` its relative residual
    after its cycles. Every ``every``-th call of a key (the first included) is an exact check:
    the solve also runs serially, its measured error ``e`` gives ``ratio = e / r``, kept
    conservative by ``max(e / r, previous / 2)`` and clamped to ``[RATIO_MIN, RATIO_MAX]``. An
    adaptive budget then cycles until ``ratio * r <= theta / 2`` (each pass's share of the
    gradient's error bound), between its minimum and its cap; a fixed budget runs its cycles
    and only estimates. A fixed budget whose estimated gradient error (forward plus adjoint of a
    layer) is above the bound at ``WARN_CHECKS`` checks in a row warns once. Decisions depend
    on residuals and counts only: a resumed run (:meth:`state_dict`) decides alike.

    ``take()`` returns and resets the statistics since its last call (what the training
    application reports per epoch)."""

    RATIO_MIN, RATIO_MAX = 1e-3, 1e6
    WARN_CHECKS = 3
    FIXED_EVERY = 16  # a fixed budget's exact checks (which only estimate)

    def __init__(self) -> None:
        # key -> {"calls", "ratio" (None before the first check), "over" (checks in a row
        # above the bound)}
        self._state: dict[tuple, dict] = {}
        self.warned = False
        self._reset()

    def _reset(self) -> None:
        # per pass: solves, cycles, estimated errors summed, their largest, checks, the
        # measured errors at the checks summed and their largest
        self._stats = {
            p: {"solves": 0, "cycles": 0, "est": 0.0, "est_max": 0.0, "checks": 0,
                "measured": 0.0, "measured_max": 0.0}
            for p in ("forward", "backward")
        }  # fmt: skip

    def _entry(self, key: tuple) -> dict:
        return self._state.setdefault(key, {"calls": 0, "ratio": None, "over": 0})

    def plan(self, key: tuple, budget) -> BudgetPlan:
        """The rule of the coming solve of ``key`` = (pass, layer, reverse) under ``budget``."""
        entry = self._entry(key)
        forward = key[0] == "forward"
        least = budget.forward if forward else budget.backward
        every = budget.every if budget.adaptive else self.FIXED_EVERY
        check = entry["calls"] % every == 0
        entry["calls"] += 1
        ratio = 1.0 if entry["ratio"] is None else entry["ratio"]
        if not budget.adaptive:
            return BudgetPlan(least, least, 0.0, check, ratio)
        most = budget.max_forward if forward else budget.max_backward
        return BudgetPlan(least, most, 0.5 * budget.theta / ratio, check, ratio)

    def learn(self, key: tuple, plan: BudgetPlan, residuals, iterations: int, measured=None):
        """What the solve of ``key`` ran: its residuals and cycles, and at a check the error
        ``measured`` against the exact solve. Returns its estimated error."""
        entry = self._entry(key)
        r = residuals[-1] if residuals else 0.0
        ratio = plan.ratio
        if measured is not None:
            found = measured / r if r > 0.0 else self.RATIO_MIN
            last = entry["ratio"]
            ratio = found if last is None else max(found, 0.5 * last)
            entry["ratio"] = ratio = min(max(ratio, self.RATIO_MIN), self.RATIO_MAX)
        est = measured if measured is not None else ratio * r
        stats = self._stats[key[0]]
        stats["solves"] += 1
        stats["cycles"] += iterations
        stats["est"] += est
        stats["est_max"] = max(stats["est_max"], est)
        if measured is not None:
            stats["checks"] += 1
            stats["measured"] += measured
            stats["measured_max"] = max(stats["measured_max"], measured)
        entry["last"] = est
        return est

    def judge(self, key: tuple, budget, theta: float, name: str = "GRU") -> None:
        """After a checked adjoint of ``key``'s layer: a fixed budget whose layer's estimated
        gradient error (its forward's and adjoint's last estimates) stays above ``theta``
        warns once."""
        if budget.adaptive:
            return
        fwd = self._state.get(("forward", *key[1:]), {}).get("last", 0.0)
        entry = self._entry(key)
        over = fwd + entry.get("last", 0.0) > theta
        entry["over"] = entry["over"] + 1 if over else 0
        if entry["over"] >= self.WARN_CHECKS and not self.warned:
            self.warned = True
            warnings.warn(
                f"{name}: the fixed budget's estimated gradient error stays above "
                f"{theta:g} ({fwd + entry['last']:.2g} at {entry['over']} checks in a row): "
                "the model may train worse than the exact solve; use "
                "mgrit_gru.AdaptiveBudget(theta=...) (CLI: --budget-theta)",
                BudgetWarning,
                stacklevel=2,
            )

    def current(self) -> dict:
        """The statistics since the last :meth:`take`, without a reset."""
        saved = {p: dict(v) for p, v in self._stats.items()}
        out = self.take()
        self._stats = saved
        return out

    def take(self) -> dict:
        """The statistics since the last call, and a reset: per pass the mean cycles per
        solve, the mean and largest estimated error, the checks and their mean and largest
        measured error; ``grad_err_est``: forward plus adjoint mean estimates, the estimated
        relative error of the gradient."""
        out = {}
        for p, s in self._stats.items():
            n, c = max(s["solves"], 1), max(s["checks"], 1)
            short = "fwd" if p == "forward" else "bwd"
            out.update({
                f"{short}_solves": s["solves"],
                f"{short}_cycles_mean": s["cycles"] / n,
                f"{short}_err_est_mean": s["est"] / n,
                f"{short}_err_est_max": s["est_max"],
                f"{short}_checks": s["checks"],
                f"{short}_err_checked_mean": s["measured"] / c,
                f"{short}_err_checked_max": s["measured_max"],
            })  # fmt: skip
        out["grad_err_est"] = out["fwd_err_est_mean"] + out["bwd_err_est_mean"]
        self._reset()
        return out

    def state_dict(self) -> dict:
        return {
            "keys": {"/".join(map(str, k)): dict(v) for k, v in self._state.items()},
            "warned": self.warned,
        }

    def load_state_dict(self, state: dict) -> None:
        self._state = {_key(k): dict(v) for k, v in state.get("keys", {}).items()}
        self.warned = bool(state.get("warned", False))


def _key(text: str) -> tuple:
    pass_, layer, reverse = text.split("/")
    return (pass_, int(layer), reverse == "True")


class AutoChoice:
    """The state of ``solver="auto"``: per layer, direction and pass, MGRIT while a call of
    it costs no more than the serial solve (the modelled cost of everything it ran, a
    fallback included), else serial for the next calls, then MGRIT is tried again. The wait
    is FIRST_WAIT, 2 FIRST_WAIT, ... ``max_wait`` calls while MGRIT keeps losing (reset when
    it wins), and at least what the losing call cost beyond the serial solve, divided by
    TRY_SHARE: the tries that lose add at most about TRY_SHARE of the serial work between
    them (a try the cost guard stops costs about one relaxation and a cycle on top of the
    serial solve, so it waits about 16 calls), while an easy phase is still found within a
    few calls once a try wins."""

    skip_is_fallback = False  # serial is a choice here, not a fallback
    warns = False  # choosing is its job: a divergence is nothing to tell
    prices = True  # a call whose MGRIT the model rules out runs serially untried
    FIRST_WAIT = 4
    TRY_SHARE = 0.05

    def __init__(self, max_wait: int = 64) -> None:
        self.max_wait = max_wait
        # key -> {"wait": calls left on serial, "next": the next wait, "ratio": last MGRIT
        # cost / serial cost, "mgrit": calls solved by MGRIT, "calls": calls}
        self._state: dict[tuple, dict] = {}

    def _entry(self, key: tuple) -> dict:
        return self._state.setdefault(
            key, {"wait": 0, "next": self.FIRST_WAIT, "ratio": None, "mgrit": 0, "calls": 0}
        )

    def skip(self, key: tuple) -> Optional[str]:
        entry = self._entry(key)
        entry["calls"] += 1
        if entry["wait"] == 0:
            return None
        entry["wait"] -= 1
        return f"auto: serial (MGRIT cost {entry['ratio']:.2f}x the serial solve at its last try)"

    def record(self, key: tuple, outcome: Outcome) -> None:
        if not outcome.mgrit:
            return
        entry = self._entry(key)
        entry["ratio"] = ratio = outcome.spent / max(outcome.serial, 1e-9)
        if outcome.stopped is None and outcome.spent <= outcome.serial:
            entry["mgrit"] += 1
            entry["next"] = min(self.FIRST_WAIT, self.max_wait)
        else:
            paid = math.ceil(min(max(ratio - 1.0, 0.0), self.max_wait) / self.TRY_SHARE)
            entry["wait"] = min(max(entry["next"], paid), self.max_wait)
            entry["next"] = min(2 * entry["next"], self.max_wait)

    def share(self) -> tuple[int, int]:
        """(calls solved by MGRIT, calls) over every layer and pass so far."""
        return (
            sum(e["mgrit"] for e in self._state.values()),
            sum(e["calls"] for e in self._state.values()),
        )

    def state_dict(self) -> dict:
        return {"/".join(map(str, k)): dict(v) for k, v in self._state.items()}

    def load_state_dict(self, state: dict) -> None:
        self._state = {_key(k): dict(v) for k, v in state.items()}


def solve_guarded(
    pass_: str,
    options: MGRIT,
    run: Callable[[list[Grid]], SolveResult],
    grids: list[Grid],
    where: tuple[int, bool],
    control=None,
    spent: Optional[Callable[[], float]] = None,
    serial_cost: float = 0.0,
    name: str = "GRU",
    least: float = 0.0,
    ready: Optional[Callable[[], bool]] = None,
) -> tuple[list[Grid], SolveResult, SolveStats]:
    """``run(grids)``, and what its verdict calls for: a converged or budgeted solve stands;
    a diverged one falls back to the serial grid (warning once) or raises; one stopped by the
    cost guard falls back silently; one that reached its cap follows ``on_unconverged``.
    ``control`` (a :class:`DivergenceMemory` or :class:`AutoChoice`) may send the call to the
    serial grid at once and learns what it cost. ``spent()``: the modelled cost so far;
    ``name``: the module's (``"GRU"``, ``"LSTM"``), in warnings and errors. ``least``: the
    modelled least cost of the MGRIT solve (its first relaxation); a control that ``prices``
    (:class:`AutoChoice`) sends the call to the serial grid without trying MGRIT where that is
    within the model's error of ``serial_cost`` (:func:`mgrit_gru.cost.mgrit_hopeless`).
    ``ready()``: called only where MGRIT is to be tried, after the control's verdict (so
    that what only MGRIT needs is made only then); False sends the call to the serial grid as
    if it had one grid (a non-finite right-hand side: no try, no fallback, nothing learnt; the
    control's verdict, taken before, stands as it was taken: a call it skipped is counted and
    reported as skipped, as any other)."""
    serial = [Grid(N=grids[0].N, m=grids[0].N, n=1)]
    key = (pass_, *where)
    if options.budget is not None:  # a budget's solve stands: nothing to skip or back off
        control = None  # (its memory, control.budget, is the caller's)
    mgrit = len(grids) > 1
    reason = control.skip(key) if (control is not None and mgrit) else None
    if reason is None and mgrit and getattr(control, "prices", False):
        if cost_model.mgrit_hopeless(least, serial_cost):
            reason = (
                f"auto: serial (the model prices MGRIT's first relaxation alone at "
                f"{least / serial_cost:.2f}x the serial solve)"
            )
    if mgrit and reason is None and ready is not None and not ready():
        mgrit = False
    fell_back = False
    if not mgrit or reason is not None:
        grids, result = serial, run(serial)
        fell_back = reason is not None and control.skip_is_fallback
        tried = None
    else:
        result = run(grids)
        tried = result
        quiet = control is not None and not control.warns
        if _falls_back(pass_, options, result, quiet, name):
            grids, result, fell_back = serial, run(serial), True
            result.residuals, result.iterations = tried.residuals, tried.iterations
    if control is not None and mgrit:
        cost = 0.0 if spent is None else spent()
        stopped = None if tried is None else tried.stopped
        control.record(key, Outcome(tried is not None, cost, serial_cost, stopped))
    layer, reverse = where
    stats = SolveStats(
        pass_=pass_,
        layer=layer,
        reverse=reverse,
        steps=grids[0].N,
        levels=len(grids),
        iterations=result.iterations,
        residuals=tuple(result.residuals),
        converged=result.converged,
        at_floor=result.at_floor,
        fell_back=fell_back,
        skipped=reason is not None,
        stopped=None if tried is None else tried.stopped,
        reason=reason,
        cost=0.0 if spent is None else spent(),
        serial_cost=serial_cost,
    )
    return grids, result, stats


def _falls_back(
    pass_: str, options: MGRIT, result: SolveResult, quiet: bool = False, name: str = "GRU"
) -> bool:
    """Whether this MGRIT result gives way to the serial solve (after a warning unless
    ``quiet``, or raises)."""
    history = ", ".join(f"{r:.2e}" for r in result.residuals)
    if options.budget is not None:
        if result.stopped == "diverged":  # not finite: no budget makes that an answer
            raise DivergenceError(
                f"MGRIT {pass_} solve under a fixed budget produced a non-finite state "
                f"(residuals {history}); lower the learning rate, or train with a larger budget"
            )
        return False
    if result.stopped is None:
        return False
    if result.stopped == "cost":
        return True  # the cost guard's verdict: the serial solve is the cheaper way on
    if result.stopped == "diverged":
        if options.on_divergence == "raise":
            raise DivergenceError(
                f"{name}: MGRIT {pass_} solve diverged (residuals {history}); {_advice(options)}, "
                "or on_divergence='fallback'"
            )
        if quiet:
            return True
        # A constant text, so that Python's default filter shows it once, not on every batch.
        warnings.warn(
            f"{name}: MGRIT {pass_} solve diverged; falling back to the exact serial solve for "
            f"such calls (residual histories and fell_back flags are in {name}.last_stats)",
            DivergenceWarning,
            stacklevel=6,
        )
        return True
    # "cap": max_iters cycles without reaching the tolerance
    if quiet:
        return options.on_unconverged != "warn"
    if options.on_unconverged == "raise":
        raise DivergenceError(
            f"{name}: MGRIT {pass_} solve did not reach tol within max_iters={result.iterations} "
            f"cycles (residuals {history}); {_advice(options)}, raise max_iters, or "
            "on_unconverged='fallback'"
        )
    warnings.warn(
        f"{name}: MGRIT {pass_} solve stopped at its cycle cap above the tolerance; "
        + (
            "falling back to the exact serial solve for such calls"
            if options.on_unconverged == "fallback"
            else "its result is kept (on_unconverged='warn')"
        )
        + f" (residuals in {name}.last_stats; raise max_iters or choose on_unconverged)",
        ConvergenceWarning,
        stacklevel=6,
    )
    return options.on_unconverged == "fallback"


def warn_tol_raised(pass_: str, rule, dtype) -> None:
    """One warning (per tolerance, floor and dtype: Python's filter shows a text once) that a
    tolerance below what the arithmetic can reach was raised to its rounding floor."""
    warnings.warn(
        f"MGRIT {pass_} tolerance {rule.asked:.1e} is below what {str(dtype).split('.')[-1]} "
        f"arithmetic can reach here; using its rounding floor {rule.floor:.1e} instead",
        ConvergenceWarning,
        stacklevel=7,
    )


def _advice(options: MGRIT) -> str:
    """What to change in ``options`` for a solve that does not converge."""
    if options.relax == "F":
        return "use relax='FCF'"
    return f"use more C-F sweeps (relax='{options.relax}CF') or longer chunks (cfactor)"


def budget_memory(module) -> Optional[BudgetMemory]:
    """The cycle budget's memory of a ``mgrit_gru.GRU`` or ``LSTM`` (its estimated errors and
    cycles: :meth:`BudgetMemory.take`), or None for another module."""
    divergence = getattr(module, "_divergence", None)
    return None if divergence is None else divergence.budget
