"""What a training step does, step by step: the trace that :mod:`mgrit_gru.projection`
replays on a modelled machine.

A trace is one rank's ordered list of :class:`Event`: its **work** (batched steps of a kind
over a number of rows, at an MGRIT level), its **bulk** work (the passes over all of its time
steps at once: input gates, adjoint coefficients, gradient GEMMs) and its **messages** (the
exchanges of the time-parallel backend, with their payloads). The solves record it
themselves while a :func:`record` block is open: the cost meter reports every step it
counts, the communicator every exchange; outside such a block every hook is a no-op test of
one global.

In one process the communicator's hooks are called at the same points of the algorithm as on
every rank of a time group (the V-cycle makes one decision for all ranks), and the places
where only a time group exchanges something (the global end state, gradient sums, the
start-up check) note what it would send. So one process's trace, recorded with the chunk
length that ``P`` ranks use, gives every rank's trace at ``P`` ranks
(:func:`mgrit_gru.projection.expand`); ``tests/test_distributed.py`` checks that against
the traces that real ranks record.

Optionally a block also counts the operators each event dispatched (each one or more kernel
launches on a GPU, where a small step costs its launches, not its arithmetic) and times each
event's window (for calibration).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

WORK, BULK, MESSAGE, PHASE = "work", "bulk", "message", "phase"

# message kinds: what a time group exchanges at that point
SHIFT = "shift"  # one state to the next rank in the pass's order (point to point)
GATHER = "gather"  # every rank's per-chunk values to every rank (all-gather, padded)
LAST = "last"  # the last rank's state to every rank (broadcast)
FIRST = "first"  # the first rank's state to every rank (broadcast)
MAX = "max"  # a scalar maximum over the ranks (all-reduce)
MAX_LAGGED = "max lagged"  # the same, begun without waiting and read at the next one
SUM = "sum"  # a tensor summed over the ranks (all-reduce)
CHECK = "check"  # the start-up agreement check of a call (all-gather of a few numbers)
RECV_PREV, SEND_NEXT = "recv_prev", "send_next"  # a serial solve handing its end state on
COLLECTIVES = (GATHER, LAST, FIRST, MAX, MAX_LAGGED, SUM, CHECK)

# work levels: >= 0 an MGRIT level (0: this rank's chunks; >= 1 coarse, the same on every
# rank); SERIAL a serial sweep over this rank's whole slice
SERIAL = -1


@dataclass(frozen=True)
class Event:
    """One entry of a trace.

    ``what``: "work", "bulk", "message" or "phase".
    ``kind``: work: "step", "adjoint", "fused", "sweep", "sweep_adjoint" (the cost model's
    kinds: "sweep" a compiled kernel's steps) or "map" (a coarse chunk map: elementwise);
    bulk: which pass ("gates", "coefficients", "forcing", "gradients"); message: one of the
    message kinds above; phase: "forward" or "backward" (a solve begins) or "mark" (the
    start of a pass over the slice).
    ``rows``: work and bulk: rows (states) per call; message: items (leading dimension).
    ``calls``: consecutive calls of the same shape (a sweep's steps are one event).
    ``hidden``: the state's width.
    ``level``: work: the MGRIT level, or -1 for a serial sweep.
    ``nbytes``: message: bytes per item. ``reverse``: message and phase: the pass runs through
    the ranks in reversed order (a message's None: that of the pass under way). ``peer``: a
    point-to-point message's other rank (recorded by real ranks). ``ops``: operators
    dispatched in the event's window that compute (each a kernel launch on a GPU),
    ``views``: those that only make a view (when counted).
    ``seconds``: the window's wall time (when timed).
    """

    what: str
    kind: str
    rows: int = 0
    calls: int = 1
    hidden: int = 0
    level: int = 0
    nbytes: int = 0
    reverse: Optional[bool] = None
    peer: Optional[int] = None
    ops: int = 0
    views: int = 0
    seconds: float = 0.0


@dataclass
class Trace:
    """One rank's events and what describes them (``meta``: shape, options, rank, ranks)."""

    events: list[Event] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def save(self, path: Union[str, Path]) -> None:
        data = {"meta": self.meta, "events": [asdict(e) for e in self.events]}
        Path(path).write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Union[str, Path]) -> Trace:
        data = json.loads(Path(path).read_text())
        return cls([Event(**e) for e in data["events"]], data.get("meta", {}))

    def of(self, what: str) -> list[Event]:
        return [e for e in self.events if e.what == what]

    def summary(self) -> dict:
        """Counts: steps per kind and level, messages per kind, bytes sent."""
        steps: dict[str, int] = {}
        for e in self.of(WORK):
            key = f"{e.kind}@{e.level}"
            steps[key] = steps.get(key, 0) + e.calls
        messages: dict[str, int] = {}
        for e in self.of(MESSAGE):
            messages[e.kind] = messages.get(e.kind, 0) + 1
        return {"steps": steps, "messages": messages}


class _Recorder:
    def __init__(self, count_ops: bool, timed: bool, sync: bool = True) -> None:
        self.trace = Trace()
        self.count_ops, self.timed, self.sync = count_ops, timed, sync
        self.ops = self.views = 0
        self.last = time.perf_counter()

    def emit(self, event: Event) -> None:
        if self.count_ops or self.timed:
            now = time.perf_counter()
            seconds = now - self.last if self.timed else 0.0
            counted = {"ops": self.ops, "views": self.views, "seconds": seconds}
            event = Event(**{**asdict(event), **counted})
            self.ops, self.views, self.last = 0, 0, now
        events = self.trace.events
        if events and _same_work(events[-1], event):  # a sweep: one event of many calls
            last = events[-1]
            events[-1] = replace(
                last,
                calls=last.calls + event.calls,
                ops=last.ops + event.ops,
                views=last.views + event.views,
                seconds=last.seconds + event.seconds,
            )
            return
        events.append(event)


def _same_work(a: Event, b: Event) -> bool:
    return a.what == b.what == WORK and (a.kind, a.rows, a.hidden, a.level) == (
        b.kind,
        b.rows,
        b.hidden,
        b.level,
    )


_active: Optional[_Recorder] = None


def active() -> bool:
    """Whether a :func:`record` block is open."""
    return _active is not None


def counting() -> bool:
    """Whether an open :func:`record` block counts operators (the compiled sweeps are then
    off: their steps dispatch none, and a model priced by operators would see nothing)."""
    return _active is not None and _active.count_ops


@contextlib.contextmanager
def record(
    count_ops: bool = False, timed: bool = False, sync: bool = True, **meta
) -> Iterator[Trace]:
    """Record this process's trace inside the block (not nested).

    ``count_ops``: count the operators each event dispatched (a dispatch mode sees them; it
    slows the block). ``timed``: each event's window in seconds; on CUDA a pass over the
    slice waits for the device before and after (``sync``), else the windows are the host's
    time (which a host-bound GPU run spends where it waits). ``meta`` goes into the
    trace's ``meta``."""
    global _active
    if _active is not None:
        raise RuntimeError("trace.record: a trace is already being recorded")
    rec = _Recorder(count_ops, timed, sync)
    rec.trace.meta.update(meta)
    mode = _OpCounter(rec) if count_ops else contextlib.nullcontext()
    _active = rec
    try:
        with mode:
            yield rec.trace
    finally:
        _active = None


def _OpCounter(rec: _Recorder):
    """A dispatch mode that counts into ``rec`` the operators that compute and the views."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(func, "is_view", False):
                rec.views += 1
            else:
                rec.ops += 1
            return func(*args, **(kwargs or {}))

    return Counter()


def _sync(x: Optional[Tensor]) -> None:
    if _active is not None and _active.timed and _active.sync and x is not None and x.is_cuda:
        torch.cuda.synchronize(x.device)


def work(kind: str, rows: int, hidden: int, calls: int = 1, level: int = 0) -> None:
    """``calls`` batched steps of ``kind`` over ``rows`` states each, at MGRIT ``level``."""
    if _active is not None:
        _active.emit(Event(WORK, kind, rows, calls, hidden, level))


@contextlib.contextmanager
def bulk(kind: str, rows: int, hidden: int, like: Optional[Tensor] = None) -> Iterator[None]:
    """A pass over ``rows`` (time steps x batch) at once, the block's work; ``like``: a
    tensor on the device it runs on (for timing on CUDA)."""
    if _active is None:
        yield
        return
    _sync(like)
    _active.emit(Event(PHASE, "mark"))  # the window before the pass is not the pass's
    yield
    _sync(like)
    _active.emit(Event(BULK, kind, rows, 1, hidden))


def message(kind: str, value: Optional[Tensor], reverse: Optional[bool] = None, peer=None) -> None:
    """A time group's exchange of ``value`` (items along its first dimension for "gather";
    the whole tensor as one item otherwise; None: a scalar). ``reverse`` None: in the order
    of the pass under way (the last :func:`phase`)."""
    if _active is None:
        return
    if value is None:
        items, nbytes = 1, 8
    elif kind == GATHER:
        items = value.shape[0]
        nbytes = value[0].numel() * value.element_size() if items else 0
    else:
        items, nbytes = 1, value.numel() * value.element_size()
    _active.emit(Event(MESSAGE, kind, items, 1, 0, 0, nbytes, reverse, peer))


def phase(kind: str, reverse: bool = False) -> None:
    """A solve begins: "forward" or "backward"; ``reverse``: its chunks run through the ranks
    in reversed order."""
    if _active is not None:
        _active.emit(Event(PHASE, kind, reverse=reverse))
