"""What a GRU step costs: the model behind ``cfactor="auto"``, the cost guard and the
automatic solver choice.

Every decision made from it is a function of counts (steps, rows, cycles), never of a clock:
two runs of the same training make the same choices, and a resumed run continues exactly.

A step over ``rows`` states (batch x chunks) costs ``o + c * rows`` microseconds at hidden
size 64 in float32: a fixed overhead (Python, kernel launches, one pass over ``W_hh``) plus
the arithmetic of its rows. At another hidden size H (``x = H / 64``) and dtype
(:func:`step_us`, the one formula every price goes through)::

    max(o + WEIGHT_ROWS * c * (DTYPE_WEIGHTS[dtype] * x^2 - 1), 0)
        + c * DTYPE[dtype] * rows * (a + b x + q x^2) / (a + b + q),   (a, b, q) = ROW_SHAPE

(the dtype factors 1 but for float64 on the CPU): a row's cost has a part per row (the
call's bookkeeping, about 3% of it at H = 64), a part per hidden unit (the gate math:
sigmoids, tanh) and the GEMM's H^2; the step's pass over ``W_hh`` (about WEIGHT_ROWS rows'
worth at H = 64) grows as H^2 whatever the rows. A call's fixed part, which no step counts,
is :func:`fixed_us`; the automatic choice's a-priori test is :func:`first_relaxation_us` and
:func:`mgrit_hopeless`. A table is one thread's (:data:`THREADS`); the compiled sweeps'
rows are priced at the process's threads (:func:`thread_share`). (Until 2026-12-05
the model scaled ``c`` by ``x^1.75``, fitted over H = 32-128: at H = 8 that priced a row 5x
below its cost, at H = 1 30-60x, so MGRIT's wide sweeps at small H looked 30x cheaper than
they ran; docs/design.md, "The cost model".)
Three kinds:

- ``"step"``: the library's batched forward step (MGRIT's sweeps; the serial loop where it is
  used);
- ``"fused"``: ``torch.nn.GRU``'s own CPU loop, which the serial forward uses for small
  batches (``mgrit_gru.layer.solve.FUSED_MAX``);
- ``"adjoint"``: one step of the adjoint recurrence;
- ``"sweep"``, ``"sweep_adjoint"``: a forward and an adjoint step of the compiled CPU kernels
  (:mod:`mgrit_gru.kernels`), which run whole sweeps in one call: their overhead is about
  nothing, so a serial sweep costs what its rows do, and MGRIT's wider rows buy little on one
  core (the serial solve's compiled adjoint, which also forms the gate gradients, is priced
  as "sweep_adjoint");
- :data:`SERIAL_KINDS`: the serial LSTM solve on the CPU, whole, by torch's kernel or by the
  compiled sweeps, between which the layer chooses (the end of this module).

The table in use (:func:`table`, :func:`active`):

- the machine's own calibration, if ``mgrit-gru calibrate`` (or the first ``mgrit-gru train``
  on the machine) has measured and cached one for this machine key (CPU model, torch
  version, one thread, device kind) in :func:`cache_path`: read once, lazily, at the first
  use; nothing is ever measured inside a library call (:mod:`mgrit_gru.calibrate` measures);
- else :data:`BUILTIN`;
- ``MGRIT_GRU_CALIBRATION=builtin`` forces :data:`BUILTIN` (the test suite sets it in its
  conftest, so that tests see the same numbers on every machine), ``=cached`` (the default)
  the cache;
- :func:`use` pins a table for the process (or a ``with`` block): ``mgrit-gru train`` pins
  the table a run started with, so that its resumption decides alike. Time-parallel ranks
  must decide alike too: on one machine they read the same cache; across machines pin one
  table in each (``mgrit-gru train --time-parallel`` pins the built-in one).

:data:`BUILTIN` was calibrated with ``python benchmarks/step_cost.py`` on this project's
2-core AMD EPYC (one thread, fp32, 2026-12-03; each kind timed as the solves run it, loop and
bookkeeping included; "fused" fitted over batches 1-64, where the serial forward uses it);
the "sweep" kinds by ``mgrit-gru calibrate`` on an AMD EPYC of the same kind (2026-12-04),
scaled to the vectorised build of 2026-12-06 (its comment says how).
On CUDA the "sweep" kinds (the Triton sweeps) are a projection from the kernels' structure,
not a measurement, until a GPU check replaces them (see the table).
Its CUDA row was measured on an H200 (2026-12-04, ``benchmarks/gpu_check.sh``'s sweep part:
the library's steps as the solves run them, B x chunks = 4-16384 rows at H = 64; "fused" is
cuDNN's forward per step): a step there is its kernel launches (11 for a forward step, 4 for
an adjoint step), nearly free of its rows. A cached calibration replaces the CPU row only.
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from . import trace

# MGRIT's adjoint passes over all T x B rows that a compiled serial adjoint does inside its
# loop (a cell's compiled coefficients and gate gradients, layer.solve.compiled_passes), in
# compiled adjoint steps over those rows: both memory-bound passes, about half such a step
# (measured 2026-12-06, AMD EPYC, T = 16384, B = 4, H = 64, one thread: 23.5 + 24.2 ms against
# 99 ms for the step as calibrated that day)
COMPILED_PASSES = 0.5

# device kind -> step kind -> (o in us, c in us per row at H = 64); measured on the AMD EPYC
BUILTIN = {
    "cpu": {
        "step": (32.0, 0.40),
        "fused": (12.0, 0.60),
        "adjoint": (7.0, 0.50),
        # the compiled sweeps: measured 2026-12-04 as (0.3, 0.41) and (0.0, 0.435), scaled by
        # what building them with -fno-trapping-math (vectorised activations) changed, measured
        # side by side on 2026-12-06 by `mgrit-gru calibrate` (c: 2.446 -> 1.324 and 1.371 ->
        # 1.020 us a row on a slower day of the same VM)
        "sweep": (0.17, 0.22),
        "sweep_adjoint": (0.0, 0.32),
        # the serial LSTM solve's two ways (SERIAL_KINDS): (call us, ((B, us a step), ...));
        # measured 2026-12-06 on this project's 2-core AMD EPYC by `mgrit-gru calibrate`
        # (calibrate.measure_serial: 16 and 4096 steps, least of 2 rounds, one thread) on a
        # slow day of the VM, every time here 3-5x what the GRU kinds' day would give, so
        # only their ratios count, which is all the choice reads
        "lstm_torch": (1178.0, ((1, 3.85), (4, 16.8), (8, 34.8))),
        "lstm_torch_adjoint": (1444.0, ((1, 5.85), (4, 19.2), (8, 40.1))),
        "lstm_sweep": (1402.0, ((1, 5.21), (4, 9.27), (8, 19.9))),
        "lstm_sweep_adjoint": (656.0, ((1, 6.23), (4, 13.5), (8, 28.0))),
    },
    "cuda": {
        "step": (112.1, 0.0026),
        "fused": (0.54, 0.01),
        "adjoint": (63.5, 0.0012),
        # the Triton sweeps: PROJECTED, not measured (no GPU has run them yet): a step inside
        # one launch is its dependent dot chain and loads, ~1.5 us, the launch spread over the
        # sweep's steps; per row as the PyTorch steps. benchmarks/gpu_check.sh measures them.
        "sweep": (1.5, 0.0026),
        "sweep_adjoint": (1.5, 0.0012),
    },
}
CALIBRATION = BUILTIN  # its former name
# How a step's cost changes with the hidden size and the dtype (measured with
# benchmarks/cost_check.py --shape on the AMD EPYC, one thread, H = 1-256, rows 8-2048, every
# kind; each kind's per-row cost against H = 64 within 0.7-1.5x of this one shape at H >= 4):
# a row's cost per c at x = H / 64 is ROW_SHAPE[0] + ROW_SHAPE[1] x + ROW_SHAPE[2] x^2 (1 at
# H = 64); the step's pass over W_hh costs WEIGHT_ROWS rows' worth at H = 64, x^2 that
# elsewhere; float64 costs DTYPE times float32's per row (half the SIMD lanes; 1.3-2x
# measured, 2 from H = 16 on). A calibration measures (o, c) at H = 64 in float32 only.
# The pass over W_hh at few rows costs DTYPE_WEIGHTS times float32's in float64 (4.4x in the
# per-H fits at H = 64 and 256, 3 fits the check's serial solves at B = 1-4 better).
ROW_SHAPE = (0.03, 0.63, 0.34)
WEIGHT_ROWS = 2.0
DTYPE = {torch.float64: 2.0}
DTYPE_WEIGHTS = {torch.float64: 3.0}
# A call's fixed part that no step counts (Python: the module's checks, the input gates'
# call, work buffers, stats), in the table's "step" overheads (the machine's Python speed):
# CALL_STEPS for any solve (1.3-1.8 ms measured at T = 1 on the AMD EPYC, about 7 of its
# "step" overheads), LEVEL_STEPS more per MGRIT level beyond the first (its hierarchy, the
# stopping tests, the coarse solves' calls: 2-5 ms at 2-3 levels, T = 1e3-1e4, B = 1).
CALL_STEPS, LEVEL_STEPS = 7.0, 15.0
H_EXPONENT = 1.75  # the former model's c * x^1.75 (the projection's machine tables use it)
KINDS = ("step", "fused", "adjoint", "sweep", "sweep_adjoint")
THREADS = 1  # a calibration is measured at one thread (torch.set_num_threads(1))
ENV, CACHE_ENV = "MGRIT_GRU_CALIBRATION", "MGRIT_GRU_CACHE"
# Threads. A compiled sweep (the "sweep" kinds) shares its rows among the process's threads in
# blocks (mgrit_gru/kernels/common.h, over_blocks; the constants below are its): about R /
# SWEEP_BLOCKS rows a block, whole groups of four, at most BLOCK_ROWS; one thread runs a block
# through every step of the sweep, the threads take blocks from a shared counter, and a sweep
# whose work (rows x steps x H) is below PARALLEL_WORK stays on one thread. So the serial
# solve's sweep at B = 4 (one block) runs on one thread whatever the count, MGRIT's over T / m
# x B rows on all of them. The slowest thread's blocks set the sweep's time, each thread at
# THREAD_EFFICIENCY of one thread's speed (the cores share the caches and memory the blocks'
# gates stream through: benchmarks/threads.py --sweeps, docs/measurements.md, "Threads").
# The PyTorch steps ("step", "adjoint") and torch's own loop ("fused") are priced at one
# thread: torch spreads a step's GEMM over threads only at thousands of rows, and the
# library runs them only without the compiled kernels. THREADS_ENV pins the count the model
# prices at (the test suite pins 1: the same choices on any core count); unset, it is
# torch.get_num_threads() when the solve starts; a time group's ranks price at one thread.
SWEEP_BLOCKS, BLOCK_ROWS, PARALLEL_WORK = 16, 256, 1 << 12
THREAD_EFFICIENCY = 0.8
THREADS_ENV = "MGRIT_GRU_COST_THREADS"


class Active(NamedTuple):
    """The table in use and where it came from: ``origin`` "builtin", "cached" (this
    machine's entry of ``path``) or "pinned" (:func:`use`); ``entry``: the cached entry (its
    "measured" date, "cpu_name", ...) or the pinned table's description."""

    table: dict
    origin: str
    entry: Optional[dict] = None
    path: Optional[str] = None

    def describe(self) -> str:
        e = self.entry or {}
        if self.origin == "builtin":
            return "built-in cost model (measured on an AMD EPYC)"
        what = f"{e.get('cpu_name', '?')}, torch {e.get('torch', '?')}, {e.get('measured', '?')}"
        if self.origin == "cached":
            return f"this machine's calibration ({what}) from {self.path}"
        return f"pinned cost model: {e.get('described', what)}"


