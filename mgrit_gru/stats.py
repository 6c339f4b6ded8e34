"""Solver statistics: non-convergence is data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class SolveStats:
    """One solve of one layer and direction.

    Attributes:
        pass_: ``"forward"`` or ``"backward"`` (the adjoint solve).
        layer, reverse: which layer, and whether it is the reverse direction.
        steps: sequence length T.
        levels: time grids of the solve that gave the result (1 = serial).
        iterations: V-cycles MGRIT ran (also when it then fell back).
        residuals: the relative residual after each relaxation: the largest C-point
            residual divided by the size of the solution there (the forward's hidden states,
            the adjoint's dL/dh_t). Empty for a serial solve.
        converged: the result meets the tolerance: MGRIT converged (to ``tol``, or to
            precision: ``at_floor``), or the result is the serial solve's (exact). False for
            a fixed budget or a kept unconverged result.
        at_floor: MGRIT converged to precision: its residual stopped falling within reach of
            the rounding floor of the arithmetic that ran, above ``tol`` (no further cycle
            can make it smaller).
        fell_back: the result came from the serial solve although MGRIT was asked for
            (after MGRIT stopped, or without trying it: ``skipped``).
        skipped: MGRIT was not tried at all; ``reason`` says why (backoff after divergences,
            or the automatic choice).
        stopped: why MGRIT stopped unconverged: ``"diverged"``, ``"cost"`` (the cost guard:
            finishing was predicted to cost more than the serial solve), ``"cap"``
            (``max_iters``), or None.
        cost, serial_cost: the modelled cost (microseconds, :mod:`mgrit_gru.cost`) of what
            this call ran, and of the serial solve alone.
        row_steps: the steps this call ran times their rows (batch x chunks): each is one row
            of a recurrent GEMM (``W_hh``), the work a flop count of the solve starts from.
        kernels: which kernels ran the steps (:mod:`mgrit_gru.kernels`): ``"compiled"`` (the
            library's compiled C++ sweeps), ``"triton"`` (its Triton sweeps), ``"pytorch"``
            (the cell's PyTorch steps) or
            ``"torch"`` (torch's own RNN kernel, the serial solve of a small batch).
    """

    pass_: str
    layer: int
    reverse: bool
    steps: int
    levels: int
    iterations: int
    residuals: tuple[float, ...]
    converged: bool
    fell_back: bool
    skipped: bool = False
    at_floor: bool = False
    stopped: Optional[str] = None
    reason: Optional[str] = None
    cost: float = 0.0
    serial_cost: float = 0.0
    kernels: str = "pytorch"
    row_steps: int = 0

    @property
    def residual(self) -> float:
        return self.residuals[-1] if self.residuals else 0.0

    @property
    def abandoned(self) -> bool:
        """An MGRIT try that stopped and gave way to the serial solve (not a skipped call)."""
        return self.fell_back and not self.skipped

    @property
    def by_mgrit(self) -> bool:
        """The result came from MGRIT (not from the serial solve)."""
        return self.levels > 1


def _max(values, default=0):
    return max(values, default=default)


@dataclass
class RunStats:
    """All solves of one call of :class:`mgrit_gru.GRU`; ``backward`` fills in when autograd runs
    the backward pass."""

    forward: list[SolveStats] = field(default_factory=list)
    backward: list[SolveStats] = field(default_factory=list)

    @property
    def solves(self) -> list[SolveStats]:
        return self.forward + self.backward

    @property
    def forward_iterations(self) -> int:
        return _max(s.iterations for s in self.forward)

    @property
    def backward_iterations(self) -> int:
        return _max(s.iterations for s in self.backward)

    @property
    def forward_residual(self) -> float:
        return _max((s.residual for s in self.forward), 0.0)

    @property
    def backward_residual(self) -> float:
        return _max((s.residual for s in self.backward), 0.0)

    @property
    def converged(self) -> bool:
        return all(s.converged for s in self.solves)

    @property
    def fell_back(self) -> bool:
        return any(s.fell_back for s in self.solves)

    @property
    def mgrit_share(self) -> tuple[int, int]:
        """(solves whose result came from MGRIT, solves)."""
        return sum(s.by_mgrit for s in self.solves), len(self.solves)

    def summary(self) -> str:
        text = f"fwd it={self.forward_iterations} res={self.forward_residual:.1e}"
        if self.backward:
            text += f" | bwd it={self.backward_iterations} res={self.backward_residual:.1e}"
        floor = sum(s.at_floor for s in self.solves)
        if floor:
            text += f" | {floor} converged to precision"
        reasons = sorted({s.reason for s in self.solves if s.reason})
        stops = sorted({s.stopped for s in self.solves if s.fell_back and s.stopped})
        if reasons:
            text += " | serial: " + "; ".join(reasons)
        elif stops:
            text += f" | fell back to serial ({', '.join(stops)})"
        elif self.solves and not any(s.by_mgrit for s in self.solves):
            text += " | serial"
        return text
