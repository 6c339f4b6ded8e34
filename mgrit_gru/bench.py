"""``mgrit-gru bench``: torch.nn.GRU (or torch.nn.LSTM with ``--model lstm``), the serial
solver and MGRIT settings, timed side by side.

All rows of one sequence length are timed interleaved, repeat by repeat, in one process with a
stated thread count; the table reports medians, ratios and each row's accuracy against the
serial solve (same weights, same data).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from dataclasses import fields, replace
from datetime import datetime, timezone
from typing import Optional

import torch

from . import memory
from .app.config import parse_device, torch_module_name
from .layer.solve import step_kind
from .lstm.module import LSTM
from .module import GRU
from .options import MGRIT, Auto, Budget, auto_cfactor

# --model: torch's module and this library's
MODELS = {"gru": (torch.nn.GRU, GRU), "lstm": (torch.nn.LSTM, LSTM)}


# The module's default (solver="auto"), MGRIT's defaults, and the defaults before the trained-
# model benchmark chose them (cfactor 32 with implicit coarse steps).
DEFAULT_SETTINGS = ["auto", "default", "cfactor=32,coarse=implicit", "cfactor=128"]
# The LSTM has no implicit coarse step: its rows are the frozen-gate map instead.
LSTM_SETTINGS = ["auto", "default", "cfactor=32,coarse=frozen", "cfactor=128"]


def parse_setting(spec: str):
    """``"default"`` (MGRIT()), ``"auto"`` (the automatic choice, the module's default) or
    ``"cfactor=16,relax=F,tol=1e-6"`` -> MGRIT; ``budget_forward=2,budget_backward=1``
    (and ``budget_backward_relax``, ``budget_gradient``, ``budget_clamp``) set its Budget."""
    if spec == "default":
        return MGRIT()
    if spec == "auto":
        return Auto()
    known = {f.name: f for f in fields(MGRIT)} | {f"budget_{f.name}": f for f in fields(Budget)}
    kwargs: dict[str, object] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(
                f"bad MGRIT setting {item!r} in {spec!r}; use key=value with keys {sorted(known)}"
            )
        if value.lower() in ("true", "false"):
            kwargs[key] = value.lower() == "true"
            continue
        for convert in (int, float):
            try:
                kwargs[key] = convert(value)
                break
            except ValueError:
                continue
        else:
            kwargs[key] = value
    budget = {k[len("budget_") :]: kwargs.pop(k) for k in list(kwargs) if k.startswith("budget_")}
    if budget:
        kwargs["budget"] = Budget(**budget)
    return MGRIT(**kwargs)


def describe(opts) -> str:
    if isinstance(opts, Auto):
        return "auto" if opts == Auto() else f"auto({opts.mgrit.describe()})"
    return opts.describe()


def _timed(fn, device: torch.device) -> float:
    """Wall time of ``fn()``; on CUDA the queued kernels are waited for on both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def problem(
    T,
    batch,
    input_size,
    hidden,
    *,
    zbias=0.0,
    seed=0,
    dtype=None,
    device="cpu",
    model="gru",
    proj_size=0,
):
    """The benchmark's problem: a seeded random-init ``torch.nn.GRU`` or ``torch.nn.LSTM``
    (``model``; the GRU's z-gate or the LSTM's forget-gate biases raised by ``zbias``: long
    memory; the LSTM with projections of ``proj_size`` values if > 0), input ``x`` and loss
    weights ``w_y``, ``w_h``."""
    dtype = dtype or torch.float32
    torch.manual_seed(seed)
    extra = {"proj_size": proj_size} if proj_size else {}
    ref = MODELS[model][0](input_size, hidden, dtype=dtype, device=device, **extra)
    if zbias:
        with torch.no_grad():
            ref.bias_hh_l0[hidden : 2 * hidden] += zbias
    out = proj_size or hidden
    x = torch.randn(T, batch, input_size, dtype=dtype).to(device)
    w_y = torch.randn(T, batch, out, dtype=dtype).to(device)
    w_h = torch.randn(1, batch, out, dtype=dtype).to(device)
    return ref, x, w_y, w_h


def problem_of(args: argparse.Namespace, T: int, dtype=None, device="cpu"):
    """:func:`problem` of a bench run's arguments, at length ``T``."""
    return problem(
        T,
        args.batch,
        args.input,
        args.hidden,
        zbias=args.zbias,
        seed=args.seed,
        dtype=dtype,
        device=device,
        model=getattr(args, "model", "gru"),
        proj_size=getattr(args, "proj_size", 0),
    )


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Row:
    def __init__(self, name, module, opts=None, autocast=None):
        self.name, self.module, self.opts = name, module, opts
        self.autocast = autocast  # None, or a dtype: the row runs under torch.autocast
        self.fwd, self.train = [], []
        self.y = self.grads = self.stats = None

    def _amp(self, x):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(x.device.type, dtype=self.autocast)

    def forward(self, x):
        with torch.no_grad(), self._amp(x):
            return self.module(x)[0]

    def train_step(self, x, w_y, w_h):
        x = x.detach().requires_grad_()
        self.module.zero_grad(set_to_none=True)
        with self._amp(x):
            y, hn = self.module(x)
            if isinstance(hn, tuple):  # an LSTM's (h_n, c_n): the loss reads h_n
                hn = hn[0]
            y, hn = y.to(w_y.dtype), hn.to(w_h.dtype)  # an autocast row's may be bf16
            loss = (y * w_y).sum() + (hn * w_h).sum()
        loss.backward()
        return y.detach(), [x.grad] + [p.grad for p in self.module.parameters()]


# A sweep's GEMM rows for the roofline's second rate: MGRIT's chunks x batch at the defaults.
SWEEP_ROWS = 2048


def gemm_gflops(rows: int, hidden: int, gates: int, dtype=torch.float32, device="cpu") -> float:
    """This core's rate (GFLOP/s) of a step's recurrent GEMM over ``rows`` states: ``(rows, H)
    @ (H, gates * H)``, timed as the least of several runs of about 20 ms."""
    a = torch.randn(rows, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, gates * hidden, dtype=dtype, device=device)
    out = torch.empty(rows, gates * hidden, dtype=dtype, device=device)
    flops = 2.0 * rows * hidden * gates * hidden
    reps = max(1, int(2e7 / max(flops, 1.0)))
    best = float("inf")
    for _ in range(5):
        dev = torch.device(device)
        best = min(best, _timed(lambda: [torch.mm(a, w, out=out) for _ in range(reps)], dev))
    return flops * reps / best / 1e9


def work_gflop(row_steps_fwd, row_steps_bwd, T, B, I, H, gates, proj=0, library=True) -> float:
    """The flops of a training step (GFLOP): each row-step of either solve is one row of the
    recurrent GEMM (``2 H gates H``); the input gates and the gradients are four GEMMs over
    all ``T B`` rows (``W_ih x``, ``dx``, ``dW_ih``, ``dW_hh``). Elementwise work is not
    counted: the floor is the GEMMs'. An LSTM with projections of ``proj`` values: torch's
    (``library`` False) multiplies ``4H x P`` and projects ``P x H`` every step, and its
    ``dW_hr`` is one more GEMM over all rows; the library's solve multiplies ``4H x H`` and
    projects its outputs in three GEMMs over all rows (``y``, their gradient, ``dW_hr``)."""
    steps = row_steps_fwd + row_steps_bwd
    if proj and not library:
        recurrent = 2.0 * (gates * H * proj + proj * H) * steps
        bulk = 2.0 * T * B * (gates * H * (3 * I + proj) + proj * H)
        return (recurrent + bulk) / 1e9
    recurrent = 2.0 * gates * H * H * steps
    bulk = 2.0 * T * B * (gates * H * (3 * I + H) + 3 * proj * H)
    return (recurrent + bulk) / 1e9


def roofline(rec: dict, row, args, rates: dict) -> None:
    """Fill ``rec``'s ``gflop``, ``gflops`` (achieved in the training step) and ``x_floor``
    (its time over the time of its flops at the GEMM rate of its rows: the serial step's
    ``B`` rows where every solve was serial, a sweep's otherwise)."""
    T, B, I, H = rec["T"], args.batch, args.input, args.hidden
    gates = 4 if getattr(args, "model", "gru") == "lstm" else 3
    if row.stats is None:  # torch's module: the serial algorithm
        fwd = bwd = T * B
        serial = True
    else:
        fwd = sum(s.row_steps for s in row.stats.forward)
        bwd = sum(s.row_steps for s in row.stats.backward)
        serial = all(s.levels == 1 for s in row.stats.solves)
    proj = getattr(args, "proj_size", 0)
    gflop = work_gflop(fwd, bwd, T, B, I, H, gates, proj, library=row.stats is not None)
    rate = rates["serial"] if serial else rates["sweep"]
    rec.update(gflop=gflop, gflops=gflop / rec["train_s"], x_floor=rec["train_s"] / (gflop / rate))


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_one_length(T, args, settings, log=print, cols=None, rates=None) -> list[dict]:
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    ref, x, w_y, w_h = problem_of(args, T, dtype, device)
    model = getattr(args, "model", "gru")
    ours, torch_name = MODELS[model][1], torch_module_name(model)
    amp = AUTOCAST.get(getattr(args, "autocast", None) or "")
    rows = []
    if not args.no_torch:
        rows.append(Row(torch_name, ref, autocast=amp))
    rows.append(Row("serial", ours.from_torch(ref, solver="serial"), autocast=amp))
    for spec, opts in settings:
        row = Row(describe(opts), ours.from_torch(ref, solver=opts), opts, autocast=amp)
        row.spec = spec
        rows.append(row)
    for row in rows:  # warm-up, and the accuracy reference outputs
        row.y, row.grads = row.train_step(x, w_y, w_h)
        if isinstance(row.module, (GRU, LSTM)):
            row.stats = row.module.last_stats
    exact = next(r for r in rows if r.name == "serial")
    if amp is not None:  # errors against the serial solve without autocast
        exact = Row("serial fp32", ours.from_torch(ref, solver="serial"))
        exact.y, exact.grads = exact.train_step(x, w_y, w_h)

    def timed_step(row):  # a timed training step; its outputs and gradients are kept
        row.last = row.train_step(x, w_y, w_h)

    for _ in range(args.repeats):
        for row in rows:
            row.fwd.append(_timed(lambda r=row: r.forward(x), device))
            row.train.append(_timed(lambda r=row: timed_step(r), device))
    for row in rows:  # errors and statistics of the last timed call, as one solve: auto's
        # warm-up may have tried MGRIT where its timed calls ran serially
        row.y, row.grads = row.last
        if isinstance(row.module, (GRU, LSTM)):
            row.stats = row.module.last_stats
    base = {r.name: statistics.median(r.train) for r in rows}
    peaks = {r.name: _peak(r, T, args) for r in rows}
    results = []
    for row in rows:
        train = statistics.median(row.train)
        peak = peaks[row.name]
        rec = {
            "T": T,
            "solver": row.name,
            "fwd_s": statistics.median(row.fwd),
            "train_s": train,
            "speedup_vs_torch": base[torch_name] / train if torch_name in base else None,
            "speedup_vs_serial": base["serial"] / train,
            "max_abs_y_err": (row.y - exact.y).abs().max().item(),
            "rel_grad_err": max(_rel(a.to(b.dtype), b) for a, b in zip(row.grads, exact.grads)),
            "by_mgrit": row.stats.mgrit_share[0] > 0 if row.stats else None,
            "fwd_iters": row.stats.forward_iterations if row.stats else None,
            "bwd_iters": row.stats.backward_iterations if row.stats else None,
            "fwd_residual": row.stats.forward_residual if row.stats else None,
            "fell_back": row.stats.fell_back if row.stats else None,
            "peak_mb": peak,
            "peak_vs_torch": None
            if peak is None or peaks.get(torch_name) is None
            else peak / peaks[torch_name],
            "options": repr(row.opts) if row.opts else None,
        }
        if rates is not None:
            roofline(rec, row, args, rates)
        results.append(rec)
        log(format_row(rec, cols))
    return results


def _peak(row: Row, T: int, args) -> Optional[float]:
    """The row's training-step peak memory (MB, a fresh process), or None when not asked."""
    if args.no_memory or row.autocast is not None or not memory.supported(args.device):
        return None
    model = getattr(args, "model", "gru")
    solver = {torch_module_name(model): "torch", "serial": "serial"}.get(row.name, "mgrit")
    return memory.step_peak_mb(
        solver,
        T,
        args.batch,
        args.input,
        args.hidden,
        dtype=args.dtype,
        device=args.device,
        threads=args.threads,
        seed=args.seed,
        zbias=args.zbias,
        setting=getattr(row, "spec", None),
        model=model,
        proj_size=getattr(args, "proj_size", 0),
    )


# The table's columns: (title, width, cell text of a row); torch's and the memory columns
# only where they were measured.
COLUMNS = [
    ("T", 6, lambda r: f"{r['T']}"),
    ("solver", -34, lambda r: r["solver"]),
    ("fwd ms", 8, lambda r: f"{1e3 * r['fwd_s']:.1f}"),
    ("train ms", 9, lambda r: f"{1e3 * r['train_s']:.1f}"),
    ("x torch", 8, lambda r: f"{r['speedup_vs_torch']:.2f}"),
    ("x serial", 9, lambda r: f"{r['speedup_vs_serial']:.2f}"),
    ("it f/b", 6, lambda r: _iterations(r)),
    ("max|dy|", 8, lambda r: f"{r['max_abs_y_err']:.1e}"),
    ("rel dgrad", 9, lambda r: f"{r['rel_grad_err']:.1e}"),
    ("GF/s", 6, lambda r: "-" if r.get("gflops") is None else f"{r['gflops']:.1f}"),
    ("x floor", 7, lambda r: "-" if r.get("x_floor") is None else f"{r['x_floor']:.1f}"),
    ("peak MB", 8, lambda r: "-" if r.get("peak_mb") is None else f"{r['peak_mb']:.1f}"),
    ("/torch", 6, lambda r: "-" if r.get("peak_vs_torch") is None else f"{r['peak_vs_torch']:.2f}"),
]


def _iterations(r: dict) -> str:
    """MGRIT's cycles forward/adjoint; "-" where no solve was MGRIT's (serial, torch, or
    auto's serial choice: "-!" when an MGRIT try fell back)."""
    if r["fwd_iters"] is None or r.get("by_mgrit") is False:
        return "-" + ("!" if r.get("fell_back") else "")
    return f"{r['fwd_iters']}/{r['bwd_iters']}" + ("!" if r.get("fell_back") else "")


def columns(torch_row: bool = True, memory_cols: bool = True) -> list:
    skip = set()
    if not torch_row:
        skip |= {"x torch", "/torch"}
    if not memory_cols:
        skip |= {"peak MB", "/torch"}
    return [c for c in COLUMNS if c[0] not in skip]


def _cell(text: str, width: int) -> str:
    return f"{text:<{-width}}" if width < 0 else f"{text:>{width}}"


def header(cols=None) -> str:
    return " ".join(_cell(title, width) for title, width, _ in cols or COLUMNS)


def format_row(r: dict, cols=None) -> str:
    return " ".join(_cell(text(r), width) for _, width, text in cols or COLUMNS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--T",
        type=int,
        nargs="+",
        default=[1024, 4096, 16384],
        help="sequence lengths (default: 1024 4096 16384)",
    )
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="gru",
        help="the recurrent layer: gru (against torch.nn.GRU) or lstm (torch.nn.LSTM) "
        "(default gru)",
    )
    p.add_argument("--batch", type=int, default=4, help="sequences per batch (default 4)")
    p.add_argument("--input", type=int, default=32, help="input features (default 32)")
    p.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    p.add_argument(
        "--proj-size",
        type=int,
        default=0,
        help="--model lstm: the LSTM with projections, h of this many values (torch.nn.LSTM's "
        "proj_size; default 0: none)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per row (median)")
    p.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float32",
        help="dtype of weights and data (default float32)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument(
        "--zbias",
        type=float,
        default=0.0,
        help="add this to every z-gate (LSTM: forget-gate) bias: long memory, the hard case "
        "(e.g. 3)",
    )
    p.add_argument(
        "--settings",
        nargs="+",
        default=None,
        help='MGRIT rows: "default" or "cfactor=16,relax=F,..." (default: '
        + " ".join(DEFAULT_SETTINGS)
        + "; with --model lstm: "
        + " ".join(LSTM_SETTINGS)
        + ")",
    )
    p.add_argument("--no-torch", action="store_true", help="skip torch's row")
    p.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the peak-memory column (one fresh process per row and length)",
    )
    p.add_argument(
        "--autocast",
        choices=sorted(AUTOCAST),
        help="run every row under torch.autocast with this dtype; errors are then against "
        "the serial solve without autocast (no peak-memory column)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random-init GRU, its input and the loss weights (default 0)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    p.add_argument(
        "--time-parallel",
        type=int,
        default=1,
        metavar="P",
        help="under torchrun with P processes: time the time-parallel training step "
        "against the single-process MGRIT and serial solves (default T: 65536)",
    )


