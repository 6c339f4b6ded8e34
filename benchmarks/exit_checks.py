"""An early-exiting F-relaxation's checks inside the compiled sweeps (each block of rows sets
the checked point's states aside and compares them as it ends: ``checked_blocks``,
``mgrit_gru/kernels/common.h``) against around them (a copy before the sweep, then a
subtraction, ``abs`` and ``max`` over the point's states on the calling thread): a GRU
training step, both ways interleaved round by round in one process, at each thread count.

    python benchmarks/exit_checks.py [--T 16384] [--batch 1 4] [--threads 1 2]
        [--solvers mgrit] [--checkpoint RUN] [--rounds 7] [--dry-run]

Random weights (input 32, hidden 64) and, with ``--checkpoint`` (a ``mgrit-gru train`` run
folder), its trained GRU on its training sequences joined end to end up to T. ``--solvers``
is ``mgrit`` by default: a fixed budget makes no exit checks (its tolerance is 0), so its rows
would time the same code both ways. The two ways
compute the same numbers (the same exits, the same results bit for bit: tests/test_kernels.py);
printed per row: the least and the median of the rounds each way, their ratio and the speed-up
from one thread to the most. Time only on an otherwise idle machine.

``--spacing``: instead, the checks' spacing: every EXIT_EVERY (4) steps however long the chunk,
against at most EXIT_CHECKS (32) checks a sweep (``mgrit_gru/core/cycle.py``: every m / 32
steps in chunks over 128), both in the sweep. These may exit at other steps and so take other
cycles; the rows time the whole training step.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coarse_maps import parser, table  # noqa: E402  (this folder's: the A/B table)

from mgrit_gru.core import cycle  # noqa: E402
from mgrit_gru.layer import solve  # noqa: E402

_ORIGINAL = solve._Compiled._use
_FUSED = {"on": True}


def _use(self, kernel) -> None:
    """The propagators' own choice, or (``_FUSED`` off) checks around the sweeps."""
    _ORIGINAL(self, kernel)
    self.checks = self.checks and _FUSED["on"]


class _Spacing(dict):
    """The A/B switch of ``--spacing``: on, at most EXIT_CHECKS checks a sweep; off, every
    EXIT_EVERY steps (no bound)."""

    bound = cycle.EXIT_CHECKS

    def __setitem__(self, key, on) -> None:
        super().__setitem__(key, on)
        cycle.EXIT_CHECKS = self.bound if on else 1 << 30


def main(argv=None) -> None:
    p = parser(__doc__)
    p.set_defaults(solvers=["mgrit"])
    p.add_argument("--spacing", action="store_true", help="the checks' spacing (see above)")
    args = p.parse_args(argv)
    if args.spacing:
        table(p, args, _Spacing(), "every 4 steps", f"<= {_Spacing.bound} a sweep")
        return
    solve._Compiled._use = _use
    table(p, args, _FUSED, "around the sweep", "in the sweep")


if __name__ == "__main__":
    main()