_BUILTIN_ACTIVE = Active(BUILTIN, "builtin")
_pinned: Optional[Active] = None
_threads: Optional[int] = None  # pin_threads
_cached: Optional[Active] = None  # the cache as read once (builtin when it holds no entry)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform.processor(), else the machine)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name") and ":" in line:
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_key(device: str = "cpu") -> str:
    """The cache key of this machine: CPU model, torch version, threads (always 1), device,
    and the CPU kernels' build (:func:`mgrit_gru.kernels.build_key`: their sources and flags),
    so that a calibration of earlier kernels is not read as this code's."""
    from .kernels import build_key

    return (
        f"{cpu_name()} | torch {torch.__version__} | threads {THREADS} | {_kind(device)}"
        f" | kernels {build_key()}"
    )


def cache_path() -> Path:
    """``$MGRIT_GRU_CACHE/calibration.json``, else ``~/.cache/mgrit-gru/calibration.json``."""
    folder = os.environ.get(CACHE_ENV)
    base = Path(folder) if folder else Path.home() / ".cache" / "mgrit-gru"
    return base / "calibration.json"


def valid_row(row) -> Optional[dict]:
    """``{kind: (o, c)}`` for the :data:`KINDS` with o >= 0 and c > 0 finite, else None;
    with the row's valid :data:`SERIAL_KINDS` entries (a row without them,
    or with one not valid, is still a row: :func:`serial_entry` takes the built-in ones)."""
    try:
        out = {k: (float(row[k][0]), float(row[k][1])) for k in KINDS}
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    ok = all(math.isfinite(o) and math.isfinite(c) and o >= 0 and c > 0 for o, c in out.values())
    if not ok:
        return None
    for kind in SERIAL_KINDS:
        if kind in row and valid_serial(row[kind]):
            call, steps = row[kind]
            out[kind] = (float(call), tuple((int(b), float(us)) for b, us in steps))
    return out


