"""The compiled CPU kernels against the PyTorch steps ("before") and torch.nn.GRU / LSTM, side
by side: forward and training step per (model, T, B), one thread, random init.

    python benchmarks/kernels_table.py [--models gru lstm] [--T 1024 16384 65536]
                                       [--batch 1 4 32] [--repeats 3] [--json PATH]
                                       [--warm-up T ...] [--rows NAME ...]

Rows per shape, timed interleaved repeat by repeat in one process (medians): torch's module;
the serial solve and ``MGRIT()`` on the PyTorch steps (``kernels="pytorch"``: the library as
it was before the compiled kernels); the serial solve, the default ``solver="auto"`` and
``MGRIT()`` on the compiled kernels. Ratios are against torch's module in the same run
("x torch"); the roofline columns are those of ``mgrit-gru bench``: the training step's GEMM
flops per second and its time over those flops' time at this core's GEMM rate at its rows.

``--warm-up T ...`` first runs the same rows at these T once each (one repeat, not
reported): the table is then taken late in a long process, as a training run sees it (torch's
LSTM backward pays page faults on its large buffers early in a process, not once the heap
holds memory to reuse). ``--rows`` keeps only the named library rows (torch's module always
runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

from mgrit_gru import MGRIT
from mgrit_gru.bench import (
    MODELS,
    SWEEP_ROWS,
    Row,
    _timed,
    gemm_gflops,
    problem,
    roofline,
)
from mgrit_gru.cost import cpu_name

ROWS = (
    ("serial, pytorch", "serial", "pytorch"),
    ("MGRIT(), pytorch", "mgrit", "pytorch"),
    ("serial, compiled", "serial", "compiled"),
    ("auto, compiled", "auto", "compiled"),
    ("MGRIT(), compiled", "mgrit", "compiled"),
)


def one_shape(
    model: str, T: int, B: int, args, rates: dict, rows=ROWS, quiet: bool = False
) -> list[dict]:
    ref, x, w_y, w_h = problem(T, B, args.input, args.hidden, model=model)
    ours = MODELS[model][1]
    chosen, rows = rows, [Row(MODELS[model][0].__name__, ref)]
    for name, solver, kernels in chosen:
        solver = MGRIT() if solver == "mgrit" else solver
        rows.append(Row(name, ours.from_torch(ref, solver=solver, kernels=kernels)))
    for row in rows:  # warm-up (auto learns its choice here)
        row.train_step(x, w_y, w_h)
    for _ in range(args.repeats):
        for row in rows:
            row.fwd.append(_timed(lambda r=row: r.forward(x), x.device))
            row.train.append(_timed(lambda r=row: r.train_step(x, w_y, w_h), x.device))
    for row in rows:
        row.stats = getattr(row.module, "last_stats", None)
    base_f, base_t = statistics.median(rows[0].fwd), statistics.median(rows[0].train)
    ns = argparse.Namespace(batch=B, input=args.input, hidden=args.hidden, model=model)
    out = []
    for row in rows:
        fwd, train = statistics.median(row.fwd), statistics.median(row.train)
        rec = {"model": model, "T": T, "B": B, "solver": row.name, "fwd_s": fwd, "train_s": train}
        rec.update(fwd_x_torch=base_f / fwd, train_x_torch=base_t / train)
        roofline(rec, row, ns, rates[model])
        if row.stats is not None:
            rec["iters"] = f"{row.stats.forward_iterations}/{row.stats.backward_iterations}"
            rec["kernels"] = ",".join(sorted({s.kernels for s in row.stats.solves}))
        out.append(rec)
        if quiet:
            continue
        print(
            f"{model:<5} {T:>6} {B:>3} {row.name:<18} {1e3 * fwd:>9.1f} {1e3 * train:>9.1f} "
            f"{base_f / fwd:>7.2f} {base_t / train:>7.2f} {rec.get('iters', '-'):>6} "
            f"{rec['gflops']:>6.1f} {rec['x_floor']:>7.2f}",
            flush=True,
        )
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["gru", "lstm"])
    p.add_argument("--T", type=int, nargs="+", default=[1024, 16384, 65536])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 32])
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", metavar="PATH")
    p.add_argument(
        "--warm-up",
        type=int,
        nargs="*",
        default=[],
        metavar="T",
        help="first run the rows at these T once, unreported (measure late in one process)",
    )
    p.add_argument(
        "--rows",
        nargs="+",
        choices=[name for name, *_ in ROWS],
        help="the library rows to run (default: all)",
    )
    args = p.parse_args(argv)
    rows = [r for r in ROWS if args.rows is None or r[0] in args.rows]
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    print(
        f"kernels_table: one thread, float32, input {args.input}, hidden {args.hidden}, "
        f"random init, {args.repeats} repeats (medians), torch {torch.__version__}, "
        f"{cpu_name()} ({platform.machine()})"
    )
    rates = {}
    for model in args.models:
        gates = 4 if model == "lstm" else 3
        rates[model] = {
            b: {
                "serial": gemm_gflops(b, args.hidden, gates),
                "sweep": gemm_gflops(SWEEP_ROWS, args.hidden, gates),
            }
            for b in args.batch
        }
    print(
        f"{'model':<5} {'T':>6} {'B':>3} {'solver':<18} {'fwd ms':>9} {'train ms':>9} "
        f"{'fwd x':>7} {'train x':>7} {'it f/b':>6} {'GF/s':>6} {'x floor':>7}"
    )
    for model in args.models:
        for T in args.warm_up:
            for B in args.batch:
                warm = argparse.Namespace(**{**vars(args), "repeats": 1})
                one_shape(model, T, B, warm, {model: rates[model][B]}, rows, quiet=True)
    results = []
    for model in args.models:
        for T in args.T:
            for B in args.batch:
                results += one_shape(model, T, B, args, {model: rates[model][B]}, rows)
                if args.json:  # after every shape: a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        meta = {"cpu": cpu_name(), "torch": torch.__version__}
                        json.dump({**meta, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
