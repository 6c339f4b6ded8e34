"""Solver options: one frozen, validated object.

References: Falgout et al., "Parallel time integration with multigrid", SISC 2014 (MGRIT);
Moon & Cyr, "Parallel Training of GRU Networks with a Multi-Grid Solver for Long Sequences",
ICLR 2022.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Union

RELAX_CHOICES = ("F", "FCF")
COARSE_GATES_CHOICES = ("average", "inject")
ON_DIVERGENCE_CHOICES = ("fallback", "backoff", "raise")


def _bad(field: str, value: object, legal: str) -> ValueError:
    return ValueError(f"MGRIT: invalid {field}={value!r}; {legal}")


def _check_int(field: str, value: object, low: int, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(field, value, f"expected an integer >= {low}{alternative}")


def _check_tol(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(field, value, "expected a finite number >= 0")
    if not math.isfinite(value) or value < 0:
        raise _bad(field, value, "expected a finite number >= 0")


@dataclass(frozen=True)
class MGRIT:
    """Options of the multigrid-reduction-in-time solve of one GRU layer.

    Args:
        cfactor: coarsening factor m: level l keeps every m-th point of level l-1 (>= 2), or
            ``"auto"``: chosen per call from T, batch, hidden size and device by
            :func:`auto_cfactor`.
        levels: number of time grids (1 = the exact serial solve), or ``"auto"``: coarsen
            until the coarsest grid has at most ``cfactor`` intervals.
        relax: ``"F"`` (F-relaxation) or ``"FCF"`` (F, then C, then F).
        tol: forward stopping tolerance on the largest absolute C-point residual (the
            hidden state lives in (-1, 1), so this is an absolute state error scale).
        max_iters: cap on forward V-cycles (0 = no cycle: one relaxation sweep only).
        backward_tol: adjoint tolerance, relative to the largest incoming gradient
            (dL/dy, dL/dh_n). ``None``: same as ``tol``.
        backward_max_iters: cap on adjoint V-cycles. ``None``: same as ``max_iters``.
        coarse_gates: what a coarse implicit step reads as its input gates: the
            ``"average"`` of the fine input gates over its interval, or the gates at the
            interval's first point (``"inject"``, as in the paper's code).
        on_divergence: a non-finite or growing residual either makes the call
            ``"fallback"`` to the exact serial solve (with one warning) or ``"raise"``;
            ``"backoff"`` falls back too and then solves that layer and pass serially for the
            next 1, 2, 4, ... 64 calls after consecutive divergences, without trying MGRIT (a
            converged MGRIT solve resets it): for training, where a network that has become
            hard for MGRIT stays hard.
        keep_gates: the forward keeps every fine step's gates (4H floats per step and
            sequence) so that the backward linearises without GEMMs; ``False`` recomputes
            them in the backward instead, when memory is the limit.
        early_exit: an F-relaxation that follows another (FCF's second, or one after a
            coarse correction) stops once its new states agree with the previous sweep's to
            the tolerance, everywhere: each chunk has then forgotten the change of its start,
            and the rest of the chunk is kept. The residual it leaves counts in the stopping
            test, so a converged solve meets ``tol`` as without it. ``False``: every sweep
            runs to the end of its chunks.

    ``MGRIT.serial()`` is the exact sequential reference on the same kernels.
    """

    cfactor: Union[int, Literal["auto"]] = 32
    levels: Union[int, Literal["auto"]] = "auto"
    relax: Literal["F", "FCF"] = "FCF"
    tol: float = 1e-5
    max_iters: int = 10
    backward_tol: float | None = None
    backward_max_iters: int | None = None
    coarse_gates: Literal["average", "inject"] = "average"
    on_divergence: Literal["fallback", "backoff", "raise"] = "fallback"
    keep_gates: bool = True
    early_exit: bool = True

    def __post_init__(self) -> None:
        if self.cfactor != "auto":
            _check_int("cfactor", self.cfactor, 2, " or 'auto'")
        if self.levels != "auto":
            _check_int("levels", self.levels, 1)
        if self.relax not in RELAX_CHOICES:
            raise _bad("relax", self.relax, f"choose one of {RELAX_CHOICES}")
        _check_tol("tol", self.tol)
        _check_int("max_iters", self.max_iters, 0)
        if self.backward_tol is not None:
            _check_tol("backward_tol", self.backward_tol)
        if self.backward_max_iters is not None:
            _check_int("backward_max_iters", self.backward_max_iters, 0)
        if self.coarse_gates not in COARSE_GATES_CHOICES:
            raise _bad("coarse_gates", self.coarse_gates, f"choose one of {COARSE_GATES_CHOICES}")
        if self.on_divergence not in ON_DIVERGENCE_CHOICES:
            raise _bad(
                "on_divergence", self.on_divergence, f"choose one of {ON_DIVERGENCE_CHOICES}"
            )
        for name in ("keep_gates", "early_exit"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "expected True or False")

    @classmethod
    def serial(cls) -> MGRIT:
        """The exact sequential solve (one level) on the same kernels."""
        return cls(levels=1)

    @property
    def is_serial(self) -> bool:
        return self.levels == 1

    @property
    def bwd_tol(self) -> float:
        return self.tol if self.backward_tol is None else self.backward_tol

    @property
    def bwd_max_iters(self) -> int:
        return self.max_iters if self.backward_max_iters is None else self.backward_max_iters

    def resolve(self, steps: int, batch: int, hidden: int, device: str = "cpu") -> MGRIT:
        """These options for one call: ``cfactor="auto"`` replaced by :func:`auto_cfactor`."""
        if self.cfactor != "auto":
            return self
        return replace(self, cfactor=auto_cfactor(steps, batch, hidden, device, self.early_exit))

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


# The cost model of cfactor="auto" (README, "Automatic settings"; checked by
# benchmarks/auto_settings.py). A pass's time is dominated by the relaxation sweeps: sequential
# batched steps over the T/m chunks' B rows at once, each costing a fixed overhead o plus c per
# row. FCF's first sweep takes m - 1 steps; with early exit its second stops after about
# EXIT_STEPS (where an untrained GRU has forgotten its chunk's start to tol 1e-5, measured),
# so a pass costs about (m - 1 + EXIT_STEPS)(o + c T B / m), least at
# m = sqrt(EXIT_STEPS * T * B * c / o). o / c is OVERHEAD_ROWS rows at H=64 and scales as
# (64 / H)^1.5 (CPU, one thread, measured at H = 64, 128, 256). Without early exit both sweeps
# take m - 1 steps and the rule is the older one: about ROWS_PER_STEP * 64 / H rows per batched
# step, as many as stay in the core's cache. Chunks shorter than MIN_CFACTOR steps leave an
# untrained GRU's state too little room to forget its (wrong) start within a chunk, so the
# default tolerance then needs V-cycles that longer chunks avoid.
EXIT_STEPS = 28
OVERHEAD_ROWS = {"cpu": 120, "cuda": 16384}  # cuda: not calibrated (no GPU measured)
ROWS_PER_STEP = {"cpu": 1024, "cuda": 65536}  # cuda: not calibrated
MIN_CFACTOR, MAX_CFACTOR = 32, 512


def auto_cfactor(
    steps: int, batch: int, hidden: int, device: str = "cpu", early_exit: bool = True
) -> int:
    """The chunk length m for ``cfactor="auto"``: the power of two nearest to
    ``sqrt(EXIT_STEPS * steps * batch / rows)`` with ``rows = OVERHEAD_ROWS[device] *
    (64 / hidden)^1.5``, or without early exit to ``steps * batch / (ROWS_PER_STEP[device] *
    64 / hidden)``; clamped to [MIN_CFACTOR, MAX_CFACTOR]."""
    kind = str(device).split(":")[0]
    if kind not in OVERHEAD_ROWS:
        kind = "cpu"
    scale = 64 / max(hidden, 1)
    if early_exit:
        ideal = math.sqrt(EXIT_STEPS * steps * batch / (OVERHEAD_ROWS[kind] * scale**1.5))
    else:
        ideal = steps * batch / (ROWS_PER_STEP[kind] * scale)
    m = 2 ** round(math.log2(max(ideal, 1.0)))
    return int(min(max(m, MIN_CFACTOR), MAX_CFACTOR))


def as_options(solver: object) -> MGRIT:
    """Turn the ``solver=`` argument of :class:`mgrit_gru.GRU` into an :class:`MGRIT`."""
    if isinstance(solver, MGRIT):
        return solver
    if solver == "serial":
        return MGRIT.serial()
    if solver == "mgrit" or solver is None:
        return MGRIT()
    raise ValueError(
        f"GRU: unknown solver={solver!r}; pass 'mgrit', 'serial' or an mgrit_gru.MGRIT(...) object"
    )