def read_cache(path: Optional[Path] = None) -> dict:
    """The cache file's entries (key -> entry); {} when absent or unreadable."""
    path = cache_path() if path is None else Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_entry(path: Optional[Path] = None, device: str = "cpu") -> Optional[dict]:
    """This machine's valid cached entry, or None."""
    entry = read_cache(path).get(machine_key(device))
    if isinstance(entry, dict) and valid_row(entry.get("cpu")):
        return entry
    return None


def with_cpu_row(row: dict) -> dict:
    """A full table: ``row`` for the CPU, the built-in CUDA row."""
    return {**BUILTIN, "cpu": valid_row(row) or BUILTIN["cpu"]}


def mode() -> str:
    """What :func:`active` draws on, "builtin" or "cached": ``MGRIT_GRU_CALIBRATION``
    (default "cached")."""
    value = os.environ.get(ENV, "").strip().lower() or "cached"
    if value in ("builtin", "cached"):
        return value
    raise ValueError(f"{ENV}={value!r}: give builtin or cached (or leave it unset)")


def active() -> Active:
    """The table in use and its origin (reads the cache once, at the first call)."""
    global _cached
    if _pinned is not None:
        return _pinned
    if mode() == "builtin":
        return _BUILTIN_ACTIVE
    if _cached is None:
        path = cache_path()
        entry = cached_entry(path)
        _cached = (
            Active(with_cpu_row(entry["cpu"]), "cached", entry, str(path))
            if entry
            else _BUILTIN_ACTIVE
        )
    return _cached


