"""This machine's step costs for :mod:`mgrit_gru.cost`: measure, fit, cache, show.

    mgrit-gru calibrate [--quick | --full] [--show]

Each kind is timed as the solves run it (fp32, one thread): ``"step"`` and ``"adjoint"`` as
a level-0 F-relaxation of the MGRIT core over ``rows`` states (the propagator, the core's
loop and the cost meter included), ``"sweep"`` and ``"sweep_adjoint"`` likewise with the
compiled kernels (:mod:`mgrit_gru.kernels`: the F-relaxation is one call; where they cannot
be built, their entries are the PyTorch steps'), ``"fused"`` as the serial forward that runs
torch.nn.GRU's own loop (per step, batch = rows, rows up to :data:`FUSED_ROWS`, where the
serial forward uses it). A timing is the thread's CPU time (``time.thread_time``: the time
other processes take the core from it does not count, so that a busy machine still measures
its own steps) of a sweep of about :data:`UNIT_US`; per row count the least of ``rounds``
timings, the rounds interleaved over the row counts so that a disturbance falls on all of
them alike. (The built-in table was measured as wall-clock medians on an idle machine; there
the two agree.) Per kind and hidden size ``time = o + c * rows`` is fitted by least squares
in relative error (every row count counts alike, not the largest one most); the table is the
fit at H = 64 (from another H, ``c`` divided by the model's ``cost.row_scale(H)``).

A calibration is measured only on request (``mgrit-gru calibrate``, or the first
``mgrit-gru train`` on a machine without one: :func:`for_run`), never inside a library call,
and cached per machine key (:func:`mgrit_gru.cost.machine_key`): the choices it drives stay
functions of counts, the same in every run on the machine. ``benchmarks/step_cost.py`` runs
the full measurement and prints the H-scaling check.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import torch

from . import cost
from .kernels import load as _load_kernels


def compiled_available() -> bool:
    """Whether the compiled CPU kernels can run here (built now if needed)."""
    return _load_kernels() is not None


ROWS = (8, 32, 128, 512, 2048)
QUICK = {"hidden": (64,), "rows": ROWS}
FULL = {"hidden": (32, 64, 128), "rows": ROWS}
ROUNDS = 9
FUSED_ROWS = 128  # the fused kind is fitted over batches up to this
UNIT_US = 4000.0  # a timing's length by the built-in model: many steps, few interruptions
RUN_FILE = "calibration.json"  # the table a training run started with, in its folder
SHAPES = ((16384, 4, 64), (784, 32, 64))  # (T, B, H) shown with cfactor="auto"


class CalibrationError(ValueError):
    """The measurement gave no usable model (a cost per row not above zero)."""


# -- timing ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _measuring():
    """One thread, fp32, no autograd, a fixed seed; the caller's settings and RNG restored."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        torch.set_num_threads(cost.THREADS)
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)


def _steps(kind: str, rows: int, H: int, least: int, most: int) -> int:
    """Steps per timing: about :data:`UNIT_US` by the built-in model, in [least, most]."""
    o, c = cost.BUILTIN["cpu"][kind]
    return int(min(max(UNIT_US / cost.price(o, c, rows, H), least), most))


def _sweep(
    kind: str, rows: int, H: int, steps: int = 0, device: str = "cpu"
) -> tuple[Callable[[], None], int]:
    """One F-relaxation of ``steps`` steps over ``rows`` states (chunks of one row each);
    0 steps: 16-64 by :func:`_steps`."""
    from .core import Grid
    from .core.cycle import LocalComm, _Solver
    from .gru.cell import GRUCell
    from .kernels import compiled_for
    from .layer import solve as gs

    steps = steps or _steps(kind, rows, H, 16, 64)
    grid = Grid(N=steps * rows, m=steps, n=rows)
    meter = cost.Meter(H, device)
    w_hh = torch.randn(3 * H, H, device=device) / H**0.5
    kernel = None
    if kind.startswith("sweep"):
        kernel = compiled_for("compiled", w_hh)
    if kind in ("step", "sweep"):
        gates = torch.randn(grid.M, 1, 3 * H, device=device)
        b = torch.randn(H, device=device)
        op = gs.ForwardStep(grid, gates, w_hh, b, GRUCell("classic"), meter=meter, kernel=kernel)
    else:
        D = torch.rand(grid.M, 1, H, device=device)
        C = torch.rand(grid.M, 1, 3 * H, device=device) * 0.1
        op = gs.AdjointStep(grid, D, C, w_hh, GRUCell("classic"), meter, kernel)
    u = torch.rand(steps, rows, 1, H, device=device) - 0.5
    relax = _Solver([grid], [op], "F", LocalComm())
    return (lambda: relax.f_relax(0, u, None)), steps - 1


