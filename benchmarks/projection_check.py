"""The projection's validation: predicted against measured training steps at P time-parallel
ranks (real torchrun processes, one thread each), and the real ranks' traces against the
expansion of one process's trace.

    python benchmarks/projection_check.py [--T 4096 16384 65536] [--ranks 1 2]
        [--solvers mgrit budget] [--batch 4 --input 32 --hidden 64] [--checkpoint RUN]
        [--rounds 2] [--json FILE]

Per (T, solver, P): one process records a training step's trace with the chunk length P
ranks use, expands it to P ranks and replays it on this CPU's model (measured here at the
start) joined by this machine's loopback (gloo; its latency and bandwidth measured by a
ping-pong inside the torchrun job). The measured side: P = 1 in this process, P > 1 one
torchrun job per P (each rank one thread), rounds interleaved (P = 1, 2, ..., then again), the
least of each; a step's time is the slowest rank's. Printed per point: cycles, predicted and
measured milliseconds and their ratio, whatever it is, and whether every real rank's trace
equals its expansion (work and messages) and the loss and gradient equal one process's.

With P above the cores (4 and 8 on this 2-core VM) the times mean nothing: only the
equality columns count there. ``--checkpoint RUN``: a ``mgrit-gru train`` run's GRU weights
and its training sequences, joined end to end up to T (a trained network's cycles).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru.projection import LINKS, Link, Machine, comparable, expand, machines, record, replay  # noqa: E402  # noqa: E402
from mgrit_gru.projection.replay import by_event, measured_split  # noqa: E402


def config_step(cfg: dict, cfactor: int, time_group=None):
    """The training step of one configuration (the same weights and inputs everywhere; with
    ``time_group``, this rank's slice of it)."""
    weights = inputs = None
    inp = cfg["input"]
    if cfg.get("checkpoint"):
        weights, inputs, inp, _, _ = record.from_run(cfg["checkpoint"], cfg["T"], cfg["batch"])
    return record.training_step(
        cfg["T"],
        cfg["batch"],
        inp,
        cfg["hidden"],
        cfg["solver"],
        cfactor,
        1,
        weights,
        inputs,
        time_group=time_group,
    )


def alone_step(cfg: dict, tg, full):
    """This rank's slice of ``full`` (the configuration's step over the whole sequence, no
    time group) solved by this process alone, with no messages: its inputs' slice, its
    weights, solver and chunk length. Not the same numbers (the slice starts from a zero state,
    has its own loss weights, its own coarse grid over its chunks and the one-process cost
    guard) and, to a tolerance, not always the same cycles: the worker reports them beside it."""
    from mgrit_gru.distributed import scatter_time

    mine = scatter_time(full.inputs, tg, cfg["cfactor"]).contiguous()
    return record.training_step(
        mine.shape[0], cfg["batch"], mine.shape[-1], cfg["hidden"], cfg["solver"],
        cfg["cfactor"], 1, full.weights, mine,
    )  # fmt: skip


def _slowest(step, dist) -> float:
    """One call of ``step`` begun together on every rank: the slowest rank's seconds."""
    dist.barrier()
    start = time.perf_counter()
    step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def worker(path: str) -> None:
    """One rank of the torchrun job: the ping-pong, then every configuration's timing,
    trace, loss and gradient."""
    import torch.distributed as dist

    from mgrit_gru import trace
    from mgrit_gru.distributed import init_time_parallel

    torch.set_num_threads(1)
    job = json.loads(Path(path).read_text())
    tg = init_time_parallel(timeout_s=600, backend="gloo")  # CPU ranks, also beside a GPU
    rank, size = tg.rank, tg.size
    out = {"rank": rank, "points": []}
    if size > 1:
        out["link"] = _ping_pong(rank, job["batch"] * job["hidden"])
    for cfg in job["configs"]:
        step = config_step(cfg, cfg["cfactor"], tg)
        step()
        alone = whole = None
        if job.get("alone"):
            full = config_step(cfg, cfg["cfactor"])  # the whole sequence in one process
            alone = alone_step(cfg, tg, full)
            alone()
            whole = full if rank == 0 else (lambda: None)  # rank 0's; the others idle at the
            whole()  # barrier
        seconds, alone_seconds, whole_seconds, alone_cycles = [], [], [], None
        for _ in range(cfg["repeats"]):  # interleaved: the same load for all three
            seconds.append(_slowest(step, dist))
            if alone is not None:
                alone_seconds.append(_slowest(alone, dist))
                whole_seconds.append(_slowest(whole, dist))
        if alone is not None:  # the slice's own solve may take other cycles than the ranks'
            last = alone().last_stats
            alone_cycles = [last.forward_iterations, last.backward_iterations]
        with trace.record(timed=True) as t:  # timed: where this rank's time went
            module = step()
        loss = torch.tensor([step.loss], dtype=torch.float64)
        dist.all_reduce(loss)
        stats = module.last_stats
        out["points"].append(
            {
                "key": cfg["key"],
                "seconds": min(seconds),
                "alone_seconds": min(alone_seconds) if alone_seconds else None,
                "whole_seconds": min(whole_seconds) if whole_seconds else None,
                "alone_cycles": alone_cycles,
                "events": [list(c) for c in comparable(t.events)],
                "loss": float(loss),
                "grad_w_hh": float(module.weight_hh_l0.grad.double().norm()),
                "cycles": [stats.forward_iterations, stats.backward_iterations],
                "seconds_split": measured_split(t.events),
                "by_event": by_event(t.events),
            }
        )
    Path(job["out"]).with_suffix(f".{rank}.json").write_text(json.dumps(out))


def _ping_pong(rank: int, numel: int, rounds: int = 200) -> dict:
    """Half round-trip times of a state-sized message and of 1 MB between ranks 0 and 1."""
    import torch.distributed as dist

    res = {}
    for name, n in (("small", numel), ("large", 1 << 18)):
        buf = torch.zeros(n)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(rounds if name == "small" else 20):
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        res[name] = (time.perf_counter() - start) / (2 * (rounds if name == "small" else 20))
        res[name + "_bytes"] = 4 * n
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--solvers", nargs="+", default=["mgrit", "budget"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--checkpoint", help="a mgrit-gru train run folder: its GRU and data")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per round (default 3)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    torch.set_num_threads(1)
    base = {"batch": args.batch, "input": args.input, "hidden": args.hidden}
    base["checkpoint"] = args.checkpoint
    if args.checkpoint:  # the run's own sizes
        _, _, base["input"], base["hidden"], _ = record.from_run(args.checkpoint, 1, 1)
    B, H = base["batch"], base["hidden"]
    print(f"projection check: this CPU measured now; {sorted(base.items())}", flush=True)
    device = machines.this_cpu(B, base["input"], H)
    configs = {}
    for T in args.T:
        for solver in args.solvers:
            for P in args.ranks:
                m = record.cfactor_for(T, B, H, "cpu", P)
                configs[(T, solver, P)] = {**base, "T": T, "solver": solver, "cfactor": m}
    traces = {}
    for key, cfg in configs.items():
        step = config_step(cfg, cfg["cfactor"])
        # operators not counted: the CPU model prices steps by kind, and a counting trace
        # would run the PyTorch steps instead of the compiled sweeps that the ranks run
        t, stats = record.record_step(step, False, steps=cfg["T"], cfactor=cfg["cfactor"])
        traces[key] = (t, stats, step)
    measured: dict = {key: [] for key in configs}
    real: dict = {}
    link = LINKS["loopback"]
    for _ in range(args.rounds):
        for P in args.ranks:
            keys = [k for k in configs if k[2] == P]
            if P == 1:
                for key in keys:
                    measured[key].append(
                        machines.time_step(traces[key][2], args.repeats, least=True)
                    )
                continue
            got, link_measured = _torchrun(P, keys, configs, args)
            for key, point in got.items():
                measured[key].append(point["seconds"])
                real[key] = point
            if link_measured:
                link = link_measured
    rows = []
    print(f"link: {link.name}: {link.latency_us:.0f} us, {link.bandwidth_GBps:.2f} GB/s")
    print(
        f"{'T':>6} {'solver':<7} {'P':>2} {'m':>4} {'cycles':>6} {'pred ms':>8} "
        f"{'meas ms':>8} {'ratio':>6}  {'trace = ranks':<13} {'= 1 process':<11}"
    )
    for key, cfg in configs.items():
        T, solver, P = key
        t, stats, _ = traces[key]
        pred = replay(expand(t, P), Machine(device, link))
        meas = min(measured[key])
        cycles = f"{stats.forward_iterations}/{stats.backward_iterations}"
        same_trace = same_result = "-"
        if P > 1 and key in real:
            same_trace = same_trace_text(real[key]["events"], t, P)
            same_result = _same_result(real[key], traces[key][2])
        rows.append(
            {
                "T": T,
                "solver": solver,
                "ranks": P,
                "cfactor": cfg["cfactor"],
                "cycles": cycles,
                "predicted_ms": 1e3 * pred.seconds,
                "measured_ms": 1e3 * meas,
                "ratio": pred.seconds / meas,
                "split": {k: round(1e3 * v, 3) for k, v in pred.split.items()},
                "trace_equal": same_trace,
                "result_equal": same_result,
            }
        )
        print(
            f"{T:>6} {solver:<7} {P:>2} {cfg['cfactor']:>4} {cycles:>6} "
            f"{1e3 * pred.seconds:>8.1f} {1e3 * meas:>8.1f} {pred.seconds / meas:>6.2f}  "
            f"{same_trace:<13} {same_result:<11}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"link": link.__dict__, "rows": rows}, indent=1))
    bad = [
        r for r in rows if r["trace_equal"].startswith("NO") or r["result_equal"].startswith("NO")
    ]
    return 1 if bad else 0


def same_trace_text(got: list, trace, P: int) -> str:
    """ "yes" where every real rank's events (``comparable`` lists) equal one process's
    ``trace`` expanded to ``P`` ranks, else "NO"."""
    want = [[list(c) for c in comparable(ev)] for ev in expand(trace, P)]
    return "yes" if all(g == w for g, w in zip(got, want)) else "NO"


def _same_result(point: dict, step) -> str:
    """The ranks' summed loss and gradient norm against one process's (to 1e-5 relative)."""
    module = step()
    loss = step.loss
    grad = float(module.weight_hh_l0.grad.double().norm())
    ok = abs(point["loss"] - loss) <= 1e-5 * max(1.0, abs(loss))
    ok = ok and abs(point["grad_w_hh"] - grad) <= 1e-5 * max(1.0, grad)
    return "yes" if ok else f"NO ({point['loss']:.6g} vs {loss:.6g})"


def _torchrun(P: int, keys, configs, args) -> tuple[dict, object]:
    with tempfile.TemporaryDirectory() as tmp:
        job = {
            "alone": getattr(args, "alone", False),
            "batch": args.batch,
            "hidden": configs[keys[0]]["hidden"],
            "out": str(Path(tmp) / "out"),
            "configs": [{**configs[k], "key": list(k), "repeats": args.repeats} for k in keys],
        }
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(P),
            "--master-port",
            str(29500 + P),
            __file__,
            "--worker",
            str(path),
        ]
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
        ranks = [json.loads((Path(tmp) / f"out.{r}.json").read_text()) for r in range(P)]
    got = {}
    for i, k in enumerate(keys):
        point = dict(ranks[0]["points"][i])
        point["events"] = [r["points"][i]["events"] for r in ranks]
        point["splits"] = [r["points"][i]["seconds_split"] for r in ranks]
        point["by_event"] = [r["points"][i]["by_event"] for r in ranks]
        point["alone_cycles"] = [r["points"][i]["alone_cycles"] for r in ranks]
        got[k] = point
    link = None
    if "link" in ranks[0]:
        lk = ranks[0]["link"]
        bw = (lk["large_bytes"] - lk["small_bytes"]) / max(lk["large"] - lk["small"], 1e-9)
        link = Link(
            "gloo over this machine's loopback (measured)",
            1e6 * lk["small"],
            bw / 1e9,
            "ping-pong between ranks 0 and 1 in this job",
            "ring",
        )
    return got, link


if __name__ == "__main__":
    sys.exit(main())