def time_parallel_options(spec: str, T: int, batch: int, hidden: int) -> MGRIT:
    """The MGRIT options of a time-parallel row: ``auto`` means MGRIT there (the choice is
    off across ranks), and ``cfactor="auto"`` is resolved for the shape (the ranks' split
    needs a number)."""
    opts = parse_setting(spec)
    if isinstance(opts, Auto):  # its tries' cost guard is off across ranks anyway
        opts = opts.mgrit.replace(guard=replace(opts.mgrit.guard, cost=False))
    if opts.cfactor == "auto":
        m = auto_cfactor(T, batch, hidden, options=opts, kind=step_kind())
        opts = opts.replace(cfactor=m)
    return opts


def run_time_parallel(args: argparse.Namespace) -> list[dict]:
    """Rank 0 times the single-process rows while the others wait; then all ranks time the
    time-parallel step, with the coarse levels solved on every rank and on one (each repeat's
    time is the slowest rank's)."""
    import torch.distributed as dist

    from .distributed import TimeComm, TimeGroup, init_time_parallel, scatter_time

    tg = init_time_parallel()
    if tg.size != args.time_parallel:
        raise ValueError(f"--time-parallel {args.time_parallel} but {tg.size} processes started")
    torch.set_num_threads(args.threads)
    T = args.T[0] if args.T != [1024, 4096, 16384] else 65536
    opts = time_parallel_options((args.settings or ["auto"])[0], T, args.batch, args.hidden)
    model = getattr(args, "model", "gru")
    ours = MODELS[model][1]
    ref, x, w_y, w_h = problem_of(args, T)
    rows = [
        Row("serial", ours.from_torch(ref, solver="serial")),
        Row(f"{describe(opts)} 1 process", ours.from_torch(ref, solver=opts)),
    ]
    pars = []
    for coarse in ("replicated", "root"):
        name = f"{describe(opts)} {tg.size} ranks, coarse {coarse}"
        par = Row(name, ours.from_torch(ref, solver=opts))
        par.module.time_group = TimeGroup(tg.group, coarse=coarse)
        par.comm_share = []
        pars.append(par)
    x_local, wy_local = scatter_time(x, tg, opts.cfactor), scatter_time(w_y, tg, opts.cfactor)
    first = float(tg.rank == 0)
    if tg.rank == 0:
        for row in rows:
            row.y, row.grads = row.train_step(x, w_y, w_h)
    for par in pars:
        par.train_step(x_local, wy_local, w_h * first)  # warm-up
    for _ in range(args.repeats):
        if tg.rank == 0:
            for row in rows:
                row.train.append(_timed(lambda r=row: r.train_step(x, w_y, w_h), x.device))
        for par in pars:
            dist.barrier()
            TimeComm.seconds = 0.0
            start = time.perf_counter()
            par.train_step(x_local, wy_local, w_h * first)
            own = torch.tensor([time.perf_counter() - start, TimeComm.seconds])
            dist.all_reduce(own, op=dist.ReduceOp.MAX)
            par.train.append(float(own[0]))
            par.comm_share.append(float(own[1] / own[0]))
    if tg.rank != 0:
        return []
    base = statistics.median(rows[0].train)
    single = statistics.median(rows[1].train)
    print(
        f"mgrit-gru bench --time-parallel {tg.size}: {model} T={T} B={args.batch} "
        f"input={args.input} hidden={args.hidden} "
        + (f"proj_size={args.proj_size} " if getattr(args, "proj_size", 0) else "")
        + f"float32 threads/rank={torch.get_num_threads()} "
        f"repeats={args.repeats} zbias={args.zbias} torch {torch.__version__}"
    )
    print(
        f"{'solver':<48} {'train ms':>9} {'x serial':>9} {'x 1-proc mgrit':>14} {'comm share':>10}"
    )
    results = []
    for row in rows + pars:
        t = statistics.median(row.train)
        share = statistics.median(row.comm_share) if row in pars else None
        rec = {
            "solver": row.name,
            "T": T,
            "train_s": t,
            "speedup_vs_serial": base / t,
            "speedup_vs_single_mgrit": single / t,
            "comm_share": share,
        }
        results.append(rec)
        share_text = "-" if share is None else f"{100 * share:.0f}%"
        print(
            f"{row.name:<48} {1e3 * t:>9.1f} {base / t:>9.2f} {single / t:>14.2f} {share_text:>10}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": {"ranks": tg.size, "T": T, "threads": torch.get_num_threads()},
                    "rows": results,
                },
                f,
                indent=1,
            )
    return results


