"""Where a training step's time goes on a GPU, event by event: the host's time per event of
the trace (no synchronisation added: a host-bound run waits for the device inside the
windows where it reads a value back), beside the measured step, for the projection's GPU
model (calibrated on the short sequences, checked on the long ones: docs/projection.md).

    python3 benchmarks/gpu_host_trace.py --out DIR [--T 1024 4096 16384 65536] [--dry-run]

Writes DIR/host_traces.json: per (T, solver) the measured step (median of 3), a host-timed
trace and an operator-counted trace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru import trace  # noqa: E402
from mgrit_gru.projection import record  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--solvers", nargs="+", default=["mgrit", "budget", "serial"])
    p.add_argument("--serial-max-T", type=int, default=4096)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu" if dry else "cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for T in args.T:
        for solver in args.solvers:
            if solver == "serial" and T > args.serial_max_T:
                continue
            m = None if solver == "serial" else 32
            step = record.training_step(T, 4, 32, 64, solver, m, device=device.type)
            step()
            times = []
            for _ in range(3):
                torch.cuda.synchronize() if not dry else None
                start = time.perf_counter()
                step()
                torch.cuda.synchronize() if not dry else None
                times.append(time.perf_counter() - start)
            with trace.record(timed=True, sync=False, steps=T, cfactor=m or T) as host:
                step()
                torch.cuda.synchronize() if not dry else None
            with trace.record(count_ops=True, steps=T, cfactor=m or T) as counted:
                step()
            stats = step().last_stats if solver != "torch" else None
            row = {
                "T": T,
                "solver": solver,
                "measured_ms": 1e3 * statistics.median(times),
                "host_ms": 1e3 * sum(e.seconds for e in host.events),
                "cycles": [stats.forward_iterations, stats.backward_iterations],
                "host": [asdict(e) for e in host.events],
                "counted": [asdict(e) for e in counted.events],
            }
            results.append(row)
            print(
                f"T={T:>6} {solver:<7} measured {row['measured_ms']:8.2f} ms, host windows "
                f"{row['host_ms']:8.2f} ms, {len(host.events)} events, cycles {row['cycles']}",
                flush=True,
            )
            (out / "host_traces.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
