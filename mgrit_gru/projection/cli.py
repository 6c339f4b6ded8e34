"""``mgrit-gru project``: the projected training step of a GRU shape at many time-parallel
ranks or on a GPU, from the trace of a step recorded here (every figure labelled projected)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .. import cost
from . import machines, record
from .machines import LINKS, Machine
from .replay import expand, replay

# How far the models' predictions were from measurements (docs/projection.md, "Validation"):
# predicted / measured over every point measured, with the command that measured them.
# The CPU band is the compiled sweeps' (the kernels every CPU run uses since 2026-12-05); the
# PyTorch steps' 0.74-1.33 on an Intel Xeon (2026-12-04) is history (docs/projection.md).
VALIDATION = {
    "cpu": "CPU model: predicted/measured 1.04-1.09 at one rank, 0.89-0.94 at two on this "
    "project's 2-core AMD EPYC (the compiled sweeps; T = 16384, random and trained weights; "
    "benchmarks/scaling.py --ranks 1 2, 2026-12-06), 0.91-1.71 at one process's 1-2 threads "
    "on a 2-core Intel Xeon (benchmarks/threads.py --predict, 2026-12-06; the model slow, "
    "its two-thread gain below the measured); 8-64 threads: an upper bound (memory bandwidth "
    "not modelled)",
    "cuda": "H200 model: predicted/measured 1.00-1.31 on the held-out T = 16384-65536 of its "
    "calibration lease, 0.80-1.63 over all 10 steps of it, 1.19-1.58 on another lease's "
    "(2026-12-04; benchmarks/gpu_validation.py)",
}
VALIDATED_ON = {"cpu": "AMD EPYC"}  # the CPU model name (/proc/cpuinfo) the band was measured on
DEFAULT_LINKS = {"cpu": ["shm", "10gbe", "ib"], "cuda": []}


def validation(kind: str) -> str:
    """The model's validation band for a device ``kind``, and, on a CPU of another model than
    the band's, that this one is not validated."""
    from .. import cost

    text = VALIDATION[kind]
    where = VALIDATED_ON.get(kind)
    if where is not None and cost.cpu_name() != where:
        text += f"; this CPU ({cost.cpu_name()}) is not validated: the band may not hold"
    return text


DRIFT_WARN = 1.3  # a step timed now over the calibration's price above which a run warns


