"""The paper's experiment on real cores: a GRU training step at P time-parallel ranks (real
torchrun processes, one thread each), against the one-rank serial solver and torch.nn.GRU,
with the projection beside every row and where each row's critical path went.

    python benchmarks/scaling.py [--ranks 1 2 4 8 16] [--T 16384 65536]
        [--solvers budget mgrit] [--weights random trained] [--checkpoint RUN]
        [--batch 4 --input 32 --hidden 64] [--repeats 2] [--json FILE] [--dry-run]
        [--events N]
    python benchmarks/scaling.py --cfactors 32 64 128 256 512 [--T ...] [--weights ...]

Per (weights, T, solver, P), measured: the training step (the slowest rank's, the least of
``--repeats``; P = 1 in this process), its speed-up over the serial solver's step and over
torch.nn.GRU's (both measured here, one process, one thread), and the parallel efficiency
(the solver's own one-rank step / (P x its P-rank step); for P > 1 that one-rank step, at the
P-rank chunk length, is timed inside the ranks' job, interleaved with theirs, by rank 0 while
the others wait: this VM's speed drifts by up to 1.8x over minutes, so a one-rank time from
outside the job could not be compared; ``x serial`` and ``x torch`` still divide baselines
timed before the job). Predicted: the projection of
mgrit_gru.projection (this CPU's model measured at the start, the loopback link measured by a
ping-pong inside each torchrun job) from one process's trace expanded to P ranks, and the
ratio predicted / measured. Where the time went: the slowest rank's own timed trace split
into fine sweeps, coarse levels, passes over its slice (bulk), messages with their waits
(comm) and the rest, beside the projection's split of its critical path. ``alone``: in the same
job, interleaved with the P-rank steps, each rank's own slice solved by that process alone (no
time group, no messages; the same inputs, solver and chunk length), the slowest rank's least;
``x alone``: the P-rank step over that: what the ranks' messages, their waits for each other
and the coarse grid that each solves whole cost beyond the slice's own work (the cores' shared
caches and memory are in both); where a slice alone took other cycles than the ranks (to a
tolerance its residuals differ), the row says so (``alone cycles``), and the ratio holds only
roughly. ``--events N``: under
each row of several ranks, every rank's N longest event kinds of its timed trace (a message's
window holds that rank's wait for its peers: where the split's comm went).

The chunk length is ``cfactor="auto"`` for P ranks (what ``mgrit-gru train --time-parallel``
uses). "trained": the main job's checkpoint, ``runs/trained-models/smnist/run`` by default (made
by ``python benchmarks/trained_models.py``), its GRU and its training sequences joined end to
end up to T. With more ranks than cores (above 2 on this project's 2-core VM) the times mean
nothing: only the counts, the trace equality and the predictions count there. ``--dry-run``:
P = 1, 2 at T = 256, random weights (the test suite runs it).

``--cfactors M ...``: no ranks run; the projection's speed-up over the serial solver at every
rank count for each chunk length M (and the one ``cfactor="auto"`` picks), per T, solver and
weights: how the chunk length for P ranks was chosen (docs/time-parallel.md, "Scaling").
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import projection_check as pc  # noqa: E402

from mgrit_gru.projection import LINKS, Machine, expand, machines, record, replay  # noqa: E402

CHECKPOINT = ROOT / "runs" / "trained-models" / "smnist" / "run"


def _split_text(split: dict) -> str:
    total = sum(split.values()) or 1.0
    parts = [f"{k} {100 * v / total:.0f}%" for k, v in split.items() if v / total >= 0.01]
    return ", ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--T", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--solvers", nargs="+", default=["budget", "mgrit"])
    p.add_argument("--weights", nargs="+", default=["trained", "random"])
    p.add_argument("--checkpoint", default=str(CHECKPOINT), help="the trained run folder")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--cfactors", type=int, nargs="+", help="project these chunk lengths only")
    p.add_argument(
        "--events",
        type=int,
        default=0,
        metavar="N",
        help="after each row of several ranks, every rank's N longest event kinds",
    )
    args = p.parse_args()
    warnings.simplefilter("ignore")
    if args.dry_run:
        args.ranks, args.T, args.weights, args.repeats = [1, 2], [256], ["random"], 1
    weights = [w for w in args.weights if w == "random" or Path(args.checkpoint).is_dir()]
    if "trained" in args.weights and "trained" not in weights:
        print(
            f"no checkpoint at {args.checkpoint}: trained rows left out (make it with "
            "python benchmarks/trained_models.py)"
        )
    torch.set_num_threads(1)
    rows, models = [], {}
    for kind in weights:
        base = {"batch": args.batch, "input": args.input, "hidden": args.hidden}
        base["checkpoint"] = args.checkpoint if kind == "trained" else None
        if kind == "trained":
            _, _, base["input"], base["hidden"], _ = record.from_run(args.checkpoint, 1, 1)
        key = (base["batch"], base["input"], base["hidden"])
        if key not in models:  # this CPU's model at these sizes, measured once
            models[key] = machines.this_cpu(*key)
        if args.cfactors:
            rows += _cfactor_rows(kind, base, models[key], args)
        else:
            rows += _weights_rows(kind, base, models[key], args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r.get("trace_equal", "-").startswith("NO")]
    return 1 if bad else 0


def _cfactor_rows(kind: str, base: dict, device, args) -> list[dict]:
    """PROJECTED speed-ups over the serial solver per chunk length and rank count."""
    B, H, link = base["batch"], base["hidden"], LINKS["shm"]
    rows = []
    print(
        f"PROJECTED (not measured), {kind} weights, B={B} H={H}, link {link.name}: "
        f"x serial at P = {', '.join(map(str, args.ranks))}; '*' cfactor='auto''s choice"
    )
    for T in args.T:
        cfg = {**base, "T": T, "solver": "serial"}
        t, _ = record.record_step(pc.config_step(cfg, None), False, steps=T, cfactor=T)
        serial = replay(expand(t, 1), Machine(device, link)).seconds
        auto = {P: record.cfactor_for(T, B, H, "cpu", P) for P in args.ranks}
        for solver in args.solvers:
            for m in sorted(set(args.cfactors) | set(auto.values())):
                cfg = {**base, "T": T, "solver": solver, "cfactor": m}
                t, stats = record.record_step(pc.config_step(cfg, m), False, steps=T, cfactor=m)
                cells = []
                for P in args.ranks:
                    if -(-T // m) < P:
                        cells.append(f"{'-':>7}")
                        continue
                    x = serial / replay(expand(t, P), Machine(device, link)).seconds
                    rows.append({"weights": kind, "T": T, "solver": solver, "cfactor": m,
                                 "ranks": P, "x_serial_predicted": x})  # fmt: skip
                    cells.append(f"{x:>6.2f}{'*' if auto[P] == m else ' '}")
                cycles = f"{stats.forward_iterations}/{stats.backward_iterations}"
                print(f"  T={T:<6} {solver:<7} m={m:<4} cycles {cycles:>5}: " + " ".join(cells))
    return rows


def _weights_rows(kind: str, base: dict, device, args) -> list[dict]:
    B, H = base["batch"], base["hidden"]
    configs = {}
    for T in args.T:
        for solver in args.solvers:
            for P in args.ranks:
                m = record.cfactor_for(T, B, H, "cpu", P)
                if -(-T // m) < P:
                    continue
                configs[(T, solver, P)] = {**base, "T": T, "solver": solver, "cfactor": m}
    traces, baselines = {}, {}
    for key, cfg in configs.items():
        step = pc.config_step(cfg, cfg["cfactor"])
        t, stats = record.record_step(step, False, steps=cfg["T"], cfactor=cfg["cfactor"])
        traces[key] = (t, stats, step)
    for T in args.T:  # the one-process baselines, one thread
        for solver in ("serial", "torch"):
            cfg = {**base, "T": T, "solver": solver}
            baselines[(T, solver)] = machines.time_step(
                pc.config_step(cfg, None), args.repeats, least=True
            )
    measured, real, link = {}, {}, LINKS["loopback"]
    for P in args.ranks:
        keys = [k for k in configs if k[2] == P]
        if not keys:
            continue
        if P == 1:
            for k in keys:
                measured[k] = machines.time_step(traces[k][2], args.repeats, least=True)
            continue
        ns = argparse.Namespace(batch=B, repeats=args.repeats, alone=True)
        got, link_measured = pc._torchrun(P, keys, configs, ns)
        link = link_measured or link
        for k, point in got.items():
            measured[k], real[k] = point["seconds"], point
    print(
        f"scaling ({kind} weights, B={B} I={base['input']} H={H}, one thread a rank; "
        f"link {link.name}: {link.latency_us:.0f} us, {link.bandwidth_GBps:.2f} GB/s)"
    )
    print(
        f"{'T':>6} {'solver':<7} {'P':>2} {'m':>4} {'cycles':>6} {'meas ms':>8} {'x serial':>8} "
        f"{'x torch':>7} {'effic':>6} {'alone':>6} {'x alone':>7} {'pred ms':>8} {'ratio':>5}  "
        "where the time went (measured | predicted)"
    )
    for T in args.T:
        serial, torch_s = baselines[(T, "serial")], baselines[(T, "torch")]
        print(
            f"{T:>6} {'serial':<7} {1:>2} {'-':>4} {'-':>6} {1e3 * serial:>8.1f} {1.0:>8.2f} "
            f"{torch_s / serial:>7.2f}"
        )
        print(
            f"{T:>6} {'torch':<7} {1:>2} {'-':>4} {'-':>6} {1e3 * torch_s:>8.1f} "
            f"{serial / torch_s:>8.2f} {1.0:>7.2f}"
        )
    rows = []
    for key, cfg in configs.items():
        T, solver, P = key
        t, stats, _ = traces[key]
        meas = measured[key]
        one = measured.get((T, solver, 1))
        pred = replay(expand(t, P), Machine(device, link))
        serial, torch_s = baselines[(T, "serial")], baselines[(T, "torch")]
        eff = one / (P * meas) if one else float("nan")
        split_meas, same, alone, whole = {}, "-", None, None
        if key in real:
            alone = real[key].get("alone_seconds")
            whole = real[key].get("whole_seconds")
            if whole:  # one process's step timed in the same job, interleaved: the efficiency
                eff = whole / (P * meas)  # under the same load as the ranks'

            splits = real[key]["splits"]
            slowest = max(range(P), key=lambda r: sum(splits[r].values()))
            split_meas = splits[slowest]
            same = pc.same_trace_text(real[key]["events"], t, P)
        row = {
            "weights": kind, "T": T, "solver": solver, "ranks": P, "cfactor": cfg["cfactor"],
            "cycles": f"{stats.forward_iterations}/{stats.backward_iterations}",
            "measured_ms": 1e3 * meas, "x_serial": serial / meas, "x_torch": torch_s / meas,
            "efficiency": eff, "predicted_ms": 1e3 * pred.seconds,
            "ratio": pred.seconds / meas, "split_measured": split_meas,
            "alone_ms": None if alone is None else 1e3 * alone,
            "one_rank_in_job_ms": None if whole is None else 1e3 * whole,
            "alone_cycles": real.get(key, {}).get("alone_cycles"),
            "x_alone": None if alone is None else meas / alone,
            "split_predicted": pred.split, "trace_equal": same,
        }  # fmt: skip
        rows.append(row)
        where = f"{_split_text(split_meas) or '(one process)'} | {_split_text(pred.split)}"
        print(
            f"{T:>6} {solver:<7} {P:>2} {cfg['cfactor']:>4} {row['cycles']:>6} "
            f"{1e3 * meas:>8.1f} {row['x_serial']:>8.2f} {row['x_torch']:>7.2f} {eff:>6.2f} "
            + (
                f"{'-':>6} {'-':>7} "
                if alone is None
                else f"{1e3 * alone:>6.1f} {meas / alone:>7.2f} "
            )
            + f"{1e3 * pred.seconds:>8.1f} {row['ratio']:>5.2f}  {where}"
            + ("" if same in ("yes", "-") else "  TRACE DIFFERS")
            + _other_cycles(real.get(key), stats),
            flush=True,
        )
        if args.events and key in real:
            _print_events(real[key]["by_event"], args.events)
    return rows


def _other_cycles(point, stats) -> str:
    """ "  alone cycles f/b, ..." where a rank's slice solved alone took other cycles than the
    ranks' solve (then its ``x alone`` compares unlike work), else ""."""
    cycles = (point or {}).get("alone_cycles") or []
    ranks = [stats.forward_iterations, stats.backward_iterations]
    if not cycles or all(c == ranks for c in cycles):
        return ""
    return "  alone cycles " + ", ".join(f"{f}/{b}" for f, b in cycles)


def _print_events(ranks: list, n: int) -> None:
    """Every rank's ``n`` longest event kinds of its timed trace (what, kind, level: count,
    ms); a message's window holds the rank's wait for its peers."""
    for rank, events in enumerate(ranks):
        top = ", ".join(f"{w} {k} {lv}: {c}x {ms:.1f} ms" for w, k, lv, c, ms in events[:n])
        print(f"{'':>8}rank {rank}: {top}")


if __name__ == "__main__":
    sys.exit(main())