def _fused(batch: int, H: int, T: int = 0) -> tuple[Callable[[], None], int]:
    """The serial forward by torch.nn.GRU's loop over ``T`` steps of ``batch`` sequences;
    0 steps: 32-512 by :func:`_steps`."""
    from .gru.cell import fused_forward

    T = T or _steps("fused", batch, H, 32, 512)
    ref = torch.nn.GRU(1, H)
    x, h0 = torch.randn(T, batch, 1), torch.zeros(batch, H)
    params = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0]
    return (lambda: fused_forward(x, h0, *params)), T


def time_points(
    kind: str, H: int, rows: Sequence[int], rounds: int = ROUNDS
) -> list[tuple[int, float]]:
    """``[(rows, us per step)]`` of ``kind`` at hidden size ``H`` (call inside
    :func:`_measuring`): per row count the least of ``rounds`` timings, rounds interleaved."""
    if kind == "fused":
        rows = [r for r in rows if r <= FUSED_ROWS]
        runs = [_fused(r, H) for r in rows]
    elif kind.startswith("sweep") and not compiled_available():
        return time_points("step" if kind == "sweep" else "adjoint", H, rows, rounds)
    else:
        runs = [_sweep(kind, r, H) for r in rows]
    best = [float("inf")] * len(runs)
    for fn, _ in runs:
        fn()  # warm up
    for _ in range(rounds):
        for i, (fn, per) in enumerate(runs):
            start = time.thread_time()
            fn()
            best[i] = min(best[i], (time.thread_time() - start) / per * 1e6)
    return list(zip(rows, best))


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(o, c)`` of ``time = o + c * rows`` by least squares in relative error (weights
    ``1 / time^2``); ``o`` at least 0."""
    w = [1.0 / max(t, 1e-12) ** 2 for _, t in points]
    W = sum(w)
    mx = sum(wi * r for wi, (r, _) in zip(w, points)) / W
    my = sum(wi * t for wi, (_, t) in zip(w, points)) / W
    sxx = sum(wi * (r - mx) ** 2 for wi, (r, _) in zip(w, points))
    sxy = sum(wi * (r - mx) * (t - my) for wi, (r, t) in zip(w, points))
    c = sxy / sxx if sxx > 0 else 0.0
    return max(my - c * mx, 0.0), c


def at_h64(per_h: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """The fit at H = 64, or from the nearest H with ``c`` divided by ``cost.row_scale(H)``."""
    H = min(per_h, key=lambda h: (abs(h - 64), h))
    o, c = per_h[H]
    return o, c / cost.row_scale(H)


def measure_fits(
    hidden: Sequence[int] = QUICK["hidden"],
    rows: Sequence[int] = ROWS,
    rounds: int = ROUNDS,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, dict[int, tuple[float, float]]]:
    """kind -> H -> ``(o, c)`` fitted at that H; ``log`` gets one line per fit."""
    fits: dict[str, dict[int, tuple[float, float]]] = {}
    with _measuring():
        for kind in cost.KINDS:
            for H in hidden:
                points = time_points(kind, H, rows, rounds)
                o, c = fits.setdefault(kind, {})[H] = fit(points)
                if log:
                    text = "  ".join(f"{r}:{t:.1f}" for r, t in points)
                    log(f"{kind:<8} H={H:<4} {text}  -> o={o:.1f} c={c:.4f}")
    return fits


def measure(
    hidden: Optional[Sequence[int]] = None,
    rows: Optional[Sequence[int]] = None,
    quick: bool = True,
    rounds: int = ROUNDS,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, tuple[float, float]]:
    """This machine's CPU table ``{kind: (o, c)}`` at H = 64 (one thread, fp32). ``quick``:
    H = 64 only (a few seconds); else H = 32, 64, 128. Raises :class:`CalibrationError` when
    a fit is unusable (a cost per row not above zero: a machine too busy to measure)."""
    form = QUICK if quick else FULL
    fits = measure_fits(hidden or form["hidden"], rows or form["rows"], rounds, log)
    row = {kind: at_h64(fits[kind]) for kind in cost.KINDS}
    if cost.valid_row(row) is None:
        raise CalibrationError(f"the step costs measured here give no usable model: {row}")
    if compiled_available():  # else the serial LSTM solve has no choice to make
        serial = measure_serial(log=log)
        row.update(serial)
    return row


# -- the serial LSTM solve: torch's kernel against the compiled sweeps -----------------------
SERIAL_BATCHES = (1, 4, 8)  # the serial LSTM solve's batches (beyond: their line), at
SERIAL_STEPS = (16, 4096)  # a few steps (a call's fixed part) and many (a step's cost once
# the sequence's buffers outgrow the caches: at B = 4 torch's kernel costs 0.9x the sweeps a
# step over 1024 steps, 1.1x over 8192, AMD EPYC)
SERIAL_ROUNDS = 2


def serial_points(
    batches: Sequence[int] = SERIAL_BATCHES,
    steps: Sequence[int] = SERIAL_STEPS,
    rounds: int = SERIAL_ROUNDS,
    hidden: int = 64,
) -> dict[str, list[tuple[int, int, float]]]:
    """:data:`mgrit_gru.cost.SERIAL_KINDS` -> ``[(T, B, us)]``: one layer of
    ``mgrit_gru.LSTM(1, hidden, solver="serial")`` as training runs it, its forward (autograd
    recording) and its backward timed apart, each way (torch's kernel, the compiled sweeps:
    :func:`mgrit_gru.layer.solve.serial_way`); per shape the least of ``rounds`` timings, the
    rounds interleaved over shapes and ways (call inside :func:`_measuring`)."""
    from .layer.solve import serial_way
    from .lstm.module import LSTM

    ways = (
        ("torch", "lstm_torch", "lstm_torch_adjoint"),
        ("sweep", "lstm_sweep", "lstm_sweep_adjoint"),
    )
    model = LSTM(1, hidden, solver="serial", kernels="compiled")
    shapes = [(T, B) for T in steps for B in batches]
    inputs = {(T, B): torch.randn(T, B, 1) for T, B in shapes}
    best = {(way, T, B, p): float("inf") for way, *_ in ways for T, B in shapes for p in (0, 1)}
    with torch.enable_grad():
        for r in range(rounds + 1):  # round 0 warms up
            for T, B in shapes:
                for way, *_ in ways:
                    with serial_way(way):
                        start = time.thread_time()
                        y, _ = model(inputs[T, B])
                        mid = time.thread_time()
                        y.backward(torch.ones_like(y))
                        end = time.thread_time()
                    if r:
                        for p, t in ((0, mid - start), (1, end - mid)):
                            best[way, T, B, p] = min(best[way, T, B, p], t * 1e6)
    return {
        kind: [(T, B, best[way, T, B, p]) for T, B in shapes]
        for way, *kinds in ways
        for p, kind in enumerate(kinds)
    }


def fit_serial(points: Sequence[tuple[int, int, float]]) -> list:
    """``[call, [[B, us per step], ...]]`` from timings at two step counts per batch: a
    step's cost per batch from their difference, the call's fixed part the least over the
    batches of what the fewer steps leave (never below 0)."""
    by_batch: dict[int, dict[int, float]] = {}
    for T, B, t in points:
        by_batch.setdefault(B, {})[T] = t
    steps, calls = [], []
    for B in sorted(by_batch):
        (T1, t1), (T2, t2) = sorted(by_batch[B].items())[:1] + sorted(by_batch[B].items())[-1:]
        per = max((t2 - t1) / (T2 - T1), 0.0) if T2 > T1 else t2 / T2
        steps.append([B, per])
        calls.append(max(t1 - T1 * per, 0.0))
    return [min(calls), steps]


def measure_serial(
    rounds: int = SERIAL_ROUNDS, log: Optional[Callable[[str], None]] = None
) -> dict[str, list]:
    """This machine's :data:`mgrit_gru.cost.SERIAL_KINDS` entries at H = 64
    (:func:`serial_points`, :func:`fit_serial`); one that is not a valid entry (a step's
    cost not rising with the batch: a machine too busy to measure) is left out (the built-in
    entry serves)."""
    out = {}
    with _measuring():
        points = serial_points(rounds=rounds)
    for kind, pts in points.items():
        entry = fit_serial(pts)
        if log:
            text = "  ".join(f"B={B}:{us:.1f}" for B, us in entry[1])
            log(f"{kind:<18} H=64 us a step {text}  call {entry[0]:.0f} us")
        if cost.valid_serial(entry):
            out[kind] = entry
    return out


# -- the cache ------------------------------------------------------------------------------


def _file_mode() -> int:
    """What a plain ``open()`` gives a new file under this process's umask (mkstemp's own
    mode is 0600: a run's calibration.json would be the one file its group cannot read)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_json_atomic(path: Path, data) -> None:
    """Write ``data`` to ``path`` as JSON through a temporary file and os.replace, with the
    permissions of a plain ``open()``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save(row: dict, path: Optional[Path] = None, **about) -> dict:
    """Cache ``row`` as this machine's calibration (other machines' entries kept); returns
    the entry. ``about``: more fields for the entry (how it was measured)."""
    if cost.valid_row(row) is None:
        raise CalibrationError(f"not a calibration: {row}")
    path = cost.cache_path() if path is None else Path(path)
    entry = {
        "cpu": {k: list(v) for k, v in cost.valid_row(row).items()},
        "measured": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu_name": cost.cpu_name(),
        "torch": torch.__version__,
        "threads": cost.THREADS,
        "device": "cpu",
        **about,
    }
    data = cost.read_cache(path)
    data[cost.machine_key()] = entry
    write_json_atomic(path, data)
    cost.reload()
    return entry


def calibrate(
    quick: bool = True, path: Optional[Path] = None, log: Optional[Callable] = None
) -> dict:
    """Measure (:func:`measure`) and cache this machine's table; returns the cached entry."""
    start = time.perf_counter()
    row = measure(quick=quick, log=log)
    form = QUICK if quick else FULL
    seconds = round(time.perf_counter() - start, 1)
    about = {"form": "quick" if quick else "full", "hidden": list(form["hidden"])}
    return save(row, path, rows=list(form["rows"]), seconds=seconds, **about)


