"""A trace at ``P`` ranks, and its replay on a modelled machine.

:func:`expand` turns one process's trace (recorded with the chunk length that ``P`` ranks
use) into every rank's: a rank runs the same sequence of events (the V-cycle decides as one
for all ranks), its level-0 steps over its own chunks, its passes over its own time slice,
the coarse levels whole; the exchanges become messages to its neighbours or collectives.

:func:`replay` runs the ranks' traces against a :class:`~mgrit_gru.projection.machines.Machine`:
each rank keeps a clock; work advances it by its modelled cost; a point-to-point message
arrives ``latency + bytes / bandwidth`` after its sender reached it; a collective starts when
the last rank reaches it and costs the link's steps (``log2(P)`` for a tree, ``P - 1`` for
a ring) in latencies plus its bytes over the link (an all-reduce twice). The step time is
the largest clock; the critical path split is that of the rank that finishes last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .. import trace as tr
from ..distributed import chunk_spans, time_slices
from ..trace import Event, Trace
from .machines import Machine, work_category

CATEGORIES = ("fine", "coarse", "serial", "bulk", "other", "wait", "comm")


def expand(trace: Trace, ranks: int) -> list[list[Event]]:
    """Every rank's events at ``ranks`` time-parallel ranks, from one process's ``trace``
    (its ``meta`` gives ``steps`` T and ``cfactor`` m). Ops and times are kept as recorded."""
    steps, m = int(trace.meta["steps"]), int(trace.meta["cfactor"])
    spans = chunk_spans(steps, ranks, m)
    slices = time_slices(steps, ranks, m)
    n = spans[-1][1]
    counts = [c1 - c0 for c0, c1 in spans]
    lengths = [t1 - t0 for t0, t1 in slices]
    out: list[list[Event]] = [[] for _ in range(ranks)]
    reverse = False  # the current pass's order through the ranks
    events = trace.events if ranks == 1 else _unfused(trace.events, steps)
    for e in events:
        if e.what == tr.PHASE and e.kind in ("forward", "backward"):
            reverse = e.reverse
        rev = reverse if e.reverse is None else e.reverse
        order = list(range(ranks))[::-1] if rev else list(range(ranks))
        for r in range(ranks):
            out[r].append(_for_rank(e, r, ranks, n, counts[r], steps, lengths[r], counts, order))
    return out


def _unfused(events: list[Event], steps: int) -> list[Event]:
    """The events with each serial forward by torch's fused loop (one process only) as a
    time group runs it: its input gates first (a pass over the slice), then the library's own
    steps through the ranks in turn (compiled sweeps where the trace's steps are)."""
    compiled = any(e.what == tr.WORK and e.kind.startswith("sweep") for e in events)
    serial = "sweep" if compiled else "step"
    out: list[Event] = []
    for k, e in enumerate(events):
        nxt = events[k + 1] if k + 1 < len(events) else None
        fused = nxt is not None and nxt.what == tr.WORK and nxt.kind == "fused"
        if e.what == tr.MESSAGE and e.kind == tr.RECV_PREV and fused:
            out.append(Event(tr.BULK, "gates", nxt.rows * steps, 1, nxt.hidden))
        out.append(replace(e, kind=serial) if e.what == tr.WORK and e.kind == "fused" else e)
    return out


def _for_rank(e: Event, r, ranks, n, n_r, steps, t_r, counts, order) -> Event:
    if e.what == tr.WORK and e.level == 0:
        if e.rows % n:
            raise ValueError(f"trace: level-0 {e.kind} over {e.rows} rows is not per chunk ({n})")
        return replace(e, rows=e.rows // n * n_r)
    if e.what == tr.WORK and e.level == tr.SERIAL:
        return replace(e, calls=e.calls * t_r // steps)
    if e.what == tr.BULK:
        if e.rows % steps:
            raise ValueError(f"trace: {e.kind} over {e.rows} rows is not per step ({steps})")
        return replace(e, rows=e.rows // steps * t_r)
    if e.what != tr.MESSAGE:
        return e
    pos = order.index(r)
    nxt = order[pos + 1] if pos + 1 < ranks else None
    prev = order[pos - 1] if pos > 0 else None
    if e.kind in (tr.SHIFT, tr.SEND_NEXT):
        return replace(e, peer=nxt)
    if e.kind == tr.RECV_PREV:
        return replace(e, peer=prev)
    if e.kind == tr.GATHER:
        return replace(e, rows=max(counts))
    if e.kind in tr.COLLECTIVES:
        return e
    raise ValueError(f"trace: no model for a {e.kind!r} message")


def measured_split(events: list[Event]) -> dict:
    """Where a timed trace's seconds went (a real rank's own clock), in :data:`CATEGORIES`:
    steps by level ("fine" level 0, "serial" a serial sweep, "coarse" the coarser levels),
    "bulk" the passes over the slice, "comm" the messages and collectives (a receive's window
    holds its wait: a rank cannot tell waiting from transfer), "other" the rest."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for e in events:
        if e.what == tr.WORK:
            cat = work_category(e)
        else:
            cat = {tr.BULK: "bulk", tr.MESSAGE: "comm"}.get(e.what, "other")
        out[cat] += e.seconds
    return out


def by_event(events: list[Event]) -> list[tuple]:
    """``[(what, kind, level, count, ms)]`` of a timed trace, the longest first: an event's
    window is the time since the one before it (a message's holds the host's work before it,
    and on a rank its wait: an exit check's comparison, a residual's, a peer still busy)."""
    agg: dict = {}
    for e in events:
        key = (e.what, e.kind, e.level)
        n, sec = agg.get(key, (0, 0.0))
        agg[key] = (n + 1, sec + e.seconds)
    rows = [(*k, n, round(1e3 * sec, 2)) for k, (n, sec) in agg.items()]
    return sorted(rows, key=lambda r: -r[4])


def comparable(events: list[Event]) -> list[tuple]:
    """What must agree between a real rank's trace and its expansion: the work (kind, level,
    rows, calls) and the messages (kind, items, bytes, peer), without markers, ops or times."""
    keep = []
    for e in events:
        if e.what == tr.PHASE:
            continue
        if e.what == tr.MESSAGE:
            peer = e.peer if e.kind in (tr.SHIFT, tr.SEND_NEXT, tr.RECV_PREV) else None
            keep.append((e.what, e.kind, e.rows, e.nbytes, peer))
        else:
            keep.append((e.what, e.kind, e.level, e.rows, e.calls))
    return keep


@dataclass
class Replay:
    """The predicted step: ``seconds`` (the last rank's clock), ``split`` (that rank's time
    per category, seconds: fine = level-0 steps, coarse = coarser levels, serial = serial
    sweeps, bulk = passes over the slice, other = operators between steps, wait = idle
    until a neighbour or the last rank of a collective arrives, comm = the messages),
    ``messages`` and ``bytes`` sent by that rank."""

    seconds: float
    split: dict = field(default_factory=dict)
    messages: int = 0
    bytes: int = 0

    def describe(self) -> str:
        parts = [
            f"{k} {100 * v / self.seconds:.0f}%"
            for k, v in self.split.items()
            if self.seconds > 0 and v > 0.005 * self.seconds
        ]
        return ", ".join(parts)


def replay(ranks_events: list[list[Event]], machine: Machine) -> Replay:
    """The predicted time of the traced step on ``machine`` (see the module's docstring)."""
    P = len(ranks_events)
    if len({len(ev) for ev in ranks_events}) != 1:
        raise ValueError("replay: the ranks' traces differ in length (not one algorithm)")
    clock = [0.0] * P
    split = [dict.fromkeys(CATEGORIES, 0.0) for _ in range(P)]
    sent = [[0, 0] for _ in range(P)]
    events = list(zip(*ranks_events))
    i = 0
    while i < len(events):
        row = events[i]
        e0 = row[0]
        if e0.what == tr.MESSAGE and e0.kind == tr.RECV_PREV and P > 1:
            i = _pipeline(events, i, clock, split, sent, machine)
            continue
        for r, e in enumerate(row):
            cat, cost = machine.cost(e)
            clock[r] += cost
            split[r][cat] += cost
        if e0.what == tr.MESSAGE and P > 1:
            _exchange(row, clock, split, sent, machine)
        i += 1
    last = max(range(P), key=clock.__getitem__)
    return Replay(clock[last], split[last], sent[last][0], sent[last][1])


def _exchange(row, clock, split, sent, machine: Machine) -> None:
    P = len(row)
    e0 = row[0]
    size = e0.rows * e0.nbytes
    link = machine.link
    if e0.kind == tr.SHIFT:  # every rank sends on and receives from its predecessor at once
        before = list(clock)
        transfer = link.latency_s + size / link.bandwidth
        for r, e in enumerate(row):
            prev = _sender(row, r)
            own = transfer if e.peer is not None or prev is not None else 0.0
            arrival = before[r] if prev is None else before[prev] + transfer
            done = max(before[r] + own, arrival)
            split[r]["comm"] += own
            split[r]["wait"] += done - before[r] - own
            clock[r] = done
            if e.peer is not None:
                sent[r][0] += 1
                sent[r][1] += size
        return
    if e0.kind == tr.MAX_LAGGED:  # overlapped with the sweep that follows: no rank waits for
        # it (an approximation: a rank more than a check's steps behind would hold the others)
        for r in range(P):
            sent[r][0] += 1
            sent[r][1] += size
        return
    hops = link.steps(P)
    if e0.kind == tr.GATHER or e0.kind == tr.CHECK:  # every rank ends with P pieces
        cost = hops * link.latency_s + (P - 1) * size / link.bandwidth
    elif e0.kind in (tr.SUM, tr.MAX):  # all-reduce: reduce-scatter + all-gather
        cost = 2 * hops * link.latency_s + 2 * size * (P - 1) / P / link.bandwidth
    else:  # broadcast (first, last)
        cost = math.ceil(math.log2(P)) * (link.latency_s + size / link.bandwidth)
    start = max(clock)
    for r in range(P):
        split[r]["wait"] += start - clock[r]
        split[r]["comm"] += cost
        clock[r] = start + cost
        sent[r][0] += 1
        sent[r][1] += size


def _sender(row, r: int):
    """The rank whose SHIFT goes to rank ``r`` in this row, or None."""
    for q, e in enumerate(row):
        if e.peer == r:
            return q
    return None


def _pipeline(events, i, clock, split, sent, machine: Machine) -> int:
    """A serial solve across the ranks: each receives the previous rank's end state, steps
    through its slice, sends its end state on (events i .. the matching SEND_NEXT)."""
    end = i + 1
    while events[end][0].kind != tr.SEND_NEXT:
        end += 1
    P = len(events[i])
    order = sorted(range(P), key=lambda r: _position(events[i], r))
    link = machine.link
    size = events[i][0].rows * events[i][0].nbytes
    done = {}
    for r in order:
        prev = events[i][r].peer
        start = clock[r]
        if prev is not None:
            arrival = done[prev] + link.latency_s + size / link.bandwidth
            split[r]["wait"] += max(0.0, arrival - start)
            start = max(start, arrival)
        for k in range(i, end + 1):
            cat, cost = machine.cost(events[k][r])
            start += cost
            split[r][cat] += cost
        clock[r] = start
        done[r] = start
        if events[end][r].peer is not None:
            sent[r][0] += 1
            sent[r][1] += size
    return end + 1


def _position(row, r: int) -> int:
    """How many ranks come before ``r`` in a pipeline (following RECV_PREV's peers)."""
    pos, peer = 0, row[r].peer
    while peer is not None:
        pos += 1
        peer = row[peer].peer
    return pos
