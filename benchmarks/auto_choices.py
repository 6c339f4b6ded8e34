"""What ``solver="auto"`` and the cost guard choose on trained networks: counts, not times.

    python benchmarks/auto_choices.py [--steps 16] [--cache runs/trained-models] [--json PATH]

On each cached trained checkpoint (benchmarks/trained_models.py and loss_shapes.py recipes)
and each loss shape (last, mean, max, per-step), ``--steps`` training steps (forward and
backward; the weights stay) on the cached batches in turn, with the module's default
``solver="auto"`` (float32, one process). Per row: the share of the solves (layer x pass x
step) whose result came from MGRIT, and what happened to MGRIT's tries: converged, stopped by
the cost guard, diverged, at the cycle cap, or skipped (auto's wait after a losing try). Every
choice is made from counts through the cost model's built-in table
(``MGRIT_GRU_CALIBRATION=builtin`` is set here), so the figures do not depend on the
machine's load; run with another checkout on ``PYTHONPATH`` to compare its choices.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections import Counter
from pathlib import Path

os.environ.setdefault("MGRIT_GRU_CALIBRATION", "builtin")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loss_shapes as ls  # noqa: E402

from mgrit_gru import GRU  # noqa: E402


def choices(label, rnn_state, head, batches, cfg, loss: str, steps: int) -> dict:
    features = batches[0][0].shape[-1]
    gru = GRU(features, cfg.hidden, batch_first=True)  # solver="auto"
    gru.load_state_dict(rnn_state)
    head = head.float()
    count: Counter = Counter()
    for k in range(steps):
        x, labels = batches[k % len(batches)]
        ls.gradient(gru, head, x.float(), labels, loss)
        for s in gru.last_stats.solves:
            count["solves"] += 1
            count["mgrit"] += s.by_mgrit
            if s.skipped:
                count["skipped"] += 1
            elif s.stopped is not None:
                count[s.stopped] += 1
            elif s.by_mgrit:
                count["converged"] += 1
    return {"checkpoint": label, "loss": loss, "steps": steps, **count}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="runs/trained-models", help="checkpoint folder")
    p.add_argument("--steps", type=int, default=16, help="training steps per checkpoint")
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    import mgrit_gru

    print(f"auto_choices: mgrit_gru from {Path(mgrit_gru.__file__).parent}, {args.steps} steps")
    head = f"{'checkpoint':<16} {'loss':<5} {'MGRIT gave':>10}  tries: converged/cost/diverged/cap"
    print(head + ", skipped")
    rows = []
    for label, rnn_state, head_module, data, cfg in ls.cases(Path(args.cache), 3):
        for loss in ls.LOSSES:
            r = choices(label, rnn_state, head_module, data, cfg, loss, args.steps)
            rows.append(r)
            tries = "/".join(str(r.get(k, 0)) for k in ("converged", "cost", "diverged", "cap"))
            print(
                f"{label:<16} {loss:<5} {r.get('mgrit', 0):>4}/{r['solves']:<5}  {tries:>12}, "
                f"{r.get('skipped', 0)}"
            )
    total = sum(r.get("mgrit", 0) for r in rows), sum(r["solves"] for r in rows)
    print(f"all: MGRIT gave {total[0]} of {total[1]} solves")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
