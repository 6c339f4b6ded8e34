"""MGRIT on the cores of one process: a GRU training step at 1..N threads, against the serial
solve at the same thread count, with where the time went.

    python benchmarks/threads.py [--threads 1 2] [--batch 1 4 16 32] [--T 4096 16384 65536]
        [--solvers serial auto mgrit budget] [--weights random trained] [--checkpoint RUN]
        [--busy none loop] [--repeats 3] [--json FILE] [--dry-run] [--cell gru|lstm]
        [--predict]
    python benchmarks/threads.py --sweeps [--threads 1 2] [--rows 4 8 16 64 256 1024 4096]

Per (weights, T, B), every solver's training step (forward and backward of a per-step loss
plus ``h_n``, input 32, hidden 64 on random weights; the checkpoint's sizes on trained ones) is
timed at each thread count, the solvers and thread counts interleaved round by round, the least
of ``--repeats`` rounds. Printed per row: milliseconds, the step at 1 thread over the step at
P threads (``speed-up``) and that over P (``efficiency``), the solver over the serial solve at
the same thread count (``vs serial``), W (the solver's one-thread step over the serial
solve's: the work MGRIT does in serial-solve units), the cycles, and for the MGRIT rows the
split of a timed trace at that thread count: fine sweeps, coarse levels, passes over the
whole sequence (bulk), the rest (other: operators between sweeps, host checks).

``--busy loop``: a second process spins on one core throughout (a data loader, the test suite,
a neighbour's job): the rows then say what a thread descheduled by the OS costs. ``--busy none
loop`` runs both. Time only on an otherwise idle machine. ``trained``: the main job's
checkpoint (``runs/trained-models/smnist/run`` by default, made by ``python
benchmarks/trained_models.py``, or any ``mgrit-gru train`` run folder), its training sequences
joined end to end up to T. ``--dry-run``: T = 512, B = 2, threads 1 and 2, one round (the test
suite runs it).

``--predict``: beside every row the projection's model of it (``mgrit-gru project
--threads``: the step's trace replayed on this CPU's model, measured at the start of each
(weights, T, B), at that thread count) and predicted / measured: the model's validation at
the thread counts this machine has (GRU only; not with a busy neighbour, which the model
does not know).

``passes f / b (a cycle)``: the MGRIT rows' passes over whole-sequence memory that the timed
trace sees, forward / backward, in units of one pass over T x B states (the fine sweeps'
row-steps and the bulk passes), and the fine sweeps' per cycle. ``--events N``: after the
table, each MGRIT row's N longest event kinds of that trace (a message's window holds the
host's work before it: an exit check's comparison, a residual).

``--sweeps``: one compiled F-relaxation (forward and adjoint kinds, H = ``--hidden``, 64 steps)
per row count, wall time per step at each thread count against the cost model's price at
that thread count (:func:`mgrit_gru.cost.thread_share`: the rows' blocks the threads share):
the check of the model's thread share and of :data:`mgrit_gru.cost.THREAD_EFFICIENCY`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru import calibrate, cost, trace  # noqa: E402
from mgrit_gru.cost import cpu_name  # noqa: E402
from mgrit_gru.projection import record  # noqa: E402
from mgrit_gru.projection.replay import by_event, measured_split  # noqa: E402

CHECKPOINT = ROOT / "runs" / "trained-models" / "smnist" / "run"
SOLVERS = ("serial", "auto", "mgrit", "budget")


@contextlib.contextmanager
def busy(kind: str):
    """``kind="loop"``: a process spinning on one core while the block runs."""
    if kind == "none":
        yield
        return
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        yield
    finally:
        spin.kill()
        spin.wait()


def steps_for(weights: str, T: int, B: int, solvers, args) -> dict:
    """One training-step function per solver, all on the same weights and inputs."""
    w = inputs = None
    inp, hidden = args.input, args.hidden
    if weights == "trained":
        w, inputs, inp, hidden, _ = record.from_run(args.checkpoint, T, B)
    return {
        s: record.training_step(
            T, B, inp, hidden, s, None, 1, w, inputs, seed=args.seed, cell=args.cell
        )
        for s in solvers
    }


def timed_split(step, T: int, B: int) -> tuple[dict, str, list]:
    """One timed trace of ``step``: its split (ms per category), its passes over the whole
    sequence (:func:`sequence_passes`) and its events by kind (:func:`by_event`)."""
    with trace.record(timed=True) as t:
        module = step()
    split = measured_split(t.events)
    stats = module.last_stats
    passes = sequence_passes(t.events, T, B, stats.forward_iterations, stats.backward_iterations)
    ms = {k: round(1e3 * v, 2) for k, v in split.items() if v > 0}
    return ms, passes, by_event(t.events)


def sequence_passes(events, T: int, B: int, cycles_f: int, cycles_b: int) -> str:
    """``"F / B (f / b a cycle)"``: the forward's and the backward's passes over whole-sequence
    memory that a trace sees, each in units of one pass over T x B states: the fine and serial
    sweeps' row-steps over T B (a sweep of every chunk is about one; an early exit's less) and
    the bulk passes' rows over T B; a cycle's share is the total over the solve's cycles (not
    counting the bulk passes every step makes once; "-": no cycle). The PyTorch operators over whole
    sequences outside those (a solve's first fill of its states) are not in a trace."""
    sweeps = {"forward": 0.0, "backward": 0.0}
    bulk = dict(sweeps)
    phase = "forward"
    for e in events:
        if e.what == trace.PHASE and e.kind in sweeps:
            phase = e.kind
        elif e.what == trace.WORK and e.level in (0, trace.SERIAL):
            sweeps[phase] += e.rows * e.calls / (T * B)
        elif e.what == trace.BULK:
            bulk[phase] += e.rows / (T * B)
    total = [sweeps[k] + bulk[k] for k in sweeps]
    per = [f"{sweeps[k] / c:.1f}" if c else "-" for k, c in zip(sweeps, (cycles_f, cycles_b))]
    return f"{total[0]:.1f} / {total[1]:.1f} ({per[0]} / {per[1]})"


def interleaved(steps: dict, threads: list[int], rounds: int):
    """Every step at every thread count (warmed once each first), then ``rounds`` rounds of
    all of them in turn: yields ``(name, threads, seconds, module)`` per timed step."""
    for n in threads:
        torch.set_num_threads(n)
        for step in steps.values():
            step()
    for _ in range(rounds):
        for n in threads:
            torch.set_num_threads(n)
            for name, step in steps.items():
                start = time.perf_counter()
                module = step()
                yield name, n, time.perf_counter() - start, module


def measure(weights, T, B, args, load: str) -> list[dict]:
    steps = steps_for(weights, T, B, args.solvers, args)
    best: dict = {}
    with busy(load):
        for name, threads, took, module in interleaved(steps, args.threads, args.repeats):
            key = (name, threads)
            if key not in best or took < best[key][0]:
                stats = module.last_stats
                cycles = f"{stats.forward_iterations}/{stats.backward_iterations}"
                mg, n = stats.mgrit_share
                best[key] = (took, cycles, f"{mg}/{n}")
        splits = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            for name in ("mgrit", "budget"):
                if name in steps:
                    splits[(name, threads)] = timed_split(steps[name], T, B)
    predicted = predict(steps, T, B, args) if args.predict and load == "none" else {}
    rows = []
    one = min(args.threads)
    for (name, threads), (took, cycles, kind) in sorted(best.items(), key=lambda kv: kv[0]):
        base = best[(name, one)][0]
        serial = best.get(("serial", threads), (None,))[0]
        serial_one = best.get(("serial", one), (None,))[0]
        speedup = base / took * one
        timed = splits.get((name, threads), (None, None, None))
        rows.append(
            {
                "weights": weights,
                "T": T,
                "B": B,
                "busy": load,
                "solver": name,
                "threads": threads,
                "ms": round(1e3 * took, 2),
                "speedup": round(speedup, 3),
                "efficiency": round(speedup / threads, 3),
                "vs_serial": round(serial / took, 3) if serial else None,
                "W": round(base / serial_one, 3) if serial_one else None,
                "cycles": cycles,
                "by_mgrit": kind,
                "split_ms": timed[0],
                "passes": timed[1],
                "events": timed[2],
                "predicted_ms": predicted.get((name, threads)),
            }
        )
    return rows


def predict(steps: dict, T: int, B: int, args) -> dict:
    """``{(solver, threads): ms}``: each step's trace (recorded at one thread) replayed on
    this CPU's model (measured now, at batch ``B``) at each thread count, as ``mgrit-gru
    project --threads`` does."""
    import dataclasses

    from mgrit_gru.projection import LINKS, Machine, expand, machines, replay

    before = torch.get_num_threads()
    try:
        dev = machines.this_cpu(B, args.input, args.hidden)  # sets one thread itself
        torch.set_num_threads(1)
        out = {}
        for name, step in steps.items():
            trace, _ = record.record_step(step, False, False, steps=T, cfactor=T)
            for threads in args.threads:
                machine = Machine(dataclasses.replace(dev, threads=threads), LINKS["shm"])
                out[(name, threads)] = round(1e3 * replay(expand(trace, 1), machine).seconds, 2)
        return out
    finally:
        torch.set_num_threads(before)


def sweeps(args) -> list[dict]:
    """Per kind and row count: a compiled sweep's wall time per step at each thread count,
    the model's (:func:`mgrit_gru.cost.step_us` at that count) beside it."""
    rows = []
    before = torch.get_num_threads()
    try:
        for kind in ("sweep", "sweep_adjoint"):
            with torch.no_grad():
                runs = {r: calibrate._sweep(kind, r, args.hidden, 64) for r in args.rows}
            best: dict = {}
            for fn, _ in runs.values():
                fn()
            for _ in range(args.repeats):
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    for r, (fn, per) in runs.items():
                        with torch.no_grad():
                            start = time.perf_counter()
                            fn()
                            took = (time.perf_counter() - start) / per * 1e6
                        best[(r, threads)] = min(best.get((r, threads), took), took)
            least = min(args.threads)
            for r in args.rows:
                per = runs[r][1]
                one = best[(r, least)]
                model_one = cost.step_us(kind, r, args.hidden, threads=least, steps=per)
                for threads in args.threads:
                    model = cost.step_us(kind, r, args.hidden, threads=threads, steps=per)
                    rows.append(
                        {
                            "kind": kind,
                            "rows": r,
                            "threads": threads,
                            "us": round(best[(r, threads)], 2),
                            "speedup": round(one / best[(r, threads)], 3),
                            "model_speedup": round(model_one / model, 3),
                        }
                    )
    finally:
        torch.set_num_threads(before)
    return rows


def _fmt(r: dict) -> str:
    vs = "" if r["vs_serial"] is None else f"{r['vs_serial']:.2f}x"
    w = "" if r["W"] is None else f"{r['W']:.2f}"
    split = ""
    if r["split_ms"]:
        total = sum(r["split_ms"].values()) or 1.0
        split = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in r["split_ms"].items())
    line = (
        f"| {r['weights']} | {r['T']} | {r['B']} | {r['busy']} | {r['solver']} | {r['threads']} "
        f"| {r['ms']:.1f} | {r['speedup']:.2f}x | {r['efficiency']:.2f} | {vs} | {w} "
        f"| {r['cycles']} | {r['by_mgrit']} | {r['passes'] or ''} | {split} |"
    )
    if r.get("predicted_ms") is not None:
        line += f" {r['predicted_ms']:.1f} | {r['predicted_ms'] / r['ms']:.2f} |"
    return line