def table() -> dict:
    """The table in use: device kind -> step kind -> (o, c)."""
    return active().table


class use:
    """Pin ``table`` (a full table, or a CPU row ``{kind: (o, c)}``; None: :data:`BUILTIN`)
    for the process; as a ``with`` block, only inside it. ``entry``: what :func:`active`
    reports of it (a cached entry, or ``{"described": "text"}``)."""

    def __init__(self, table: Optional[dict] = None, entry: Optional[dict] = None) -> None:
        global _pinned
        table = BUILTIN if table is None else table
        if "cpu" not in table:
            if valid_row(table) is None:
                raise ValueError(f"cost.use: not a table of {KINDS} -> (o >= 0, c > 0)")
            table = with_cpu_row(table)
        self._old = _pinned
        origin = "builtin" if table is BUILTIN and entry is None else "pinned"
        _pinned = Active(table, origin, entry)

    def __enter__(self) -> Active:
        return _pinned

    def __exit__(self, *exc) -> None:
        global _pinned
        _pinned = self._old


def reload() -> None:
    """Forget the cache as read: the next use reads it again (after a new calibration)."""
    global _cached
    _cached = None


def reset() -> None:
    """Forget any pinned table and thread count, and the cache as read."""
    global _pinned, _threads
    _pinned = _threads = None
    reload()


