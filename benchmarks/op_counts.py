"""Operators a training step dispatches (each one or more kernel launches on a GPU), counted
on the CPU: the compiled C++ sweeps stand in for the Triton ones (a sweep is one call of
either; the C++ one also calls ATen's GEMM inside above 64 rows, which the Triton kernel does
not, so these counts bound a GPU's from above), with the whole-sequence elementwise work in
the CPU's cache-sized blocks and in the GPU's blocks (mgrit_gru.layer.solve.BLOCK_ROWS,
DEVICE_BLOCK_ROWS).

    python benchmarks/op_counts.py            # T = 16384, B = 16, input 32, hidden 64

No timing: counts, the same on any CPU (the GPU's launch count is what they bound).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import _CountOps  # noqa: E402

import mgrit_gru  # noqa: E402
from mgrit_gru.layer import solve  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--H", type=int, default=64)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    ref = torch.nn.GRU(32, args.H)
    x = torch.randn(args.T, args.B, 32)
    print(
        f"T={args.T} B={args.B} I=32 H={args.H}, random init, float32: operators per training step"
    )
    cpu_rows = solve.BLOCK_ROWS
    for label, solver in (
        ("tolerance", mgrit_gru.MGRIT()),
        ("budget 2/1", mgrit_gru.MGRIT(budget=mgrit_gru.Budget())),
    ):
        module = mgrit_gru.GRU.from_torch(ref, solver=solver)
        for blocks, rows in (("CPU blocks", cpu_rows), ("GPU blocks", solve.DEVICE_BLOCK_ROWS)):
            solve.BLOCK_ROWS = rows
            xg = x.clone().requires_grad_()
            with _CountOps() as count:
                y, _ = module(xg)
                y.sum().backward()
            stats = module.last_stats
            print(
                f"  {label:<10} {blocks} ({rows:>7} rows): {count.n:>6} operators, "
                f"cycles {stats.forward_iterations}/{stats.backward_iterations}"
            )
        solve.BLOCK_ROWS = cpu_rows


if __name__ == "__main__":
    main()
