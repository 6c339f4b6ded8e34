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
) -> tuple[list[Grid], SolveResult, SolveStats]:
    """``run(grids)``, and what its verdict calls for: a converged or budgeted solve stands;
    a diverged one falls back to the serial grid (warning once) or raises; one stopped by the
    cost guard falls back silently; one that reached its cap follows ``on_unconverged``.
    ``control`` (a :class:`DivergenceMemory` or :class:`AutoChoice`) may send the call to the
    serial grid at once and learns what it cost. ``spent()``: the modelled cost so far;
    ``name``: the module's (``"GRU"``, ``"LSTM"``), in warnings and errors."""
    serial = [Grid(N=grids[0].N, m=grids[0].N, n=1)]
    key = (pass_, *where)
    mgrit = len(grids) > 1
    reason = control.skip(key) if (control is not None and mgrit) else None
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
