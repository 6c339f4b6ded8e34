"""What a GRU step costs: the model behind ``cfactor="auto"``, the cost guard and the
automatic solver choice.

Every decision made from it is a function of counts (steps, rows, cycles), never of a clock:
two runs of the same training make the same choices, and a resumed run continues exactly.

A step over ``rows`` states (batch x chunks) of hidden size H costs ``o + c * rows``
microseconds: a fixed overhead (Python, kernel launches) plus the arithmetic, whose cost grows
as ``H^1.75`` over H = 32-128 on the CPU (the GEMMs' H^2 dominate at larger H). Three kinds:

- ``"step"``: the library's batched forward step (MGRIT's sweeps; the serial loop where it is
  used);
- ``"fused"``: ``torch.nn.GRU``'s own CPU loop, which the serial forward uses for small
  batches (``mgrit_gru.gru.solve.FUSED_MAX``);
- ``"adjoint"``: one step of the adjoint recurrence.

Calibrated with ``python benchmarks/step_cost.py`` (one thread, fp32, this project's 2-core
CPU, 2026-12-03; each kind timed as the solves run it, loop and bookkeeping included; "fused"
fitted over batches 1-64, where the serial forward uses it). The CUDA row is an estimate (no
GPU was measured): a step there is launch latency, about 5-10 us per kernel and 6-10 kernels,
almost free of its rows; ``benchmarks/gpu_check.sh`` prints a measured row.
"""

from __future__ import annotations

# device kind -> step kind -> (o in us, c in us per row at H = 64)
CALIBRATION = {
    "cpu": {"step": (32.0, 0.40), "fused": (12.0, 0.60), "adjoint": (7.0, 0.50)},
    "cuda": {"step": (70.0, 0.003), "fused": (15.0, 0.003), "adjoint": (30.0, 0.003)},
}
H_EXPONENT = 1.75


def _kind(device: str) -> str:
    kind = str(device).split(":")[0]
    return kind if kind in CALIBRATION else "cpu"


def step_us(kind: str, rows: int, hidden: int, device: str = "cpu") -> float:
    """Modelled time of one step of ``kind`` over ``rows`` states."""
    o, c = CALIBRATION[_kind(device)][kind]
    return o + c * rows * (hidden / 64) ** H_EXPONENT


def overhead_rows(hidden: int, device: str = "cpu", kind: str = "step") -> float:
    """``o / c``: the rows whose arithmetic costs as much as one step's overhead."""
    o, c = CALIBRATION[_kind(device)][kind]
    return o / (c * (hidden / 64) ** H_EXPONENT)


class Meter:
    """Adds up the modelled cost of the steps a solve runs (its propagators report to it)."""

    def __init__(self, hidden: int, device: str = "cpu") -> None:
        self.hidden, self.device = hidden, device
        self.spent = 0.0

    def add(self, kind: str, rows: int, calls: int = 1) -> None:
        self.spent += calls * step_us(kind, rows, self.hidden, self.device)


def serial_us(kind: str, steps: int, batch: int, hidden: int, device: str = "cpu") -> float:
    """Modelled time of a serial sweep of ``steps`` steps over ``batch`` sequences."""
    return steps * step_us(kind, batch, hidden, device)
