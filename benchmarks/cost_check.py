"""The cost model's check: its price of a forward solve against the solve's measured time.

    python benchmarks/cost_check.py [--hidden 1 8 64 256] [--batch 1 4 64]
        [--steps 1000 10000 100000] [--dtype float32 float64] [--most 2.0] [--builtin]
    python benchmarks/cost_check.py --shape [--hidden 1 4 8 16 32 64 128 256]

Per cell (H, B, T, dtype) one layer ``mgrit_gru.GRU(1, H)`` runs its forward (no autograd,
one thread) serially and by MGRIT for one cycle (``MGRIT(max_iters=1,
on_unconverged="warn")``, ``cfactor="auto"``); the model's price is the solve's
``SolveStats.cost`` (for the serial solve its ``serial_cost``) and the call's fixed part
(``mgrit_gru.cost.fixed_us``), the measured time the least
of a few runs' thread CPU time (``time.thread_time``: what other processes take from the core
does not count) of the whole call. The table prices with this machine's quick calibration,
measured first (a few seconds, not cached), or with the built-in table (``--builtin``).
Cells the model prices above ``--most`` seconds are left out. It ends with the range of
model / measured, which docs/measurements.md ("The cost model's check") holds within 0.5-2x.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import mgrit_gru
from mgrit_gru import calibrate, cost


def timed(module, x, reps: int) -> float:
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            start = time.thread_time()
            module(x)
            best = min(best, time.thread_time() - start)
    return best * 1e6


def cell(H: int, B: int, T: int, dtype, most_us: float):
    torch.manual_seed(0)
    x = torch.randn(T, B, 1, dtype=dtype)
    serial = mgrit_gru.GRU(1, H, dtype=dtype, solver="serial")
    one = mgrit_gru.MGRIT(max_iters=1, on_unconverged="warn")
    mgrit = mgrit_gru.GRU(1, H, dtype=dtype, solver=one)
    mgrit.load_state_dict(serial.state_dict())
    with torch.no_grad():
        serial(x[: min(T, 64)])  # the kernels' first call
    model_s = cost.serial_us("sweep", T, B, H, "cpu", None, dtype)
    if model_s > most_us:
        return None
    reps = 3 if model_s < 3e5 else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            mgrit(x)  # its workspace
        measured_s = timed(serial, x, reps)
        measured_m = timed(mgrit, x, reps)
    ss, ms = serial.last_stats.forward[0], mgrit.last_stats.forward[0]
    # the model of the whole call: the steps' price and the call's fixed part
    model_s = ss.serial_cost + cost.fixed_us(1)
    model_m = ms.cost + cost.fixed_us(ms.levels)
    return model_s, measured_s, model_m, measured_m, ms.levels, ss.kernels


def shape(hidden: list[int], dtypes: list[str]) -> None:
    """Per kind and dtype, the fit ``o + c * rows`` at each H and its ``c`` against the same
    dtype's at H = 64, beside the model's :func:`mgrit_gru.cost.row_scale`."""
    print("per kind: o (us) and c at H against c at H = 64 (same dtype): measured (model)")
    for name in dtypes:
        dtype = getattr(torch, name)
        for kind in cost.KINDS:
            fits = {}
            for H in sorted(set(hidden) | {64}):
                with calibrate._measuring():
                    torch.set_default_dtype(dtype)
                    points = calibrate.time_points(kind, H, calibrate.ROWS, rounds=3)
                fits[H] = calibrate.fit(points)
            c64 = fits[64][1]
            cells = [
                f"H={H}: o {o:.1f} c {c / c64:.3f} ({cost.row_scale(H):.3f})"
                for H, (o, c) in fits.items()
            ]
            print(f"{name} {kind:<14} " + "; ".join(cells), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 64])
    p.add_argument("--steps", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    p.add_argument("--most", type=float, default=2.0, help="seconds: larger cells left out")
    p.add_argument("--builtin", action="store_true", help="price with the built-in table")
    p.add_argument("--shape", action="store_true", help="print the per-H fits behind the shape")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.shape:
        shape(args.hidden, args.dtype)
        return
    if args.builtin:
        cost.use(None)
    else:
        cost.use(calibrate.measure(quick=True), {"described": "this machine, measured now"})
    print(
        f"cost_check: {cost.cpu_name()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread; {cost.active().describe()}"
    )
    print("table (us at H = 64, fp32): " + ", ".join(
        f"{k} ({o:.1f}, {c:.3f})" for k, (o, c) in cost.table()["cpu"].items()))  # fmt: skip
    print("times in ms; model / measured per solve; MGRIT: one cycle, cfactor='auto'")
    head = f"{'dtype':<8}{'H':>4}{'B':>4}{'T':>7} {'kern':<9}"
    print(f"{head}{'serial: model':>14}{'meas':>9}{'ratio':>7}  {'MGRIT: model':>13}"
          f"{'meas':>9}{'ratio':>7}{'lvls':>5}")  # fmt: skip
    ratios = []
    for name in args.dtype:
        dtype = getattr(torch, name)
        for H in args.hidden:
            for B in args.batch:
                for T in args.steps:
                    got = cell(H, B, T, dtype, args.most * 1e6)
                    row = f"{name:<8}{H:>4}{B:>4}{T:>7} "
                    if got is None:
                        print(f"{row}(left out: the model prices it above {args.most} s)")
                        continue
                    ms, ts, mm, tm, levels, kern = got
                    rs, rm = ms / ts, mm / tm
                    ratios += [rs, rm]
                    print(
                        f"{row}{kern:<9}{ms / 1e3:14.2f}{ts / 1e3:9.2f}{rs:7.2f}  "
                        f"{mm / 1e3:13.2f}{tm / 1e3:9.2f}{rm:7.2f}{levels:5d}",
                        flush=True,
                    )
    print(f"model / measured over {len(ratios)} solves: {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
