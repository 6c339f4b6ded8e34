"""Modelled machines: what each event of a trace costs on a device, and what a message costs
on the link between ranks.

A :class:`Device` prices work as the cost model does (:mod:`mgrit_gru.cost`): a batched step
of a kind, as the solves run it (loop and bookkeeping included), costs ``o + c * rows``
microseconds at H = 64 (``c`` scaled by ``(H/64)^1.75``); the operators dispatched between
steps (residuals, copies, C-relaxation, the coarse chunk maps) cost ``op_us`` each if they
compute (a kernel launch on a GPU) and ``view_us`` if they only make a view; a pass over a
whole slice (``bulk``) costs ``o + c * rows`` per kind where measured, else its operators plus
its bytes over the memory bandwidth. A :class:`Link` prices a message at ``latency + bytes /
bandwidth``.

Named models (:data:`LINKS`, :func:`device`): this CPU as measured in the process
(:func:`this_cpu`: the cost model's table, one thread), and one H200 as measured when one was
lent (docs/logs/gpu-run1: its step costs, 8 us per dispatched operator, cuDNN's step), with
its public memory bandwidth for the arithmetic. Links: shared memory, 10 GbE, InfiniBand HDR
(public figures), and this VM's loopback as gloo uses it (measured).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import cost
from .. import trace as tr
from ..trace import Event

# An event whose operators were not counted: operators per call of a coarse chunk map.
MAP_OPS = 2
# The sequence lengths whose timed traces calibrate this CPU's passes over a slice: a short
# one, and one whose passes no longer fit in the caches (as the long sequences' do not).
BULK_T = (512, 8192)


@dataclass(frozen=True)
class Link:
    """What joins the ranks: ``latency_us`` per message and ``bandwidth_GBps``;
    ``collectives``: how its library runs a collective over P ranks, ``"tree"`` (log2 P
    steps, as MPI does for small messages) or ``"ring"`` (P - 1 steps, as gloo does)."""

    name: str
    latency_us: float
    bandwidth_GBps: float
    source: str
    collectives: str = "tree"

    def steps(self, ranks: int) -> int:
        """Latencies of one collective's pass over ``ranks`` ranks."""
        if ranks < 2:
            return 0
        return ranks - 1 if self.collectives == "ring" else math.ceil(math.log2(ranks))

    @property
    def latency_s(self) -> float:
        return 1e-6 * self.latency_us

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return 1e9 * self.bandwidth_GBps


LINKS = {
    "shm": Link(
        "shared memory (one node)",
        1.0,
        10.0,
        "public intra-node MPI figures (OSU micro-benchmarks): ~0.5-1 us, ~10 GB/s",
    ),
    "10gbe": Link(
        "10 Gb Ethernet",
        25.0,
        1.25,
        "10 Gbit/s line rate (1.25 GB/s); ~25 us one-way TCP latency (public figures); "
        "collectives as gloo runs them (rings)",
        "ring",
    ),
    "ib": Link(
        "InfiniBand HDR",
        1.5,
        25.0,
        "HDR 200 Gbit/s (25 GB/s), ~1-2 us MPI latency (public figures)",
    ),
    "loopback": Link(
        "gloo over this VM's loopback",
        60.0,
        1.0,
        "measured here: benchmarks/projection_check.py's ping-pong (see docs/projection.md); "
        "collectives as gloo runs them (rings)",
        "ring",
    ),
}


def work_category(e: Event) -> str:
    """The critical path's category of a work event: "fine" (level 0), "serial" (a serial
    sweep) or "coarse" (a coarser level)."""
    return "fine" if e.level == 0 else "serial" if e.level == tr.SERIAL else "coarse"


