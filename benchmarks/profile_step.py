"""Where a training step spends its time: wall-clock per stage of forward and backward.

    python benchmarks/profile_step.py [--T 16384] [--zbias 0] [--setting default]
                                      [--torch-profiler]

Stages are timed by wrapping the library's own functions (one thread, fp32, B=4, I=32, H=64);
--torch-profiler prints torch.profiler's operator table instead.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

import mgrit_gru
from mgrit_gru.bench import parse_setting
from mgrit_gru.core import cycle
from mgrit_gru.gru import cell
from mgrit_gru.layer import autograd as glue
from mgrit_gru.layer import solve

TIMES: dict[str, float] = collections.defaultdict(float)


def wrap(module, name, label):
    fn = getattr(module, name)

    def timed(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[label] += time.perf_counter() - start

    setattr(module, name, timed)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--zbias", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-profiler", action="store_true")
    p.add_argument("--setting", default="default", help="MGRIT options, as bench's --settings")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gru = mgrit_gru.GRU(32, 64, solver=parse_setting(args.setting))
    with torch.no_grad():
        gru.bias_hh_l0[64:128] += args.zbias
    x = torch.randn(args.T, 4, 32, requires_grad=True)

    def step():
        y, h = gru(x)
        (y.sum() + h.sum()).backward()

    step()
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        return
    wrap(glue, "forward_solve", "= forward solve (all of it)")
    wrap(glue, "adjoint_solve", "= adjoint solve (all of it)")
    wrap(solve, "input_gates", "gx GEMMs (fwd all T, bwd per block)")
    wrap(solve, "build_hierarchy", "fwd: coarse gates")
    wrap(cycle._Solver, "f_relax", "F-relaxations (fwd+adj)")
    wrap(cycle._Solver, "coarse_correct", "coarse corrections (fwd+adj)")
    wrap(solve, "flat_points", "chunk layout -> time order")
    wrap(solve, "fine_coefficients", "bwd: fine adjoint coefficients")
    wrap(solve, "reversed_forcing", "bwd: reversed forcing")
    wrap(cell, "gate_grads", "bwd: gate gradients (all T)")
    total = 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        total += time.perf_counter() - start
    print(
        f"T={args.T} zbias={args.zbias} setting={args.setting} threads=1: "
        f"training step {1e3 * total / args.repeats:.1f} ms"
    )
    print(gru.last_stats.summary())
    for label, t in sorted(TIMES.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<34} {1e3 * t / args.repeats:8.1f} ms")


if __name__ == "__main__":
    main()