# -- training runs --------------------------------------------------------------------------


def for_run(cfg, run: Path, resume: bool, log: Callable[[str], None] = print) -> cost.Active:
    """Pin the cost model of a training run (``cfg``: its solver, device, time_parallel)
    for this process and record it in ``run/calibration.json``.

    Resumed: the table the run recorded (a run without a record used the built-in one), so
    that it decides as before. New, MGRIT or auto on the CPU in one process: this machine's
    calibration, measured first (quick, one line said) if none is cached and the cache is
    not switched off (``MGRIT_GRU_CALIBRATION=builtin``: the test suite). Time-parallel
    ranks, which must decide alike, take the built-in table; serial, torch and CUDA runs need no
    calibration (the CUDA row is the built-in one). A table pinned before is dropped. The
    thread count the solves are priced at (``--threads``, else torch's) is pinned and
    recorded likewise (a resumed run without one was priced at one thread)."""
    record = Path(run) / RUN_FILE
    cost.reset()
    if resume:
        entry = _read_json(record)
        table = cost.valid_row(entry.get("cpu")) if isinstance(entry, dict) else None
        cost.use(table, entry if table else None)
        threads = entry.get("threads", 1) if isinstance(entry, dict) else 1
        cost.pin_threads(threads if isinstance(threads, int) and threads >= 1 else 1)
        return cost.active()
    # the threads the run's solves are priced at (--threads, else torch's), kept for a resume
    cost.pin_threads(getattr(cfg, "threads", None) or cost.pricing_threads())
    if cfg.time_parallel > 1:
        cost.use(None)
        return cost.active()
    if cfg.solver in ("serial", "torch") or str(cfg.device).split(":")[0] != "cpu":
        return cost.active()
    now = cost.active()
    if now.origin == "builtin" and cost.mode() == "cached":
        log(
            f"calibration: no cost model cached for this machine ({cost.cpu_name()}, torch "
            f"{torch.__version__}): measuring it once (a few seconds, one thread) into "
            f"{cost.cache_path()}"
        )
        try:
            calibrate(quick=True)
        except (CalibrationError, OSError) as exc:
            log(f"calibration: {exc}; using the built-in cost model")
        now = cost.active()
    cost.use(now.table, now.entry)
    # (a file named as the run, or a folder holding a run: train refuses it, untouched)
    if not record.parent.is_file() and not (record.parent / "checkpoint.pt").exists():
        about = {
            "origin": now.origin,
            "described": now.describe(),
            "threads": cost.pricing_threads(),
        }
        if now.path:
            about["path"] = now.path
        write_json_atomic(record, {**(now.entry or {}), **about, "cpu": now.table["cpu"]})
    return cost.active()


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# -- the command ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    form = p.add_mutually_exclusive_group()
    form.add_argument(
        "--quick",
        dest="full",
        action="store_false",
        help="measure at H = 64 only (the default; a few seconds)",
    )
    form.add_argument("--full", action="store_true", help="measure at H = 32, 64 and 128")
    form.add_argument(
        "--show", action="store_true", help="print the cost model in use; measure nothing"
    )
    p.set_defaults(full=False)