@dataclass(frozen=True)
class Device:
    """What one rank's work costs (microseconds). ``steps``: kind -> (o, c per row at H = 64)
    for "step", "adjoint", "fused", "sweep", "sweep_adjoint"; ``op_us``: one dispatched operator
    outside the steps; ``bulk``: kind -> (o, c per row) of the passes over a slice (missing
    kinds: operators plus bytes); ``bytes_per_row``: what such a pass reads and writes per row
    at H = 64; ``bandwidth_GBps``: the device memory's; ``torch``: (o, c per time step) of a
    torch.nn.GRU training step at the measured batch, or None; ``max_torch_T``: the longest
    sequence torch.nn.GRU accepts there (cuDNN's limit), or None; ``steps_by_ops``: the
    library's steps too cost their operators (a GPU, where a step is its launches), which needs
    a trace with operators counted; ``windows``: what the host spends around events, measured
    from timed traces: per step kind ``(o, c per row)`` per call of an MGRIT sweep beyond the
    step itself (exit checks, kept gates), ``"map"`` ``(o, c)`` per call, ``"message <kind>"`` /
    ``"phase <kind>"`` per event (the work between steps: residuals, copies, C-relaxation), used
    in place of ``op_us`` where present; ``drift``: a step timed now over the step table's price
    for it (well above 1: the machine is loaded or slower than when it was calibrated, and the
    figures measured now are inflated)."""

    name: str
    kind: str
    steps: dict
    op_us: float
    view_us: float = 0.0
    bulk: dict = field(default_factory=dict)
    bytes_per_row: float = 4096.0
    bandwidth_GBps: float = 10.0
    torch: Optional[tuple] = None
    torch_shape: Optional[tuple] = None
    max_torch_T: Optional[int] = None
    steps_by_ops: bool = False
    windows: dict = field(default_factory=dict)
    drift: float = 1.0
    source: str = ""
    # one process on this many threads (cores): the compiled sweeps' rows priced in the
    # kernels' blocks (cost.thread_share), the passes over the slice at THREAD_EFFICIENCY a
    # thread (see bulk_share); a sweep's measured per-row extra with its rows; operators and
    # the host's other windows on one thread
    threads: int = 1

    def bulk_share(self) -> float:
        """The speed-up of the passes over the slice at :attr:`threads`: each thread at
        :data:`mgrit_gru.cost.THREAD_EFFICIENCY` of one (their GEMMs and compiled passes, as
        measured at two threads on the AMD EPYC). An upper bound where the passes' memory
        traffic saturates the machine's bandwidth, which two cores do not show."""
        return 1.0 if self.threads <= 1 else self.threads * cost.THREAD_EFFICIENCY

    def cost_us(self, e: Event) -> tuple[str, float]:
        """The event's category (replay's split) and modelled microseconds."""
        scale = (e.hidden / 64) ** cost.H_EXPONENT if e.hidden else 1.0
        if e.what == tr.WORK:
            cat = work_category(e)
            if e.kind == "map" and "map" in self.windows:
                o, c = self.windows["map"]
                return cat, e.calls * (o + c * e.rows * scale)
            if e.kind == "map":
                ops = e.ops if e.ops or e.views else MAP_OPS * e.calls
                return cat, self._ops(ops, e.views) + self._stream(e.rows * e.calls * scale)
            kind = e.kind
            if kind == "fused" and self.max_torch_T and e.calls >= self.max_torch_T:
                # beyond cuDNN's limit the library's own loop runs: its step as a sweep runs it
                o, c = self.steps["step"]
                return cat, e.calls * (o + c * e.rows * scale)
            if self.steps_by_ops and kind != "fused":
                if not (e.ops or e.views):
                    raise ValueError(f"{self.name}: its model needs a trace with counted operators")
                return cat, self._ops(e.ops, e.views) + self._stream(e.rows * e.calls * scale)
            o, c = self.steps[kind]
            # what an MGRIT sweep's steps cost beyond the calibrated step, measured: per call
            # the host's (views, the exit checks' launches), per row the rows' own (the
            # kernel's streams through whole-sequence buffers, which a calibration's small
            # ones do not have, and the exit checks' elementwise operators over the same
            # rows); a serial sweep runs the calibrated loop alone
            xo, xc = (0.0, 0.0) if e.level == tr.SERIAL else self.windows.get(kind, (0.0, 0.0))
            # an event holds a sweep's calls: its step count is at most that. The per-row
            # part spreads over the threads with the rows (until 2026-12-06 only the
            # calibrated part did: at two threads the model was a quarter slow for MGRIT)
            share = cost.thread_share(kind, e.rows, e.calls, e.hidden or 64, self.threads)
            return cat, e.calls * (o + xo + (c + xc) / share * e.rows * scale)
        if e.what == tr.BULK:
            if e.kind in self.bulk:
                o, c = self.bulk[e.kind]
                return "bulk", o + c * e.rows * scale / self.bulk_share()
            rows = e.rows * scale / self.bulk_share()
            return "bulk", self._ops(e.ops, e.views) + self._stream(rows)
        window = self.windows.get(f"{e.what} {e.kind}")
        return "other", self._ops(e.ops, e.views) if window is None else window

    def _ops(self, ops: int, views: int) -> float:
        return ops * self.op_us + views * self.view_us

    def _stream(self, rows: float) -> float:
        return rows * self.bytes_per_row / (1e3 * self.bandwidth_GBps)

    def torch_us(self, steps: int, batch: int, hidden: int) -> Optional[float]:
        """torch.nn.GRU's training step over ``steps`` time steps (None: not measured at
        this batch and hidden size, or beyond what it accepts here)."""
        if self.torch is None or (self.max_torch_T is not None and steps >= self.max_torch_T):
            return None
        if self.torch_shape is not None and self.torch_shape != (batch, hidden):
            return None
        o, c = self.torch
        return o + c * steps


