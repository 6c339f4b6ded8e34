"""The H200 model's validation from the logged GPU runs (no GPU needed): the least-squares fit
of its per-operator costs on the calibration run's short sequences, then its predictions
against every measured training step, the held-out long sequences and another lease's.

    python benchmarks/gpu_validation.py [--runs docs/logs]

Reads gpu-run3/host_traces.json (per training step: the measured time, a host-timed trace and
an operator-counted trace; benchmarks/gpu_host_trace.py) and gpu-run2/bench.json (the
projection rows measured on an earlier lease of the same kind of machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru.projection import LINKS, Machine, expand, replay  # noqa: E402
from mgrit_gru.projection.machines import H200  # noqa: E402
from mgrit_gru.trace import Event, Trace  # noqa: E402

CALIBRATION_T = (1024, 4096)


def fit(rows: list[dict]) -> tuple[float, float]:
    """us per computing operator and per view: least squares of the host's time per event
    window against its counted operators and views (cuDNN's fused loop left out)."""
    sxx = sxy = syy = bx = by = 0.0
    for row in rows:
        for h, c in zip(row["host"], row["counted"]):
            if c["kind"] == "fused":
                continue
            x, y, t = c["ops"], c["views"], 1e6 * h["seconds"]
            sxx, sxy, syy, bx, by = sxx + x * x, sxy + x * y, syy + y * y, bx + x * t, by + y * t
    det = sxx * syy - sxy * sxy
    return (bx * syy - by * sxy) / det, (by * sxx - bx * sxy) / det


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default=str(ROOT / "docs" / "logs"))
    args = p.parse_args()
    runs = Path(args.runs)
    host = json.loads((runs / "gpu-run3" / "host_traces.json").read_text())
    lease2 = {
        (r["T"], r["solver"]): r["train_ms"]
        for r in json.loads((runs / "gpu-run2" / "bench.json").read_text())["projection"]
        if "train_ms" in r
    }
    op, view = fit([r for r in host if r["T"] in CALIBRATION_T])
    print(
        f"fit on T = {CALIBRATION_T}: {op:.1f} us per operator, {view:.1f} us per view "
        f"(the model: {H200.op_us}, {H200.view_us})"
    )
    print(
        f"{'T':>6} {'solver':<7} {'role':<12} {'pred ms':>8} {'run3 ms':>8} {'ratio':>6} "
        f"{'run2 ms':>8} {'ratio':>6}"
    )
    for row in host:
        trace = Trace([Event(**e) for e in row["counted"]], {"steps": row["T"], "cfactor": 32})
        pred = 1e3 * replay(expand(trace, 1), Machine(H200, LINKS["shm"])).seconds
        role = "calibration" if row["T"] in CALIBRATION_T else "held out"
        other = lease2.get((row["T"], row["solver"]))
        tail = "" if other is None else f" {other:>8.1f} {pred / other:>6.2f}"
        print(
            f"{row['T']:>6} {row['solver']:<7} {role:<12} {pred:>8.1f} "
            f"{row['measured_ms']:>8.1f} {pred / row['measured_ms']:>6.2f}{tail}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