def run(args: argparse.Namespace) -> None:
    """``mgrit-gru calibrate``: measure and cache (or ``--show``), then print the tables."""
    if args.show:
        now = cost.active()
        print(f"in use: {now.describe()}")
        if now.origin == "builtin" and cost.cached_entry() is None:
            print(f"no calibration cached for {cost.machine_key()!r} in {cost.cache_path()}")
        elif now.origin == "builtin":
            print(f"{cost.ENV}=builtin: the cached calibration is not used")
        print()
        _print_tables(now.table["cpu"], "in use")
        return
    print(
        f"calibrating {cost.cpu_name()} (torch {torch.__version__}, one thread, fp32; "
        f"{'full: H = 32, 64, 128' if args.full else 'quick: H = 64'}; us per step)"
    )
    entry = calibrate(quick=not args.full, log=lambda text: print(f"  {text}"))
    print(f"cached in {cost.cache_path()} ({entry['seconds']} s), key {cost.machine_key()!r}")
    if cost.mode() == "builtin":
        print(f"note: {cost.ENV}=builtin: the library does not use it meanwhile")
    print()
    _print_tables(cost.valid_row(entry["cpu"]), "this machine")


def _print_tables(row: dict, name: str) -> None:
    from .layer.solve import step_kind
    from .options import auto_cfactor

    builtin = cost.BUILTIN["cpu"]
    cols = f"{'o us':>7} {'c us/row':>9} {'o/c rows':>9}"
    print(f"{'':<8} {name:<27}   built-in (AMD EPYC)")
    print(f"{'kind':<8} {cols}   {cols}")
    for kind in cost.KINDS:
        cells = [f"{o:7.1f} {c:9.3f} {o / c:9.1f}" for o, c in (row[kind], builtin[kind])]
        print(f"{kind:<8} {cells[0]}   {cells[1]}")
    print("the serial LSTM solve, a whole layer: call us | us a step at batches ...")
    for kind in cost.SERIAL_KINDS:
        cells = [
            f"{e[0]:5.0f} | " + " ".join(f"{b}:{us:.1f}" for b, us in e[1]) if e else "built-in"
            for e in (row.get(kind), builtin[kind])
        ]
        print(f"  {kind:<18} {cells[0]:<40}   {cells[1]}")
    # the kind of step this process's kernels run (not building them for a printout: unbuilt,
    # the PyTorch steps' rule)
    step = step_kind() if _load_kernels(build=False) is not None else "step"
    print(f'cfactor="auto" (o/c of "{step}" drives it: the steps this process runs):')
    for T, B, H in SHAPES:
        picks = []
        for table in (row, builtin):
            with cost.use(table):
                picks.append(auto_cfactor(T, B, H, kind=step))
        print(f"  T={T:<6} B={B:<3} H={H:<4} {name}: {picks[0]:<4} built-in: {picks[1]}")
