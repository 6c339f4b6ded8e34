"""Which chunk length ``cfactor="auto"`` should give the compiled CPU sweeps: MGRIT's training
step at the chunk length the rule takes for them against the one it took before 2026-12-07
(the PyTorch steps' fixed cost in rows, some 20x the compiled sweeps').

    python benchmarks/chunk_length.py [--shapes 16384,1 16384,4 4096,4 16384,16]
        [--weights random trained] [--checkpoint RUN] [--threads 1 2] [--rounds 7]
        [--pairs T,B,M_OLD,M_NEW ...] [--cell gru|lstm] [--json FILE] [--dry-run]

Per (weights, T, B): one training step (forward and backward of a per-step loss plus ``h_n``,
input 32, hidden 64 on random weights; the checkpoint's sizes on trained ones) with
``MGRIT(cfactor=m)`` at the two chunk lengths and the serial solve, timed one after another in
each of ``--rounds`` rounds at each thread count. A round's ratio (the old m's time over the
new m's) cancels the drift of a shared machine, which moves whole rounds; the table gives the
median and range of the rounds' ratios, each m's step against the serial solve (medians) and
the cycles (forward / adjoint). ``--pairs`` gives the two chunk lengths by hand instead (e.g.
``16384,1,256,512``: the next longer chunk). ``trained``: the main job's checkpoint (as
``benchmarks/threads.py``), its training sequences joined end to end up to T. ``--cell lstm``:
an LSTM layer of the same sizes instead (random weights). Time on an idle machine.
``--dry-run``: T = 512, B = 2, one round (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from threads import interleaved  # noqa: E402  (this folder's: the interleaved rounds)

from mgrit_gru.cost import cpu_name  # noqa: E402
from mgrit_gru.layer.solve import step_kind  # noqa: E402
from mgrit_gru.options import auto_cfactor  # noqa: E402
from mgrit_gru.projection import record  # noqa: E402

CHECKPOINT = Path(__file__).resolve().parents[1] / "runs" / "trained-models" / "smnist" / "run"


def lengths(T: int, B: int, hidden: int) -> tuple[int, int]:
    """(the PyTorch steps' rule, the rule for the kernels this process runs)."""
    return auto_cfactor(T, B, hidden), auto_cfactor(T, B, hidden, kind=step_kind())


def measure(T: int, B: int, old: int, new: int, model: tuple, args) -> list[dict]:
    """``model``: ``(weights, inputs, input size, hidden size)``, weights and inputs None for
    random ones."""
    w, inputs, inp, hidden = model
    runs = (("old", "mgrit", old), ("new", "mgrit", new), ("serial", "serial", None))
    steps = {
        key: record.training_step(
            T, B, inp, hidden, solver, m, 1, w, inputs, seed=args.seed, cell=args.cell
        )
        for key, solver, m in runs
    }
    seconds = {(k, t): [] for k in steps for t in args.threads}
    cycles = {}
    for key, threads, took, module in interleaved(steps, args.threads, args.rounds):
        seconds[(key, threads)].append(took)
        stats = module.last_stats
        cycles[key] = f"{stats.forward_iterations}/{stats.backward_iterations}"
    rows = []
    for threads in args.threads:
        old_s, new_s, serial = (seconds[(k, threads)] for k in ("old", "new", "serial"))
        ratios = sorted(a / b for a, b in zip(old_s, new_s))
        rows.append(
            {
                "weights": "random" if w is None else "trained",
                "T": T,
                "B": B,
                "threads": threads,
                "m_old": old,
                "m_new": new,
                "ratio": round(statistics.median(ratios), 3),
                "low": round(ratios[0], 3),
                "high": round(ratios[-1], 3),
                "old_vs_serial": round(statistics.median(s / o for s, o in zip(serial, old_s)), 3),
                "new_vs_serial": round(statistics.median(s / n for s, n in zip(serial, new_s)), 3),
                "ms_new": round(1e3 * statistics.median(new_s), 1),
                "cycles_old": cycles["old"],
                "cycles_new": cycles["new"],
            }
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["16384,1", "16384,4", "4096,4", "16384,16"])
    p.add_argument("--pairs", nargs="+", help="T,B,M_OLD,M_NEW instead of --shapes")
    p.add_argument("--weights", nargs="+", default=["random"], choices=["random", "trained"])
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cell", choices=["gru", "lstm"], default="gru", help="lstm: random weights")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    if args.cell == "lstm" and "trained" in args.weights:
        p.error("--cell lstm runs on random weights (the checkpoints are GRUs): --weights random")
    warnings.simplefilter("ignore")
    if args.dry_run:
        args.pairs, args.rounds, args.threads, args.weights = ["512,2,32,64"], 1, [1], ["random"]
    cases = []
    for spec in args.pairs or args.shapes:
        parts = [int(v) for v in spec.split(",")]
        if args.pairs and len(parts) != 4 or not args.pairs and len(parts) != 2:
            p.error(f"{spec!r}: give T,B (--shapes) or T,B,M_OLD,M_NEW (--pairs)")
        cases.append(tuple(parts) if args.pairs else (*parts, None, None))
    print(
        f"# {args.cell.upper()}: MGRIT() training step at two chunk lengths; {cpu_name()}, "
        f"{os.cpu_count()} cores; "
        f"torch {torch.__version__}; float32; kernels' step kind {step_kind()!r}; "
        f"median of {args.rounds} rounds, each timing both (and the serial solve) in turn"
    )
    print(
        "| weights | T | B | threads | m old -> new | old / new time | range "
        "| vs serial old -> new | new ms | cycles old -> new |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for weights in args.weights:
        for T, B, old, new in cases:
            model = (None, None, args.input, args.hidden)
            if weights == "trained":
                model = record.from_run(args.checkpoint, T, B)[:4]
            if old is None:  # the two rules at this layer's hidden size (the checkpoint's)
                old, new = lengths(T, B, model[3])
            if old == new:
                print(f"| {weights} | {T} | {B} | - | {old} (the same) | | | | | |")
                continue
            for r in measure(T, B, old, new, model, args):
                rows.append(r)
                print(
                    f"| {weights} | {T} | {B} | {r['threads']} | {old} -> {new} | "
                    f"{r['ratio']:.2f}x | {r['low']:.2f}-{r['high']:.2f} | "
                    f"{r['old_vs_serial']:.2f}x -> {r['new_vs_serial']:.2f}x | {r['ms_new']} | "
                    f"{r['cycles_old']} -> {r['cycles_new']} |",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
