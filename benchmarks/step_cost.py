"""The cost of one batched GRU step against its rows: the calibration of cfactor="auto".

    python benchmarks/step_cost.py [--hidden 64 128 256] [--rows 16 64 256 1024 4096]

Times ``mgrit_gru.gru.cell.step`` (fp32, one thread, the library's kernel as the sweeps run it)
at each row count and, per hidden size, reads off the model ``time = o + c * rows`` in the range
``cfactor="auto"`` aims at: c is the slope between 256 and 1024 rows, o what that leaves at 16
rows. The ratio o / c (in rows) is what ``auto_cfactor`` uses: ``OVERHEAD_ROWS * (64 / H)^1.5``
rows in ``mgrit_gru/options.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgrit_gru.gru import cell


def step_us(rows: int, H: int) -> float:
    h, gx = torch.rand(rows, H) - 0.5, torch.randn(rows, 3 * H)
    w_hh, b_hn, out = torch.randn(3 * H, H) / H**0.5, torch.randn(H), torch.empty(rows, H)
    repeats = max(20, 100_000 // rows)
    rounds = []
    for _ in range(5):
        cell.step(h, gx, w_hh, b_hn, "classic", out=out)
        start = time.perf_counter()
        for _ in range(repeats):
            cell.step(h, gx, w_hh, b_hn, "classic", out=out)
        rounds.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(rounds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 4096], help="also shown")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"step_cost: fp32 threads=1 torch {torch.__version__}; median us per step of 5 rounds")
    rows = sorted(set(args.rows) | {16, 256, 1024})
    print(
        f"{'H':>5} "
        + " ".join(f"{r:>8}" for r in rows)
        + f" {'o us':>7} {'c us/row':>9} {'o/c':>6}"
    )
    for H in args.hidden:
        t = {r: step_us(r, H) for r in rows}
        c = (t[1024] - t[256]) / (1024 - 256)
        o = t[16] - 16 * c
        print(
            f"{H:>5} "
            + " ".join(f"{t[r]:>8.1f}" for r in rows)
            + f" {o:>7.1f} {c:>9.3f} {o / c:>6.0f}"
        )


if __name__ == "__main__":
    main()