def _kind(device: str) -> str:
    kind = str(device).split(":")[0]
    return kind if kind in BUILTIN else "cpu"


def row_scale(hidden: int) -> float:
    """A row's cost at hidden size ``hidden`` per its cost at H = 64 (:data:`ROW_SHAPE`)."""
    a, b, q = ROW_SHAPE
    x = hidden / 64
    return (a + b * x + q * x * x) / (a + b + q)  # exactly 1 at H = 64


# The compiled CPU sweeps' GEMM runs a block's rows in groups of GEMM_GROUP (four accumulator
# chains; a group of fewer rows computes one of them again in the others' place), so the GEMM's
# share of a row's cost (ROW_SHAPE's H^2 term) is paid for whole groups. It counts at 1-3 rows:
# a serial sweep over 1-3 sequences, which the table's fit over 8-2048 rows priced as if a
# row's GEMM came alone (measured on the Intel Xeon VM, 2026-12-06: one row's step costs about
# four rows' at H = 64, both ways, while the many-row steps follow the fit; docs/measurements.md,
# "Where issue 37's targets stand (2026-12-06, late ...)").
GEMM_GROUP = 4
GROUPED_KINDS = ("sweep", "sweep_adjoint")


def row_units(rows: float, hidden: int, grouped: bool = False) -> float:
    """``rows`` in units of a row at H = 64 (:func:`row_scale`); ``grouped``: a compiled
    sweep's, whose GEMM share is paid for whole groups of :data:`GEMM_GROUP` rows."""
    units = rows * row_scale(hidden)
    if grouped and rows > 0:
        a, b, q = ROW_SHAPE
        x = hidden / 64
        whole = math.ceil(rows / GEMM_GROUP) * GEMM_GROUP
        units += (whole - rows) * q * x * x / (a + b + q)
    return units


def dtype_scale(dtype=None, device: str = "cpu", factors: Optional[dict] = None) -> float:
    """A row's cost in ``dtype`` per its cost in float32 (``factors``, default :data:`DTYPE`;
    1 off the CPU, whose table is one dtype's)."""
    if dtype is None or _kind(device) != "cpu":
        return 1.0
    return (DTYPE if factors is None else factors).get(dtype, 1.0)


def price(
    o: float,
    c: float,
    rows: float,
    hidden: int,
    dtype=None,
    device: str = "cpu",
    share: float = 1.0,
    grouped: bool = False,
) -> float:
    """The model of one step over ``rows`` states from its table entry ``(o, c)`` (at H = 64,
    float32): the module's formula (the fixed part never below zero); ``share``: the threads'
    speed-up of the rows' part (:func:`thread_share`); ``grouped``: a compiled CPU sweep's
    step (:func:`row_units`)."""
    # o holds one pass over W_hh at H = 64 (WEIGHT_ROWS rows' worth): elsewhere it scales
    weights = dtype_scale(dtype, device, DTYPE_WEIGHTS) * (hidden / 64) ** 2
    fixed = max(o + WEIGHT_ROWS * c * (weights - 1.0), 0.0)
    units = row_units(rows, hidden, grouped and _kind(device) == "cpu")
    return fixed + c * dtype_scale(dtype, device) * units / share


def pin_threads(threads: Optional[int]) -> None:
    """Price at ``threads`` in this process from now on (None: as :func:`pricing_threads`
    says); a training run pins the count it started with, so that its resumption at another
    ``--threads`` decides as before."""
    global _threads
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"cost.pin_threads: give a thread count of at least 1, not {threads!r}")
    _threads = threads


def pricing_threads(time_group: bool = False) -> int:
    """The thread count the model prices at: 1 on a time group's ranks (which must decide
    alike whatever their threads), else the count :func:`pin_threads` pinned, else
    :data:`THREADS_ENV`'s, else torch's."""
    if time_group:
        return 1
    if _threads is not None:
        return _threads
    pinned = os.environ.get(THREADS_ENV, "").strip()
    if pinned:
        if not pinned.isdigit() or int(pinned) < 1:
            raise ValueError(f"{THREADS_ENV}={pinned!r}: give a thread count of at least 1")
        return int(pinned)
    return torch.get_num_threads()