HEADER = (
    "| weights | T | B | busy | solver | threads | ms | speed-up | efficiency | vs serial | W "
    "| cycles f/b | by MGRIT | passes f / b (a cycle) | split (timed trace) |\n" + "|---" * 15 + "|"
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--T", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=SOLVERS)
    p.add_argument(
        "--weights",
        nargs="+",
        choices=["random", "trained"],
        help="default both (lstm: random)",
    )
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--busy", nargs="+", default=["none"], choices=["none", "loop"])
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--cell", choices=["gru", "lstm"], default="gru", help="the layer (lstm: random weights)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--predict", action="store_true", help="the projection's model beside every row (GRU)"
    )
    p.add_argument(
        "--events",
        type=int,
        default=0,
        metavar="N",
        help="after the table, the N longest event kinds of each MGRIT row's timed trace",
    )
    p.add_argument("--sweeps", action="store_true", help="time compiled sweeps, not steps")
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 64, 256, 1024, 4096])
    args = p.parse_args()
    if args.cell == "lstm" and args.predict:
        p.error("--predict models the GRU's step: not with --cell lstm")
    if args.cell == "lstm" and args.sweeps:
        p.error("--sweeps times the GRU's compiled sweeps: not with --cell lstm")
    if args.cell == "lstm" and args.weights and "trained" in args.weights:
        p.error("--cell lstm runs on random weights (the checkpoints are GRUs): --weights random")
    if not args.weights:
        args.weights = ["random", "trained"] if args.cell == "gru" else ["random"]
    warnings.simplefilter("ignore")
    if args.sweeps:
        if args.dry_run:
            args.rows, args.repeats, args.threads = [4, 64], 1, [1, 2]
        print(
            f"# {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}; float32; "
            f"H {args.hidden}; 64 steps; least of {args.repeats} interleaved rounds"
        )
        print("| kind | rows | threads | us/step | speed-up | model's speed-up |")
        print("|---|---|---|---|---|---|")
        out = sweeps(args)
        for r in out:
            print(
                f"| {r['kind']} | {r['rows']} | {r['threads']} | {r['us']:.1f} "
                f"| {r['speedup']:.2f}x | {r['model_speedup']:.2f}x |"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    if args.dry_run:
        args.threads, args.batch, args.T, args.repeats = [1, 2], [2], [512], 1
        args.weights = ["random"]
    if "serial" not in args.solvers:
        args.solvers = ["serial", *args.solvers]
    weights = [w for w in args.weights if w == "random" or Path(args.checkpoint).is_dir()]
    if len(weights) < len(args.weights):
        print(f"no checkpoint at {args.checkpoint}: trained rows left out")
    print(
        f"# {args.cell.upper()}; {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}; "
        f"float32; threads {args.threads}; least of {args.repeats} interleaved rounds"
    )
    if args.predict:
        print(HEADER.replace(" |\n", " | model ms | model / measured |\n") + "---|---|")
    else:
        print(HEADER)
    rows = []
    for w in weights:
        for T in args.T:
            for B in args.batch:
                for load in args.busy:
                    for r in measure(w, T, B, args, load):
                        print(_fmt(r), flush=True)
                        rows.append(r)
    if args.events > 0:
        print_events(rows, args.events)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def print_events(rows: list[dict], n: int) -> None:
    """Each MGRIT row's ``n`` longest event kinds: count and milliseconds."""
    print(
        "\n| weights | T | B | busy | solver | threads | event (what, kind, level) | count | ms |"
    )
    print("|---" * 9 + "|")
    for r in rows:
        for what, kind, level, count, ms in (r["events"] or [])[:n]:
            print(
                f"| {r['weights']} | {r['T']} | {r['B']} | {r['busy']} | {r['solver']} "
                f"| {r['threads']} | {what}, {kind}, {level} | {count} | {ms:.2f} |"
            )


if __name__ == "__main__":
    sys.exit(main())
