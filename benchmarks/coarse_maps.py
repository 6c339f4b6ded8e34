"""The coarse levels' chunk maps stepped as PyTorch operators against their compiled sweep
(``map_sweep``, ``mgrit_gru/core/coarse_cpu.cpp``): a GRU training step, both ways interleaved
round by round in one process, at each thread count.

    python benchmarks/coarse_maps.py [--T 16384] [--batch 1 4] [--threads 1 2]
        [--solvers budget mgrit] [--checkpoint RUN] [--rounds 7] [--dry-run] [--products]

Random weights (input 32, hidden 64) and, with ``--checkpoint`` (a ``mgrit-gru train`` run
folder), its trained GRU on its training sequences joined end to end up to T. "pytorch" gives
the maps no compiled module (every coarse step four to six operators), "compiled" the
layer's own. Printed per row: the least and the median of the rounds each way, their ratio
and the speed-up from one thread to the most. The two ways differ in the coarse steps alone
(the same cycles: the results agree to rounding). Time only on an otherwise idle machine.

``--products``: instead, the maps' chunk factors (each refresh's product of a chunk's step
factors): torch's ``prod`` over the sweep's strided factors against the compiled
``chunk_product`` (one pass, subnormal products flushed to zero: the same maps to rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru.core import coarse  # noqa: E402
from mgrit_gru.cost import cpu_name  # noqa: E402
from mgrit_gru.layer import solve  # noqa: E402
from mgrit_gru.projection import record  # noqa: E402

_ORIGINAL = solve.chunk_map_ops
_COMPILED = {"on": True}


def _maps(grids, options, kernel=None):
    return _ORIGINAL(grids, options, kernel if _COMPILED["on"] else None)


_PRODUCT_ORIGINAL = coarse.chunk_product
_PRODUCTS = {"on": True}


def _product(factors, kernel=None):
    return _PRODUCT_ORIGINAL(factors, kernel if _PRODUCTS["on"] else None)


def measure(step, threads: list[int], rounds: int, switch: dict) -> dict:
    """``{(threads, on): [seconds per round]}``: ``step`` with ``switch["on"]`` False and True
    in turn at every thread count, round by round, both ways warmed at every count first."""
    times: dict = {}
    for warm in (True, False):
        for _ in range(1 if warm else rounds):
            for n in threads:
                torch.set_num_threads(n)
                for on in (False, True):
                    switch["on"] = on
                    start = time.perf_counter()
                    step()
                    if not warm:
                        times.setdefault((n, on), []).append(time.perf_counter() - start)
    return times


def least_median(seconds: list[float]) -> str:
    """``"least (median)"`` in milliseconds."""
    return f"{1e3 * min(seconds):.1f} ({1e3 * statistics.median(seconds):.1f})"


def parser(doc: str) -> argparse.ArgumentParser:
    """The options of an A/B run over training steps (this script's, exit_checks.py's)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--solvers", nargs="+", choices=("budget", "mgrit"), default=["budget", "mgrit"])
    p.add_argument("--checkpoint", default=None, help="a mgrit-gru train run (trained weights)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dry-run", action="store_true", help="T = 512, B = 2, one round")
    return p


def table(p: argparse.ArgumentParser, args, switch: dict, off: str, on: str) -> None:
    """Both ways of ``switch`` (``off``, ``on``: the columns' names) on the training steps the
    arguments name, a row per weights, batch, solver and thread count, and the threads' ratio."""
    if args.dry_run:
        args.T, args.batch, args.rounds = 512, [2], 1
    if any(n < 1 for n in (*args.threads, *args.batch, args.rounds, args.T)):
        p.error("--T, --batch, --threads and --rounds must be positive")
    warnings.simplefilter("ignore")  # MGRIT() to the tolerance warns where it falls back
    print(
        f"# {cpu_name()}, {torch.get_num_threads()} threads at start; torch {torch.__version__}; "
        f"float32; T = {args.T}; least (median) of {args.rounds} interleaved rounds"
    )
    print(f"| weights | B | solver | threads | {off} ms | {on} ms | speed-up |")
    print("|---|---|---|---|---|---|---|")
    kinds = ["random"] + (["trained"] if args.checkpoint else [])
    for weights in kinds:
        for B in args.batch:
            w = inputs = None
            inp, hidden = 32, 64
            if weights == "trained":
                w, inputs, inp, hidden, _ = record.from_run(args.checkpoint, args.T, B)
            for solver in args.solvers:
                step = record.training_step(args.T, B, inp, hidden, solver, None, 1, w, inputs)
                times = measure(step, args.threads, args.rounds, switch)
                for n in args.threads:
                    a, b = times[(n, False)], times[(n, True)]
                    print(
                        f"| {weights} | {B} | {solver} | {n} | {least_median(a)} "
                        f"| {least_median(b)} | {min(a) / min(b):.2f}x |"
                    )
                one, most = min(args.threads), max(args.threads)
                if most > one:
                    ratio = [min(times[(one, c)]) / min(times[(most, c)]) for c in (False, True)]
                    print(
                        f"| {weights} | {B} | {solver} | {most}t / {one}t | {ratio[0]:.2f}x | "
                        f"{ratio[1]:.2f}x | |"
                    )


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--products", action="store_true", help="the chunk factors' product (above)")
    args = p.parse_args(argv)
    if args.products:
        coarse.chunk_product = solve.chunk_product = _product
        table(p, args, _PRODUCTS, "torch prod", "chunk_product")
        return
    solve.chunk_map_ops = _maps
    table(p, args, _COMPILED, "pytorch maps", "compiled")


if __name__ == "__main__":
    main()