def sweep_blocks(rows: int) -> tuple[int, int]:
    """``(blocks, rows per block)`` of a compiled sweep over ``rows`` rows (over_blocks')."""
    per = min(BLOCK_ROWS, -(-rows // SWEEP_BLOCKS))
    per = max(4, -(-per // 4) * 4)
    return -(-rows // per), per


def thread_share(kind: str, rows: int, steps: int, hidden: int, threads: int) -> float:
    """The speed-up ``threads`` give the rows' part of ``steps`` steps of ``kind`` over
    ``rows`` rows: 1 but for the compiled sweeps, whose blocks the threads share (the slowest
    thread's whole blocks set the time, each thread at :data:`THREAD_EFFICIENCY`)."""
    if threads <= 1 or kind not in ("sweep", "sweep_adjoint") or rows <= 0:
        return 1.0
    if rows * max(steps, 1) * hidden < PARALLEL_WORK:
        return 1.0
    blocks, per = sweep_blocks(rows)
    used = min(threads, blocks)
    if used <= 1:
        return 1.0
    slowest = -(-blocks // used) * per  # rows the busiest thread runs (at least rows / used)
    return max(1.0, rows / slowest * THREAD_EFFICIENCY)


def step_us(
    kind: str,
    rows: int,
    hidden: int,
    device: str = "cpu",
    cell_costs: Optional[dict] = None,
    dtype=None,
    threads: int = 1,
    steps: int = 1,
    costs: Optional[dict] = None,
) -> float:
    """Modelled time of one step of ``kind`` over ``rows`` states; ``cell_costs``: a cell's
    :data:`mgrit_gru.layer.cell.Cell.costs` (its steps against the GRU's), or None (a GRU);
    ``dtype``: the states' (None: float32); ``threads``: the process's, in a sweep of
    ``steps`` such steps (:func:`thread_share`); ``costs``: the device's row of a table
    (default: the table in use now)."""
    o, c = _costs(table()[_kind(device)] if costs is None else costs, kind, cell_costs)
    share = _share(kind, rows, steps, hidden, device, cell_costs, threads)
    return price(o, c, rows, hidden, dtype, device, share, _grouped(kind, cell_costs))


def _costs(row: dict, kind: str, cell_costs: Optional[dict]) -> tuple[float, float]:
    """``(o, c)`` of ``kind`` for a cell: the table's GRU entry of its base kind, times the
    cell's multipliers (none: the GRU's own)."""
    base, o_times, c_times = (cell_costs or {}).get(kind, (kind, 1.0, 1.0))[:3]
    o, c = row[base]
    return o * o_times, c * c_times


def _grouped(kind: str, cell_costs: Optional[dict]) -> bool:
    """Whether a cell's ``kind`` (its base kind) is a compiled sweep's (:func:`row_units`)."""
    return (cell_costs or {}).get(kind, (kind,))[0] in GROUPED_KINDS


def _share(kind, rows, steps, hidden, device, cell_costs, threads) -> float:
    """:func:`thread_share` of a cell's ``kind`` (its base kind's) on the CPU; 1 elsewhere."""
    if threads <= 1 or _kind(device) != "cpu":
        return 1.0
    base = (cell_costs or {}).get(kind, (kind,))[0]
    return thread_share(base, rows, steps, hidden, threads)


def call_us(kind: str, device: str = "cpu", cell_costs: Optional[dict] = None) -> float:
    """The fixed cost of one call of a serial kernel of ``kind`` (a cell's fourth multiplier,
    of its base kind's ``o``: torch's LSTM kernel sets up its primitive on every call), or 0."""
    entry = (cell_costs or {}).get(kind, ())
    if len(entry) < 4:
        return 0.0
    return table()[_kind(device)][entry[0]][0] * entry[3]


def overhead_rows(hidden: int, device: str = "cpu", kind: str = "step", dtype=None) -> float:
    """The rows whose arithmetic costs as much as one step's fixed part."""
    o, c = table()[_kind(device)][kind]
    per_row = c * dtype_scale(dtype, device) * row_scale(hidden)
    return price(o, c, 0, hidden, dtype, device) / per_row


class Meter:
    """Adds up the modelled cost of the steps a solve runs (its propagators report to it);
    the table is the one in use when the meter is made; ``dtype``: the solve's."""

    def __init__(
        self,
        hidden: int,
        device: str = "cpu",
        cell_costs: Optional[dict] = None,
        dtype=None,
        threads: int = 1,
    ):
        self.hidden, self.device, self.dtype, self.threads = hidden, device, dtype, threads
        self.spent = 0.0
        self.row_steps = 0  # steps times their rows: the recurrent GEMMs' rows, all kinds
        self._costs = table()[_kind(device)]
        self._cell_costs = cell_costs

    def add(
        self, kind: str, rows: int, calls: int = 1, level: int = 0, cost_kind: str = ""
    ) -> None:
        """``calls`` steps of ``kind`` over ``rows`` states, at MGRIT ``level`` (-1: a serial
        sweep), costed as ``cost_kind`` (default: ``kind``) of the meter's cell; also the
        step's entry in a trace being recorded (:mod:`mgrit_gru.trace`)."""
        self.charge(cost_kind or kind, rows, calls)
        self.row_steps += calls * rows
        trace.work(cost_kind or kind, rows, self.hidden, calls, level)

    def charge(self, kind: str, rows: int, calls: int = 1) -> None:
        """Add the modelled cost of ``calls`` steps of ``kind`` over ``rows`` states that
        stand for other work (passes over all rows that the alternative does without): no
        row-steps, no trace entry."""
        self.spent += calls * step_us(
            kind,
            rows,
            self.hidden,
            self.device,
            self._cell_costs,
            self.dtype,
            self.threads,
            calls,
            self._costs,
        )


def serial_us(
    kind: str,
    steps: int,
    batch: int,
    hidden: int,
    device: str = "cpu",
    cell_costs: Optional[dict] = None,
    dtype=None,
    threads: int = 1,
) -> float:
    """Modelled time of a serial sweep of ``steps`` steps over ``batch`` sequences (and the
    kernel's fixed cost per call, where a cell states one: :func:`call_us`) at ``threads``."""
    per_call = call_us(kind, device, cell_costs)
    step = step_us(kind, batch, hidden, device, cell_costs, dtype, threads, steps)
    return per_call + steps * step


# The automatic choice's a-priori test (mgrit_gru.layer.control.solve_guarded): every MGRIT
# solve runs at least its first F-relaxation, m - 1 steps over all T / m chunks' rows (then a
# C-relaxation, an F-relaxation that exits early, the coarse levels: about twice that in every
# solve benchmarks/cost_check.py ran). The model is within 0.5-2x of the measured times over
# H = 1-256, B = 1-64, T = 1e3-1e5 in both dtypes (docs/measurements.md, "The cost model's
# check"), so where that least part alone is not below the serial solve by more than that
# factor (ERROR), MGRIT may be the slower way and auto solves serially without trying it.
ERROR = 2.0


def fixed_us(levels: int = 1, device: str = "cpu") -> float:
    """A call's fixed part that its steps do not count (:data:`CALL_STEPS`, and
    :data:`LEVEL_STEPS` per MGRIT level beyond the first), from the table's "step" overhead."""
    o = table()[_kind(device)]["step"][0]
    return o * (CALL_STEPS + LEVEL_STEPS * max(levels - 1, 0))


def first_relaxation_us(
    kind: str,
    chunk: int,
    chunks: int,
    batch: int,
    hidden: int,
    device: str = "cpu",
    cell_costs: Optional[dict] = None,
    dtype=None,
    levels: int = 2,
    threads: int = 1,
) -> float:
    """Modelled time of MGRIT's first F-relaxation on level 0, ``chunk - 1`` steps of ``kind``
    over ``chunks * batch`` rows, and the fixed part of its ``levels`` beyond the serial
    solve's (:func:`fixed_us`): the least an MGRIT solve runs beyond what serial does."""
    rows, steps = chunks * batch, max(chunk - 1, 0)
    sweep = steps * step_us(kind, rows, hidden, device, cell_costs, dtype, threads, steps)
    return sweep + fixed_us(levels, device) - fixed_us(1, device)


def mgrit_hopeless(least: float, serial: float) -> bool:
    """Whether MGRIT's least cost ``least`` is within the model's :data:`ERROR` of the
    serial solve's ``serial`` (both modelled): then it cannot be shown to win."""
    return serial > 0 and least * ERROR >= serial


# -- the serial LSTM solve: torch's kernel or the compiled sweeps ------------------------------
# On the CPU with the compiled kernels the serial LSTM solve takes whichever of torch's LSTM
# kernel (oneDNN's fused LSTM, torch.nn.LSTM's own) and the compiled sweeps this model prices
# lower at the shape (mgrit_gru.layer.solve, _serial_by_torch). Each is a whole serial solve
# as the layer runs it (the module's call, the input gates, the gradients' GEMMs: what one
# way does inside its kernel the other does beside it), one thread, H = 64, float32, input 1,
# measured by ``mgrit-gru calibrate`` (:func:`mgrit_gru.calibrate.measure_serial`): an entry
# is ``(call, ((B, us), ...))``, a call's fixed part and a step's cost at a few batches B,
# measured at 16 and 4096 steps (a long sequence: at B = 4 torch's kernel costs 0.9x the
# sweeps a step over 1024 steps and 1.1x over 8192, once its buffers outgrow the caches; AMD
# EPYC); between two batches a step costs ``o + c B`` of the line through them (beyond them,
# of the nearest two), priced at other H and dtypes by :func:`price` (the GRU kinds' scaling,
# not measured for these). "lstm_torch": the forward by torch's kernel under autograd, its
# graph kept for the backward; "lstm_torch_adjoint": torch's backward through that graph;
# "lstm_sweep": the compiled serial forward (keeping its gates); "lstm_sweep_adjoint": the
# compiled serial adjoint with its gate gradients and the gradients' GEMMs. A cached table
# without them (a calibration before 2026-12-05) takes the built-in ones.
SERIAL_KINDS = ("lstm_torch", "lstm_torch_adjoint", "lstm_sweep", "lstm_sweep_adjoint")


def valid_serial(entry) -> bool:
    """Whether ``entry`` is a :data:`SERIAL_KINDS` entry: a call's cost >= 0 and two or more
    batches (ascending, >= 1) whose step costs are > 0 and do not fall with the batch."""
    try:
        call, steps = entry
        call = float(call)
        steps = [(int(b), float(us)) for b, us in steps]
    except (TypeError, ValueError):
        return False
    if not (math.isfinite(call) and call >= 0 and len(steps) >= 2):
        return False
    batches, costs = [b for b, _ in steps], [us for _, us in steps]
    return (
        batches[0] >= 1
        and all(b1 < b2 for b1, b2 in zip(batches, batches[1:]))
        and all(math.isfinite(us) and us > 0 for us in costs)
        and all(u1 <= u2 for u1, u2 in zip(costs, costs[1:]))
    )


def serial_entry(kind: str) -> tuple:
    """``(call, ((B, us), ...))`` of a :data:`SERIAL_KINDS` entry in the CPU table in use
    (the built-in one where the table has none)."""
    entry = table()["cpu"].get(kind)
    return entry if entry is not None and valid_serial(entry) else BUILTIN["cpu"][kind]


def serial_solve_us(kind: str, steps: int, batch: int, hidden: int, dtype=None) -> float:
    """Modelled time of a whole serial solve of :data:`SERIAL_KINDS` ``kind`` over ``steps``
    steps of ``batch`` sequences (one thread, the CPU)."""
    call, points = serial_entry(kind)
    k = 1
    while k < len(points) - 1 and points[k][0] < batch:
        k += 1
    (b1, u1), (b2, u2) = points[k - 1], points[k]
    c = (u2 - u1) / (b2 - b1)
    at_64 = u1 + c * (batch - b1)  # measured: H = 64, float32
    o = max(u1 - c * b1, 0.0)  # the line's part that price() scales as the step's fixed part
    scale = price(o, c, batch, hidden, dtype) / price(o, c, batch, 64)
    return call + steps * at_64 * scale
