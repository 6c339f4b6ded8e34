"""When an MGRIT solve stops: its residual judged beside the size of the solution it belongs
to, and beside the precision floor of the arithmetic that computes it.

A residual only means something next to the size of what it measures. The cycle's residual
is the largest C-point residual ``|Phi(u_F) - u_C|``; :class:`StopTest` divides it by the size
of the solution at the C-points (their largest absolute value, at least ``data``: the size of
what drives the solution, so that a solution near zero is judged against its data). For a GRU
forward the states lie in (-1, 1) and trained ones are O(1), so this is close to an absolute
test; for the adjoint, whose state accumulates the incoming gradients over the network's
memory (hundreds of times a mean-pooled head's per-step gradient), it is what makes the test
mean the same thing for every loss.

No iteration gets the relative residual below what rounding leaves in one evaluation of a
chunk: a few units of roundoff of the arithmetic that ran (:func:`roundoff`), growing slowly
with the chunk length. :func:`floor` is that level with a margin (measured:
docs/convergence.md, "Measured stalls"); a tolerance below it is raised to it, and a solve
whose residual stops falling within ``STALL_BAND`` floors of it has converged to precision
(:attr:`StopTest.stalled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# floor(m) = FLOOR_ULPS * sqrt(m) * roundoff: the relative residual that rounding leaves after
# a chunk of m steps (measured stalls: docs/convergence.md).
FLOOR_ULPS = 8.0
# A residual that stops falling (less than halved against the best so far) within this many
# floors has converged to precision; one that stalls higher has not.
STALL_BAND = 10.0


def roundoff(dtype: torch.dtype, device_type: str = "cpu") -> float:
    """The machine epsilon of the arithmetic that a solve in ``dtype`` on ``device_type`` runs
    with: the dtype's own, or for float32 that of the matrix products when torch is set to
    compute them in TF32 (2^-10) or bfloat16 (2^-7) (``torch.backends.cuda.matmul``,
    ``torch.backends.mkldnn.matmul``, ``torch.set_float32_matmul_precision``)."""
    eps = torch.finfo(dtype).eps
    if dtype != torch.float32:
        return eps
    cuda = device_type == "cuda"
    backend = torch.backends.cuda.matmul if cuda else getattr(torch.backends.mkldnn, "matmul", None)
    precision = str(getattr(backend, "fp32_precision", "none"))
    legacy = torch.get_float32_matmul_precision()  # "none" above: this older setting rules
    if precision == "bf16" or (precision == "none" and legacy == "medium"):
        return 2.0**-7
    legacy_tf32 = cuda and (legacy == "high" or torch.backends.cuda.matmul.allow_tf32)
    if precision == "tf32" or (precision == "none" and legacy_tf32):
        return 2.0**-10
    return eps


def floor(dtype: torch.dtype, device_type: str, cfactor: int) -> float:
    """The relative residual that rounding alone leaves for chunks of ``cfactor`` steps."""
    return FLOOR_ULPS * math.sqrt(max(cfactor, 1)) * roundoff(dtype, device_type)


@dataclass(frozen=True)
class StopTest:
    """A solve's stopping test on the relative residual (see the module's docstring).

    Args:
        tol: converged once the relative residual is at most ``tol`` (0 with a cycle budget:
            run the budget's cycles).
        floor: the relative residual rounding leaves (:func:`floor`); 0: not judged.
        data: the smallest scale a residual is divided by (the size of the solution's data).
        blocks: the state's last axis holds this many equal blocks (an LSTM's ``[h, c]``:
            2), each judged by its own size: a residual of ``h`` is not divided by the size of
            a large ``c``.
    """

    tol: float = 0.0
    floor: float = 0.0
    data: float = 0.0
    blocks: int = 1

    def scale(self, solution_size: float) -> float:
        return max(solution_size, self.data, torch.finfo(torch.float64).tiny)

    def stalled(self, residuals: list[float]) -> bool:
        """The last residual sits within ``STALL_BAND`` floors and fell less than half against
        the best before it: converged to precision."""
        if self.floor <= 0.0 or len(residuals) < 2:
            return False
        last = residuals[-1]
        return last <= STALL_BAND * self.floor and last > 0.5 * min(residuals[:-1])
