"""The calibration of mgrit_gru.cost: the time of one step of each kind against its rows.

    python benchmarks/step_cost.py [--hidden 32 64 128] [--rows 8 32 128 512 2048]

The measurement is :mod:`mgrit_gru.calibrate`'s (``mgrit-gru calibrate --full`` measures the
same and caches it for this machine); this prints every fit, the table at H = 64 in the form
of ``mgrit_gru.cost.BUILTIN`` and how well the model's H-scaling predicts the other hidden
sizes (``mgrit_gru.cost.row_scale``; ``benchmarks/cost_check.py`` checks whole solves against
the model). Nothing is cached.
"""

from __future__ import annotations

import argparse

import torch

from mgrit_gru import calibrate, cost


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, nargs="+", default=list(calibrate.FULL["hidden"]))
    p.add_argument("--rows", type=int, nargs="+", default=list(calibrate.ROWS))
    p.add_argument("--rounds", type=int, default=calibrate.ROUNDS)
    args = p.parse_args()
    print(f"step_cost: one thread, fp32, torch {torch.__version__}; times in us per step")
    fits = calibrate.measure_fits(args.hidden, args.rows, args.rounds, log=print)
    print("\nBUILTIN['cpu'] at H=64, c scaled by the model's row_scale(H) from each H:")
    for kind, per_h in fits.items():
        scaled = {H: c / cost.row_scale(H) for H, (_, c) in per_h.items()}
        o64, c64 = calibrate.at_h64(per_h)
        print(
            f'  "{kind}": ({o64:.1f}, {c64:.3f}),   c at H=64 from each H: '
            + ", ".join(f"{H}: {v:.3f}" for H, v in scaled.items())
        )


if __name__ == "__main__":
    main()