@dataclass(frozen=True)
class Machine:
    """A device per rank and the link between ranks."""

    device: Device
    link: Link

    @property
    def name(self) -> str:
        return f"{self.device.name} + {self.link.name}"

    def cost(self, e: Event) -> tuple[str, float]:
        cat, us = self.device.cost_us(e)
        return cat, 1e-6 * us

    @property
    def latency_s(self) -> float:
        return self.link.latency_s


# One H200 as measured on 2026-12-04 (docs/logs/gpu-run1 .. 3; torch 2.11 + CUDA 13.0, cuDNN
# 9.19). A small step there is its kernel launches and the host's work between them: every
# event costs its operators. Per operator, what a real training step spends: 15.3 us per
# operator that computes and 5.5 us per view, the least-squares fit of the host's time per
# event over the training steps at T = 1024 and 4096 (gpu-run3, B = 4, H = 64; a tiny op
# back to back costs 7.4 us, a view 1.2 us: a real step's kernels are larger and the Python
# between them counts). cuDNN's forward: 0.54 us per step (T = 16384, B = 1); its training
# step at B = 4, H = 64: 2.0 ms at T = 1024 and 28.5 ms at T = 16384 (0.25 ms + 1.72 us per
# step); it refused T = 65536 (CUDNN_STATUS_NOT_SUPPORTED). Arithmetic over the 4.8 TB/s of
# HBM3e (public figure).
H200 = Device(
    "H200",
    "cuda",
    {"step": (112.1, 0.00261), "adjoint": (63.5, 0.0), "fused": (0.54, 0.0)},
    op_us=15.3,
    view_us=5.5,
    bytes_per_row=4096.0,
    bandwidth_GBps=4800.0,
    torch=(250.0, 1.72),
    torch_shape=(4, 64),
    max_torch_T=65536,
    steps_by_ops=True,
    source="calibrated on the lent H200's training steps at T = 1024, 4096 "
    "(docs/logs/gpu-run3); HBM3e bandwidth 4.8 TB/s (public)",
)


def op_us(device: str = "cpu", repeats: int = 2000) -> tuple[float, float]:
    """Microseconds per dispatched operator here, one that computes (a tiny in-place add)
    and one that makes a view (a row of a matrix), back to back."""
    tiny = torch.zeros(1, device=device)
    rows = torch.zeros(8, 8, device=device)
    out = []
    for fn in (lambda: tiny.add_(1.0), lambda: rows[3]):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            if tiny.is_cuda:
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / repeats)
        out.append(1e6 * best)
    return out[0], out[1]


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``(o, c)`` of ``o + c * x`` through the least and the largest x (o at least 0)."""
    (x0, y0), (x1, y1) = min(points), max(points)
    c = max((y1 - y0) / (x1 - x0), 1e-9)
    return max(y0 - c * x0, 0.0), c


def time_step(fn, repeats: int = 3, least: bool = False) -> float:
    """Seconds of ``fn()`` after one warm-up call: the median of ``repeats`` (``least``:
    the least)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) if least else statistics.median(times)


