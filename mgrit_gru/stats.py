"""Solver statistics: non-convergence is data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SolveStats:
    """One solve of one layer and direction.

    Attributes:
        pass_: ``"forward"`` or ``"backward"`` (the adjoint solve).
        layer, reverse: which layer, and whether it is the reverse direction.
        steps: sequence length T.
        levels: time grids used (1 = serial).
        iterations: V-cycles run.
        residuals: largest absolute C-point residual after each relaxation (forward: absolute;
            backward: relative to the largest incoming gradient). Empty for a serial solve.
        converged: the last residual met the tolerance (always True for a serial solve).
        fell_back: the MGRIT solve diverged and this result came from the serial solve.
        skipped: with ``on_divergence="backoff"``, MGRIT was not tried at all (earlier calls of
            this layer and pass diverged); the result came from the serial solve.
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

    @property
    def residual(self) -> float:
        return self.residuals[-1] if self.residuals else 0.0


def _max(values, default=0):
    return max(values, default=default)


@dataclass
class RunStats:
    """All solves of one call of :class:`mgrit_gru.GRU`; ``backward`` fills in when autograd runs
    the backward pass."""

    forward: list[SolveStats] = field(default_factory=list)
    backward: list[SolveStats] = field(default_factory=list)

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
        return all(s.converged for s in self.forward + self.backward)

    @property
    def fell_back(self) -> bool:
        return any(s.fell_back for s in self.forward + self.backward)

    def summary(self) -> str:
        text = f"fwd it={self.forward_iterations} res={self.forward_residual:.1e}"
        if self.backward:
            text += f" | bwd it={self.backward_iterations} res={self.backward_residual:.1e}"
        if any(s.skipped for s in self.forward + self.backward):
            text += " | serial (backing off after divergence)"
        elif self.fell_back:
            text += " | fell back to serial"
        return text
