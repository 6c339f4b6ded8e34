"""What an initial state costs the LSTM with projections: the training step of
``mgrit_gru.LSTM(proj_size=P)`` with no ``hx`` against the same with ``(h0, c0)``, timed
interleaved in one process (medians), serial solve, one thread.

    python benchmarks/lstm_proj_h0.py [--repeats 15]

``h0`` (P values) has no counterpart in the solved state ``[o tanh(c), c]``: its term
``W_hh h0`` enters the first step's gates (mgrit_gru/lstm/projection.py), which this prices.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import mgrit_gru
from mgrit_gru.cost import cpu_name

SHAPES = ((4096, 4), (1024, 32))  # (T, B)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--proj-size", type=int, default=32)
    p.add_argument("--input", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(
        f"lstm_proj_h0: hidden={args.hidden} proj_size={args.proj_size} input={args.input} "
        f"float32 threads=1 repeats={args.repeats} torch {torch.__version__} on "
        f"{cpu_name() or platform.machine()}"
    )
    for T, B in SHAPES:
        torch.manual_seed(0)
        lstm = mgrit_gru.LSTM(args.input, args.hidden, proj_size=args.proj_size, solver="serial")
        x = torch.randn(T, B, args.input)
        hx = (torch.randn(1, B, args.proj_size), torch.randn(1, B, args.hidden))

        times = {"no hx": [], "(h0, c0)": []}
        for _ in range(args.repeats):
            for name, state in (("no hx", None), ("(h0, c0)", hx)):
                start = time.perf_counter()
                y, (h, _) = lstm(x, state)
                (y.sum() + h.sum()).backward()
                times[name].append(time.perf_counter() - start)
        a, b = (statistics.median(times[k]) for k in times)
        print(f"T={T} B={B}: no hx {1e3 * a:.1f} ms, (h0, c0) {1e3 * b:.1f} ms ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