@functools.lru_cache(maxsize=8)
def this_cpu(batch: int, input_size: int, hidden: int) -> Device:
    """This CPU at one thread, measured now (about 10 s): the cost model's step table in
    use, the operator cost, the passes over a slice (timed traces of MGRIT training steps at
    :data:`BULK_T`) and torch.nn.GRU's training step (T = 256 and 1024)."""
    from .record import training_step

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bulk: dict[str, list] = {}
        traces = []
        for T in BULK_T:
            step = training_step(T, batch, input_size, hidden, "budget", cfactor=32)
            step()  # warm
            samples: dict[str, list] = {}
            for _ in range(3):
                with tr.record(timed=True) as t:
                    step()
                traces.append(t)
                for e in t.of(tr.BULK):
                    samples.setdefault(e.kind, []).append((e.rows, 1e6 * e.seconds))
            for kind, pts in samples.items():
                rows = pts[0][0]
                bulk.setdefault(kind, []).append((rows, min(s for _, s in pts)))
        scale = (hidden / 64) ** cost.H_EXPONENT
        bulk_fit = {k: _per_h64(fit(v), scale) for k, v in bulk.items()}
        table = cost.table()["cpu"]
        torch_pts = []
        for T in (256, 1024):
            torch_pts.append((T, 1e6 * time_step(training_step(T, batch, input_size, hidden))))
        compute_us, view_us = op_us()
        windows = _windows(traces, table, scale)
        drift = _drift(table, hidden)
        return Device(
            f"this CPU ({cost.cpu_name()}, 1 thread)",
            "cpu",
            dict(table),
            op_us=compute_us,
            view_us=view_us,
            bulk=bulk_fit,
            windows=windows,
            drift=drift,
            torch=fit(torch_pts),
            source=f"measured here: {cost.active().describe()}; operators, passes and "
            "torch.nn.GRU timed in this process",
        )
    finally:
        torch.set_num_threads(threads)


def _drift(table: dict, hidden: int, rows: int = 64) -> float:
    """A forward step over ``rows`` states timed now (the least of 5 sweeps) over the step
    table's price for it."""
    from .. import calibrate

    fn, per = calibrate._sweep("step", rows, hidden, 32)
    best = min(time_step(fn, 1, least=True) for _ in range(5)) / per
    o, c = table["step"]
    return 1e6 * best / (o + c * rows * (hidden / 64) ** cost.H_EXPONENT)


def _fit_extra(points: list) -> tuple[float, float]:
    """``(o, c)`` of an MGRIT step's extra host time per call against its rows: through the
    medians at its least and largest row counts (0 where none is measured)."""
    by_rows: dict = {}
    for rows, us in points:
        by_rows.setdefault(rows, []).append(us)
    medians = sorted((r, statistics.median(v)) for r, v in by_rows.items())
    if len(medians) < 2:
        return (max(medians[0][1], 0.0), 0.0) if medians else (0.0, 0.0)
    (r0, y0), (r1, y1) = medians[0], medians[-1]
    c = max((y1 - y0) / (r1 - r0), 0.0)
    return max(y0 - c * r0, 0.0), c


STEP_KINDS = ("step", "adjoint", "sweep", "sweep_adjoint")  # a step of a solve's propagator


def _windows(traces: list, table: dict, scale: float) -> dict:
    """What the host spends around events, from timed traces (see :class:`Device`): per
    call of a step beyond the cost model's step (the median), a coarse chunk map's ``(o, c)``
    per call, and per message or phase event its median window."""
    extra: dict[str, list] = {}
    maps: list = []
    others: dict[str, list] = {}
    for t in traces:
        for e in t.events:
            us = 1e6 * e.seconds
            if e.what == tr.WORK and e.kind in STEP_KINDS and e.calls and e.level >= 0:
                o, c = table[e.kind]
                per = us / e.calls - (o + c * e.rows * scale)
                extra.setdefault(e.kind, []).append((e.rows * scale, per))
            elif e.what == tr.WORK and e.kind == "map" and e.calls:
                maps.append((e.rows * scale, us / e.calls))
            elif e.what in (tr.MESSAGE, tr.PHASE):
                others.setdefault(f"{e.what} {e.kind}", []).append(us)
    out: dict = {k: _fit_extra(v) for k, v in extra.items()}
    if len({r for r, _ in maps}) > 1:
        out["map"] = fit(maps)
    out.update({k: statistics.median(v) for k, v in others.items()})
    return out


def _per_h64(oc: tuple[float, float], scale: float) -> tuple[float, float]:
    return oc[0], oc[1] / scale


def device(name: str, batch: int, input_size: int, hidden: int) -> Device:
    """A named device model: "cpu" (this CPU, measured now) or "h200"."""
    if name == "cpu":
        return this_cpu(batch, input_size, hidden)
    if name == "h200":
        return H200
    raise ValueError(f"unknown device model {name!r}; choose cpu or h200")