def run(args: argparse.Namespace) -> list[dict]:
    for name in ("batch", "input", "hidden", "threads", "repeats", "time_parallel"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    proj = getattr(args, "proj_size", 0)
    if proj and (args.model != "lstm" or not 0 < proj < args.hidden):
        raise ValueError(
            f"--proj-size {proj}: needs --model lstm and a value below --hidden ({args.hidden})"
        )
    if args.time_parallel > 1:
        return run_time_parallel(args)
    if any(T < 1 for T in args.T):
        raise ValueError(f"--T values must be >= 1, got {args.T}")
    if args.settings is None:
        args.settings = LSTM_SETTINGS if args.model == "lstm" else DEFAULT_SETTINGS
    settings = [(s, parse_setting(s)) for s in args.settings]
    device = parse_device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    print(
        f"mgrit-gru bench: {args.model} B={args.batch} input={args.input} "
        f"hidden={args.hidden} " + (f"proj_size={proj} " if proj else "") + f"{args.dtype} "
        f"threads={torch.get_num_threads()} repeats={args.repeats} zbias={args.zbias} "
        + (f"autocast={args.autocast} " if getattr(args, "autocast", None) else "")
        + f"torch {torch.__version__} on "
        + (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or platform.machine()
        )
    )
    memory_cols = not args.no_memory and not args.autocast and memory.supported(args.device)
    cols = columns(not args.no_torch, memory_cols)
    gates = 4 if args.model == "lstm" else 3
    rates = {
        "serial": gemm_gflops(args.batch, args.hidden, gates, dtype, args.device),
        "sweep": gemm_gflops(SWEEP_ROWS, args.hidden, gates, dtype, args.device),
    }
    print(
        f"roofline: this core's recurrent GEMM (rows x {args.hidden} @ {args.hidden} x "
        f"{gates * args.hidden}, {args.dtype}) runs {rates['serial']:.1f} GFLOP/s at "
        f"{args.batch} rows (a serial step) and {rates['sweep']:.1f} at {SWEEP_ROWS} rows (a "
        "sweep); GF/s = the training step's GEMM flops (recurrent rows the solves ran + input "
        "gates and gradients) per second; x floor = its time over those flops' time at the "
        "rate of its rows (serial solves: a serial step's, else a sweep's)"
    )
    print(
        "train = forward + backward of sum(w*y) + sum(w*h_n); x torch / x serial = speed-up of "
        "the training step; it f/b = MGRIT cycles of the forward / adjoint solve (! = it fell "
        "back to the serial solve); max|dy|, rel dgrad = output and worst relative gradient "
        "error against the serial solve (fp32, without autocast)"
        + (
            "; peak MB = the step's peak memory (fresh process: resident-set high-water growth "
            "on CPU, max_memory_allocated on CUDA)"
            if memory_cols
            else ""
        )
    )
    print(header(cols))
    results = []
    for T in args.T:
        results += bench_one_length(T, args, settings, cols=cols, rates=rates)
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "func"}
        meta.update(
            torch=torch.__version__,
            date=datetime.now(timezone.utc).isoformat(),
            threads=torch.get_num_threads(),
        )
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": results}, f, indent=1)
        print(f"wrote {args.json}")
    return results