def drift_warning(drift: float, origin: str) -> str:
    """The warning for a step timed now at ``drift`` times the step table's price; ``origin``:
    the table's (:func:`mgrit_gru.cost.active`), "builtin" where this machine has no calibration
    for these kernels (none measured yet, or the kernels rebuilt since: a calibration is kept
    per build)."""
    if origin == "builtin":
        why = (
            "the built-in cost table says (measured on another CPU: this machine has no "
            "calibration for these kernels yet; `mgrit-gru calibrate` measures one in seconds)"
        )
    else:
        why = "this machine's calibration says: it is loaded (or slower than when calibrated)"
    return (
        f"warning: a step timed now costs {drift:.1f}x what {why}; the CPU model measured now "
        "is inflated unevenly, so these projections are unreliable"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    shape = p.add_argument_group("the model and its input")
    shape.add_argument("--T", type=int, required=True, help="sequence length (time steps)")
    shape.add_argument("--batch", type=int, default=4, help="sequences per batch (default 4)")
    shape.add_argument("--input", type=int, default=32, help="input features (default 32)")
    shape.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    shape.add_argument("--layers", type=int, default=1, help="GRU layers (default 1)")
    shape.add_argument(
        "--checkpoint",
        metavar="RUN_DIR",
        help="a `mgrit-gru train` run: its trained GRU and its training sequences (joined end "
        "to end up to --T) instead of random ones, so that MGRIT's cycles are those of your "
        "model (its input, hidden size and layers replace the flags)",
    )
    where = p.add_argument_group("where it runs (modelled)")
    where.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        help="time-parallel ranks, one thread (or one GPU) each (default: 1 2 4 ... 64 up to "
        "T/2 for cpu, 1 for cuda without --link)",
    )
    where.add_argument(
        "--threads",
        type=int,
        nargs="+",
        help="instead of ranks: one process on this many threads (cores) of a CPU like this "
        "one, e.g. 1 2 8 16 64: the compiled sweeps' rows shared in the kernels' blocks, the "
        "passes over the sequence at 0.8 of a thread each (an upper bound where memory "
        "bandwidth saturates); x serial is then against the serial solve at one thread",
    )
    where.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu: this CPU's cores, measured now (about 10 s; keep the machine otherwise idle); "
        "cuda: one H200 as measured when one was lent (its traces count every operator: "
        "several times slower to record) (default cpu)",
    )
    where.add_argument(
        "--link",
        nargs="+",
        choices=sorted(LINKS),
        help="what joins the ranks (default for cpu: shm 10gbe ib; cuda: one GPU, P = 1)",
    )
    solve = p.add_argument_group("solvers")
    solve.add_argument(
        "--solvers",
        nargs="+",
        choices=["mgrit", "budget"],
        default=["mgrit", "budget"],
        help="mgrit: MGRIT() to its tolerance; budget: MGRIT(budget=Budget()), 2 forward / 1 "
        "adjoint cycles (default both); the serial solver and torch.nn.GRU are always shown",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the rows as a JSON list")


def _check(args: argparse.Namespace) -> None:
    for name in ("T", "batch", "input", "hidden", "layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.T < 2:
        raise ValueError("--T must be at least 2")
    threads = getattr(args, "threads", None)
    if threads is not None:
        if args.device != "cpu":
            raise ValueError(
                "--threads models one process on a CPU's cores: not with --device cuda"
            )
        if args.ranks is not None and args.ranks != [1]:
            raise ValueError("--threads models one process: give it without --ranks")
        if args.link is not None:
            raise ValueError("--threads models one process: no link joins anything (drop --link)")
        if any(t < 1 for t in threads):
            raise ValueError(f"--threads {threads}: each must be at least 1")
        args.ranks = [1]
    if args.ranks is None:
        many = [P for P in (1, 2, 4, 8, 16, 32, 64) if P == 1 or P <= args.T // 2]
        args.ranks = [1] if args.device == "cuda" and args.link is None else many
    bad = [r for r in args.ranks if r < 1 or r > args.T]
    if bad:
        raise ValueError(f"--ranks {bad}: each must lie in 1..T={args.T}")
    if args.device == "cuda" and args.link is None and max(args.ranks) > 1:
        raise ValueError("--device cuda models one GPU: give --ranks 1, or --link to join several")


def run(args: argparse.Namespace) -> list[dict]:
    rows, dev = project(args)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print(rows, args, dev)
    return rows


def project(args: argparse.Namespace) -> tuple[list[dict], machines.Device]:
    """The rows of a projection (see the module) and the device model they used."""
    _check(args)
    try:
        return _project(args)
    except (RuntimeError, MemoryError) as exc:  # e.g. a shape too large to allocate
        text = " ".join(str(exc).split())[:200]
        raise ValueError(f"recording the training step failed: {text}") from exc


def _project(args: argparse.Namespace) -> tuple[list[dict], machines.Device]:
    weights = inputs = None
    if args.checkpoint:
        weights, inputs, args.input, args.hidden, args.layers = record.from_run(
            args.checkpoint, args.T, args.batch
        )
    B, I, H, T = args.batch, args.input, args.hidden, args.T
    if args.device == "cpu" and not args.json:
        print("measuring this CPU for its model (about 10 s) ...", file=sys.stderr, flush=True)
    dev = machines.device("cpu" if args.device == "cpu" else "h200", B, I, H)
    if dev.drift > DRIFT_WARN:
        print(drift_warning(dev.drift, cost.active().origin), file=sys.stderr)
    links = [LINKS[name] for name in (args.link or DEFAULT_LINKS[args.device])]
    links = links or [LINKS["shm"]]  # one GPU: no message is sent
    common = {"layers": args.layers, "weights": weights, "inputs": inputs}
    # The operators between steps are what a GPU step waits on; on the CPU they are a small
    # share and counting them (a dispatch mode) slows the recording several times.
    count = args.device == "cuda"
    serial, _ = record.record_step(
        record.training_step(T, B, I, H, "serial", **common), count, False, steps=T, cfactor=T
    )
    serial_s = replay(expand(serial, 1), Machine(dev, links[0])).seconds
    torch_us = dev.torch_us(T, B, H) if args.layers == 1 else None
    torch_s = None if torch_us is None else 1e-6 * torch_us
    threads = getattr(args, "threads", None)
    # one process on each thread count (--threads), else the device as measured (one thread)
    devices = [
        dataclasses.replace(dev, threads=t, name=dev.name.replace("1 thread", _threads(t)))
        for t in sorted(set(threads or [1]))
    ]
    rows = []
    for d in devices:  # (one thread: the replay above)
        got = (
            serial_s if d.threads == 1 else replay(expand(serial, 1), Machine(d, links[0])).seconds
        )
        rows.append(_row(1, "serial", d, None, 1e3 * got, serial_s, torch_s, threads))
    if torch_s is not None:
        rows.append(_row(1, "torch.nn.GRU", dev, None, 1e3 * torch_s, serial_s, torch_s))
        if threads:  # measured at one thread: the one-thread rows are its
            rows[-1]["threads"] = 1
    traces: dict = {}
    for solver in args.solvers:
        for P in sorted(set(args.ranks)):
            m = record.cfactor_for(T, B, H, args.device, P)
            if (solver, m) not in traces:
                step = record.training_step(T, B, I, H, solver, m, **common)
                traces[(solver, m)] = record.record_step(step, count, steps=T, cfactor=m)
            trace, stats = traces[(solver, m)]
            for d in devices:
                for link in links if P > 1 else links[:1]:
                    got = replay(expand(trace, P), Machine(d, link))
                    ms = 1e3 * got.seconds
                    row = _row(
                        P, solver, d, link if P > 1 else None, ms, serial_s, torch_s, threads
                    )
                    row.update(
                        cfactor=m,
                        cycles=f"{stats.forward_iterations}/{stats.backward_iterations}",
                        split={k: round(1e3 * v, 3) for k, v in got.split.items() if v > 0},
                    )
                    rows.append(row)
    return rows, dev


def _threads(t: int) -> str:
    return "1 thread" if t == 1 else f"{t} threads"


def _row(P, solver, dev, link, ms, serial_s, torch_s, threads=None) -> dict:
    row = {"threads": dev.threads} if threads else {}  # --threads: one process's cores
    return row | {
        "ranks": P,
        "solver": solver,
        "device": dev.name,
        "link": None if link is None else link.name,
        "train_ms": round(ms, 3),
        "x_serial": round(1e3 * serial_s / ms, 3),
        "x_torch": None if torch_s is None else round(1e3 * torch_s / ms, 3),
        "projected": True,
        "validation": validation(dev.kind),
    }


def _print(rows: list[dict], args, dev) -> None:
    print(
        f"PROJECTED training step (not measured): T={args.T} batch={args.batch} "
        f"input={args.input} hidden={args.hidden} layers={args.layers}; device model: "
        f"{dev.name} ({dev.source})"
    )
    print(f"model validation: {validation(dev.kind)} (below 1: the model's times were too short)")
    if args.checkpoint:
        print(f"weights and inputs: {args.checkpoint}")
    else:
        print(
            "weights and inputs: random (MGRIT's easy case, 0-1 cycles); a trained network "
            "needs more: give --checkpoint RUN_DIR for your model's cycles"
        )
    print(
        "columns: m chunk length; cycles forward/adjoint; x serial / x torch: speed-up over "
        "the serial solver / torch.nn.GRU; critical path: the last rank's time in fine steps, "
        "coarse levels, bulk passes over its slice, other operators, wait and comm(unication)"
    )
    if getattr(args, "threads", None):
        print(
            "one process on each thread count (threads: cores of a CPU like this one); x serial "
            "and x torch against the serial solve and torch.nn.GRU at one thread; the passes "
            "over the sequence at 0.8 of a thread each, an upper bound where memory bandwidth "
            "saturates; the CPU's speed is measured now, so the figures move with its load"
        )
    by = "threads" if getattr(args, "threads", None) else "ranks"
    print(
        f"{by:>7} {'solver':<13} {'link':<26} {'m':>4} {'cycles':>6} {'ms':>10} "
        f"{'x serial':>8} {'x torch':>7}  critical path"
    )
    for r in rows:
        split = r.get("split", {})
        total = sum(split.values()) or 1.0
        path = ", ".join(
            f"{k} {100 * v / total:.0f}%" for k, v in split.items() if v > 0.005 * total
        )
        x_torch = "-" if r["x_torch"] is None else f"{r['x_torch']:.2f}"
        link, m = r["link"] or "-", r.get("cfactor", "-")
        print(
            f"{r.get(by, 1):>7} {r['solver']:<13} {link:<26} {m:>4} "
            f"{r.get('cycles', '-'):>6} {r['train_ms']:>10.2f} {r['x_serial']:>8.2f} "
            f"{x_torch:>7}  {path}"
        )
