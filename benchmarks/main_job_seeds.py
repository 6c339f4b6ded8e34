"""How far the main job's result depends on luck: `mgrit-gru train` on its defaults over seeds x
CPU threads x solvers, each run in its own process, and a table of the outcomes.

    python benchmarks/main_job_seeds.py [--seeds 0 1 2 3 4] [--threads 1 2] \
        [--solvers auto serial] [--jobs 2] [--out runs/main-job-seeds] [-- TRAIN FLAGS]

The thread count changes how torch splits its reductions, so it changes the rounding of every
step; the solvers differ in rounding where auto lets MGRIT solve (to its tolerance). Runs that
finished in --out are kept (the script resumes an interrupted matrix); --jobs runs that many
trainings at once (their accuracy does not depend on the machine's load, only their times
do). Prints, per run, the final test accuracy and the worst rise of the train loss from one
epoch to the next (the largest ratio of an epoch's mean train loss to the previous one's),
then the range over all runs and whether it meets the targets (accuracy span at most 5
points, no epoch's loss above twice the previous). Flags after ``--`` go to every training.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mgrit_gru.cost import cpu_name

SPAN_TARGET = 5.0  # percentage points of final test accuracy, over all runs
JUMP_TARGET = 2.0  # largest ratio of an epoch's train loss to the previous epoch's


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finished(run: Path) -> bool:
    config = run / "config.json"
    if not config.exists():
        return False
    epochs = json.loads(config.read_text())["epochs"]
    return len(_rows(run)) == epochs and (run / "report.md").exists()


def outcome(run: Path) -> dict:
    """Final test accuracy (%), the worst epoch-to-epoch train-loss ratio and its epoch."""
    rows = _rows(run)
    losses = [r["train_loss"] for r in rows]
    jumps = [(b / a, i + 2) for i, (a, b) in enumerate(zip(losses, losses[1:]))]
    worst, at = max(jumps, default=(0.0, 0))
    return {
        "test_acc": 100 * rows[-1]["test_acc"],
        "worst_jump": worst,
        "jump_epoch": at,
        "train_s": sum(r["train_time_s"] for r in rows),
        # MGRIT's share of the solves over the run (the epochs' shares averaged)
        "mgrit_fwd": 100 * sum(r.get("mgrit_share_fwd", 0.0) for r in rows) / len(rows),
        "mgrit_bwd": 100 * sum(r.get("mgrit_share_bwd", 0.0) for r in rows) / len(rows),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--solvers", nargs="+", default=["auto", "serial"])
    p.add_argument("--jobs", type=int, default=2, help="trainings at once (default 2)")
    p.add_argument("--out", default="runs/main-job-seeds", help="folder of the runs")
    p.add_argument("--summary", action="store_true", help="only print the table of --out")
    p.add_argument("train_flags", nargs="*", help="after --: flags for every training")
    args = p.parse_args()
    extra = args.train_flags
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = list(itertools.product(args.seeds, args.threads, args.solvers))
    runs = {c: out / f"seed{c[0]}-threads{c[1]}-{c[2]}" for c in cells}
    todo = [c for c in cells if not _finished(runs[c])]
    # Concurrent runs with more threads than cores: OpenMP threads that spin while waiting
    # slow each other down tenfold (measured: a 2-thread epoch took 217 s beside another
    # instead of 19 s alone). Passive waiting leaves the results alone: how torch splits a
    # reduction depends on the thread count, not on how the threads wait.
    env = dict(os.environ)
    if args.jobs * max(args.threads) > (os.cpu_count() or 1):
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    running: list[tuple[subprocess.Popen, object]] = []
    while not args.summary and (todo or running):
        while todo and len(running) < args.jobs:
            seed, threads, solver = todo.pop(0)
            run = runs[(seed, threads, solver)]
            cmd = [sys.executable, "-m", "mgrit_gru.cli", "train", "--seed", str(seed)]
            cmd += ["--threads", str(threads), "--solver", solver, "--no-progress"]
            cmd += ["--resume", str(run)] if (run / "config.json").exists() else ["--out", str(run)]
            log = open(out / f"{run.name}.log", "a")
            proc = subprocess.Popen(cmd + extra, stdout=log, stderr=log, env=env)
            running.append((proc, log))
            print(f"started {run.name}", flush=True)
        time.sleep(2)
        for proc, log in list(running):
            if proc.poll() is not None:
                log.close()
                running.remove((proc, log))
                print(f"finished {Path(log.name).stem}: exit {proc.returncode}", flush=True)
    done = [c for c in cells if _finished(runs[c])]
    print(f"\nmain job over seeds x threads x solvers ({cpu_name()}); runs in {out}\n")
    print(
        "| seed | threads | solver | final test acc (%) | worst train-loss ratio (epoch) "
        "| MGRIT's share fwd / bwd (%) | train s |"
    )
    print("|---|---|---|---|---|---|---|")
    results = {}
    for c in done:
        r = results[c] = outcome(runs[c])
        print(
            f"| {c[0]} | {c[1]} | {c[2]} | {r['test_acc']:.1f} | {r['worst_jump']:.2f} "
            f"({r['jump_epoch']}) | {r['mgrit_fwd']:.0f} / {r['mgrit_bwd']:.0f} | "
            f"{r['train_s']:.0f} |"
        )
    if not results:
        print("no finished run")
        return 1
    accs = [r["test_acc"] for r in results.values()]
    worst = max(r["worst_jump"] for r in results.values())
    span = max(accs) - min(accs)
    print(
        f"\n{len(results)} of {len(cells)} runs finished: final test accuracy "
        f"{min(accs):.1f}-{max(accs):.1f}% (span {span:.1f} points, target <= {SPAN_TARGET}); "
        f"worst train-loss ratio {worst:.2f} (target <= {JUMP_TARGET})"
    )
    for solver in args.solvers:
        a = [r["test_acc"] for c, r in results.items() if c[2] == solver]
        if a:
            print(f"  {solver}: {min(a):.1f}-{max(a):.1f}% over {len(a)} runs")
    met = span <= SPAN_TARGET and worst <= JUMP_TARGET and len(results) == len(cells)
    print("targets met" if met else "targets NOT met")
    return 0 if met else 2


if __name__ == "__main__":
    sys.exit(main())
