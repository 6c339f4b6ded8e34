"""Time-parallel across processes: each rank of a torch.distributed group owns a contiguous
slice of time, on PyTorch's own engine (gloo on CPU, NCCL on GPU; launch with torchrun).

The algorithm is the single-process one: the finest level's chunks are divided among the ranks
(near-equal, contiguous, aligned to chunk boundaries, so any T works); relaxation is local; a
C-relaxation passes one boundary state to the next rank; the coarse-grid correction gathers the
C-point data (m times smaller than the fine level) so that every rank solves the coarse levels
identically. Residual histories therefore equal the single-process ones. The adjoint runs the
same way with the rank order reversed. Weight gradients are summed over the group.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from . import trace
from .core.cycle import LocalComm


def _import_group_capturers() -> None:
    """Import the torch modules that bind the default process group into their functions'
    default arguments (``group=group.WORLD``) while none exists. Imported after
    ``init_process_group`` (torch._dynamo imports them at a program's first optimizer), they
    keep the group alive: ``destroy_process_group`` cannot free it, and its gloo threads run on
    into the interpreter's exit, where they can abort the process."""
    for name in ("torch.distributed.nn", "torch.distributed._shard.sharded_tensor"):
        try:
            importlib.import_module(name)
        except Exception:  # a torch without them: nothing to hold the group
            pass


_import_group_capturers()


def chunk_spans(steps: int, ranks: int, cfactor: int) -> list[tuple[int, int]]:
    """Near-equal contiguous ranges ``[c0, c1)`` of the ``ceil(steps / cfactor)`` chunks."""
    n = -(-steps // cfactor)
    if n < ranks:
        raise ValueError(
            f"time-parallel: T={steps} with cfactor={cfactor} gives {n} chunks, fewer than the "
            f"{ranks} ranks; use a smaller cfactor or fewer ranks"
        )
    base, extra = divmod(n, ranks)
    bounds = [0]
    for p in range(ranks):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return list(zip(bounds[:-1], bounds[1:]))


def time_slices(steps: int, ranks: int, cfactor: int) -> list[tuple[int, int]]:
    """The time range ``[t0, t1)`` of each rank (chunk-aligned; the last may be shorter)."""
    return [
        (c0 * cfactor, min(c1 * cfactor, steps)) for c0, c1 in chunk_spans(steps, ranks, cfactor)
    ]


@dataclass
class TimeGroup:
    """The ranks that share one sequence in time. ``group`` None: the default group.

    Every rank calls the GRU with its own slice ``x[t0:t1]`` (see :func:`scatter_time`), and
    the same ``h0``; it gets its slice of the outputs and the global ``h_n``.

    ``coarse``: who solves the coarse levels of each V-cycle, from the gathered C-point data:
    ``"replicated"`` (every rank, identically; no message back) or ``"root"`` (the first rank
    in the solve's order, which then scatters each rank its C-points).

    When an exchange fails (a rank died, or hung past the process group's timeout), each
    surviving rank checks in on the group's rendezvous store and waits ``roll_call_s`` seconds
    for the others: the error names the ranks that did not answer.
    """

    group: Optional[dist.ProcessGroup] = None
    coarse: str = "replicated"
    roll_call_s: float = 5.0
    failures: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.coarse not in ("replicated", "root"):
            raise ValueError(
                f"TimeGroup: unknown coarse={self.coarse!r}; choose 'replicated' or 'root'"
            )

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def global_rank(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def roll_call(self) -> Optional[list[int]]:
        """The group ranks that do not check in within ``roll_call_s`` after a failure (the
        survivors of one failure share its number); None if the store is unreachable too."""
        self.failures += 1
        ranks = [self.global_rank(r) for r in range(self.size)]
        prefix = f"mgrit_gru/roll_call/{'-'.join(map(str, ranks))}/{self.failures}/"
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(prefix + str(ranks[self.rank]), "here")
            deadline = time.monotonic() + self.roll_call_s
            while True:
                missing = [r for r, g in enumerate(ranks) if not store.check([prefix + str(g)])]
                if not missing or time.monotonic() >= deadline:
                    return missing
                time.sleep(0.05)
        except TimeParallelError:  # stopped meanwhile (SIGTERM from torchrun): say that
            raise
        except (RuntimeError, ValueError, AttributeError):
            return None

    def failed(self, what: str, exc: Exception) -> TimeParallelError:
        """The error for a failed ``what``, naming the ranks that did not answer a roll call."""
        missing = self.roll_call()
        if missing is None:
            who = "the rendezvous store is unreachable too (its host died)"
        elif missing:
            who = (
                f"rank(s) {missing} did not answer a roll call within {self.roll_call_s:g} s: "
                "they died or are hanging"
            )
        else:
            who = "every rank answered a roll call (a rank's calls diverged from the others')"
        text = " ".join(str(exc).split())
        return TimeParallelError(f"time-parallel rank {self.rank}: {what} failed; {who} ({text})")


class TimeParallelError(RuntimeError):
    """An exchange between time-parallel ranks failed: a rank died, hung past the process
    group's timeout, or its calls diverged from the others'. The message names the ranks that
    did not answer a roll call; ``mgrit-gru`` prints it as one line and exits with 3."""


def _exchange(what: str):
    """A communication method: its wall time adds to ``TimeComm.seconds``; a failure (a dead
    or hung rank) becomes :meth:`TimeGroup.failed`'s error."""

    def wrap(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            except RuntimeError as exc:
                raise self.tg.failed(what, exc) from exc
            finally:
                TimeComm.seconds += time.perf_counter() - start

        return wrapper

    return wrap


@dataclass
class TimeContext:
    """One module call's view of the time split: global T, chunk spans, the communicators.
    Its scalar exchanges use tensors on ``device`` (the data's: NCCL needs CUDA tensors)."""

    group: TimeGroup
    steps: int
    spans: list[tuple[int, int]]
    cfactor: int
    device: Union[str, torch.device] = "cpu"

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def start(self) -> int:
        """The global time index of this rank's first step."""
        return self.spans[self.rank][0] * self.cfactor

    def comm(self, reverse: bool) -> TimeComm:
        return TimeComm(self.group, self.spans, reverse, self.device)

    @classmethod
    def for_slice(
        cls,
        group: TimeGroup,
        local_steps: int,
        cfactor: Union[int, Callable[[int], int]],
        config: str = "",
        params: Iterable[Tensor] = (),
        lengths: Optional[Tensor] = None,
        device: Union[str, torch.device] = "cpu",
    ) -> TimeContext:
        """Global T from every rank's slice length, checked against the chunk-aligned split
        for ``cfactor`` (an int, or a function of global T: every rank derives the same);
        the ranks' ``config`` text, parameters and sequence ``lengths`` must agree too (else a
        ValueError)."""
        params = list(params)
        lengths_crc = -1.0
        if lengths is not None:
            lengths_crc = float(zlib.crc32(lengths.to("cpu", torch.int64).numpy().tobytes()))
        mine = torch.tensor(
            [
                float(local_steps),
                float(zlib.crc32(config.encode())),
                sum(float(p.detach().double().sum()) for p in params),
                sum(float(p.detach().double().square().sum()) for p in params),
                lengths_crc,
            ],
            dtype=torch.float64,
            device=device,
        )
        table = [torch.empty_like(mine) for _ in range(group.size)]
        trace.message(trace.CHECK, mine)
        try:
            dist.all_gather(table, mine, group=group.group)
        except RuntimeError as exc:
            raise group.failed("the start-up check", exc) from exc
        table = [t.cpu() for t in table]
        same_model = (
            "every rank must build the same model (same seed or a broadcast of rank 0's state)"
        )
        same_options = (
            "every rank must build the same model with the same options and run the same kind "
            "of steps (kernels=, MGRIT_GRU_KERNELS, the compiled kernels available on every "
            "host: cfactor='auto' cuts chunks by the steps that run)"
        )
        checks = (
            ("options", 1, same_options),
            ("weights", 2, same_model),
            ("weights", 3, same_model),
            ("lengths", 4, "every rank passes the same global lengths= for its slice"),
        )
        for what, col, hint in checks:
            values = [float(t[col]) for t in table]
            differ = [r for r, v in enumerate(values) if v != values[0]]
            if differ:
                raise ValueError(
                    f"time-parallel: rank(s) {differ} hold other {what} than rank 0; {hint}"
                )
        counts = torch.tensor([int(t[0]) for t in table])
        steps = int(counts.sum())
        if callable(cfactor):
            cfactor = cfactor(steps)
        expected = time_slices(steps, group.size, cfactor)
        got = [int(c) for c in counts]
        if got != [t1 - t0 for t0, t1 in expected]:
            raise ValueError(
                f"time-parallel: the ranks' slice lengths {got} are not the chunk-aligned split "
                f"of T={steps} for cfactor={cfactor}: {expected}; use scatter_time()"
            )
        spans = chunk_spans(steps, group.size, cfactor)
        return cls(group, steps, spans, cfactor, device)


class TimeComm(LocalComm):
    """Level-0 chunk exchange over a TimeGroup, in forward or reversed rank order.

    ``TimeComm.seconds`` accumulates the wall time spent in its exchanges (for the benchmark's
    communication share; waiting for a slower neighbour counts as communication)."""

    seconds = 0.0

    def __init__(
        self,
        tg: TimeGroup,
        spans: list[tuple[int, int]],
        reverse: bool = False,
        device: Union[str, torch.device] = "cpu",
    ):
        self.tg, self.device, self.reverse = tg, device, reverse
        size = tg.size
        self.order = list(range(size))[::-1] if reverse else list(range(size))
        n = spans[-1][1]
        # positions in the (possibly reversed) chunk order
        self.spans = [(n - c1, n - c0) for c0, c1 in spans] if reverse else list(spans)
        self.pos = self.order.index(tg.rank)
        self.first = self.pos == 0
        self.counts = [self.spans[r][1] - self.spans[r][0] for r in self.order]

    def span(self, n_local: int) -> tuple[int, int]:
        return self.spans[self.tg.rank]

    def _peer(self, offset: int) -> Optional[int]:
        pos = self.pos + offset
        if 0 <= pos < len(self.order):
            return self.tg.global_rank(self.order[pos])
        return None

    @_exchange("the boundary exchange")
    def shift(self, uend: Tensor) -> Optional[Tensor]:
        nxt, prev = self._peer(1), self._peer(-1)
        trace.message(trace.SHIFT, uend, self.reverse, nxt)
        requests, received = [], None
        if nxt is not None:
            requests.append(dist.isend(uend.contiguous(), nxt, group=self.tg.group))
        if prev is not None:
            received = torch.empty_like(uend)
            requests.append(dist.irecv(received, prev, group=self.tg.group))
        for r in requests:
            r.wait()
        return received

    @_exchange("the C-point gather")
    def gather(self, local: Tensor) -> Tensor:
        width = max(self.counts)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.tg.size)]
        trace.message(trace.GATHER, padded, self.reverse)
        dist.all_gather(parts, padded.contiguous(), group=self.tg.group)
        return torch.cat([parts[r][:c] for r, c in zip(self.order, self.counts)])

    def solve_coarse(self, solve, n: int, like: Tensor) -> Tensor:
        if self.tg.coarse == "replicated":
            return super().solve_coarse(solve, n, like)
        full = solve() if self.first else None
        c0, c1 = self.spans[self.tg.rank]
        return self._scatter_coarse(full, like)[: c1 - c0 + 1]

    @_exchange("the coarse-solution scatter")
    def _scatter_coarse(self, full: Optional[Tensor], like: Tensor) -> Tensor:
        width = max(self.counts) + 1
        out = like.new_empty((width, *like.shape))
        pieces = None
        if full is not None:  # the root: each rank's C-points c0 .. c1, padded to one width
            pieces = [full.new_zeros(out.shape) for _ in range(self.tg.size)]
            for piece, (c0, c1) in zip(pieces, self.spans):
                piece[: c1 - c0 + 1] = full[c0 : c1 + 1]
        root = self.tg.global_rank(self.order[0])
        trace.message("scatter", out, self.reverse)
        dist.scatter(out, pieces, src=root, group=self.tg.group)
        return out

    @_exchange("a broadcast")
    def broadcast_from(self, value: Tensor, pos: int) -> Tensor:
        value = value.clone().contiguous()
        kind = trace.FIRST if pos == 0 else trace.LAST if pos == len(self.order) - 1 else "bcast"
        trace.message(kind, value, self.reverse)
        dist.broadcast(value, self.tg.global_rank(self.order[pos]), group=self.tg.group)
        return value

    def last(self, uend: Tensor) -> Tensor:
        return self.broadcast_from(uend, len(self.order) - 1)

    @_exchange("the residual reduction")
    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        trace.message(trace.MAX, None, self.reverse)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.tg.group)
        return float(t.item())

    @_exchange("the early exit's decision")
    def max_start(self, value: Tensor):
        """:meth:`max` of a scalar tensor begun without waiting (an asynchronous all-reduce):
        returns the function that waits for it and gives the maximum."""
        t = value.detach().reshape(1).to(self.device, torch.float64, copy=True)
        trace.message(trace.MAX_LAGGED, None, self.reverse)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.tg.group, async_op=True)
        return functools.partial(self._max_wait, work, t)

    @_exchange("the early exit's decision")
    def _max_wait(self, work, t: Tensor) -> float:
        work.wait()
        return float(t.item())

    @_exchange("the gradient reduction")
    def sum_(self, tensor: Tensor) -> Tensor:
        trace.message(trace.SUM, tensor, self.reverse)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.tg.group)
        return tensor

    @_exchange("receiving the start state")
    def recv_prev(self, like: Tensor) -> Optional[Tensor]:
        prev = self._peer(-1)
        trace.message(trace.RECV_PREV, like, self.reverse, prev)
        if prev is None:
            return None
        out = torch.empty_like(like)
        dist.recv(out, prev, group=self.tg.group)
        return out

    @_exchange("sending the end state")
    def send_next(self, value: Tensor) -> None:
        nxt = self._peer(1)
        trace.message(trace.SEND_NEXT, value, self.reverse, nxt)
        if nxt is not None:
            dist.send(value.contiguous(), nxt, group=self.tg.group)


def chunk_length(cfactor, steps: int, batch: int) -> int:
    """``cfactor`` as an int: itself, or for a :class:`mgrit_gru.GRU` with ``time_group=``
    the chunk length it uses for ``steps`` global time steps and ``batch`` sequences (its
    ``cfactor="auto"`` resolved from the global shape, as on every rank)."""
    if isinstance(cfactor, int):
        return cfactor
    return cfactor.time_cfactor(steps, batch)


def scatter_time(x: Tensor, tg: TimeGroup, cfactor, dim: int = 0) -> Tensor:
    """This rank's slice of a full sequence ``x`` (every rank holds x; no communication).
    ``cfactor``: the chunk length, or the :class:`mgrit_gru.GRU` that will solve the slices
    (its chunk length for ``x``'s shape: :func:`chunk_length`)."""
    cfactor = chunk_length(cfactor, x.shape[dim], _batch_of(x, dim))
    t0, t1 = time_slices(x.shape[dim], tg.size, cfactor)[tg.rank]
    return x.narrow(dim, t0, t1 - t0)


class _SumOverRanks(torch.autograd.Function):
    """A differentiable SUM all-reduce: every rank's sum depends on every rank's input, so
    the gradient is the SUM all-reduce of the sums' gradients (in place of the deprecated
    ``torch.distributed.nn.functional.all_reduce``)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, group: Optional[dist.ProcessGroup]) -> Tensor:
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def time_mean(
    y: Tensor, tg: TimeGroup, steps: int, cfactor: int, lengths: Optional[Tensor] = None
) -> Tensor:
    """The mean over all ranks' time steps of the outputs ``y`` ``(B, T_local, F)`` (batch
    first; this rank's slice of a sequence of ``steps``), over each sequence's own
    ``lengths`` if given: a local sum, then a differentiable all-reduce (every rank gets the
    mean and its slice the mean's full gradient)."""
    if lengths is None:
        total, count = y.sum(1), y.new_tensor(float(steps))
    else:
        valid = _valid_steps(y, tg, steps, cfactor, lengths).to(y.dtype)
        total, count = (y * valid).sum(1), lengths.to(y.device, y.dtype)[:, None]
    return _SumOverRanks.apply(total, tg.group) / count


def _valid_steps(y: Tensor, tg: TimeGroup, steps: int, cfactor: int, lengths: Tensor) -> Tensor:
    """``(B, T_local, 1)``: which of this rank's steps lie within each sequence's length."""
    t0, _ = time_slices(steps, tg.size, cfactor)[tg.rank]
    t = torch.arange(t0, t0 + y.shape[1], device=y.device)
    return (t[None, :] < lengths.to(y.device)[:, None]).unsqueeze(-1)


def time_max(
    y: Tensor, tg: TimeGroup, steps: int, cfactor: int, lengths: Optional[Tensor] = None
) -> Tensor:
    """The max over all ranks' time steps of the outputs ``y`` ``(B, T_local, F)`` (batch
    first), over each sequence's own ``lengths`` if given: every rank gets the max, and its
    gradient (summed over the ranks, as :func:`time_mean`'s) flows to the rank and step that
    hold it, as ``amax`` in one process (a value held by two ranks passes it to both)."""
    if lengths is not None:
        y = y.masked_fill(~_valid_steps(y, tg, steps, cfactor, lengths), float("-inf"))
    return _MaxOverRanks.apply(y.amax(1), tg.group)


class _MaxOverRanks(torch.autograd.Function):
    """The elementwise max of every rank's tensor. As for a sum over ranks (every rank's loss
    counts: the objective is their sum), the backward sums the incoming gradients over the
    ranks, and the rank that holds a maximum takes its gradient."""

    @staticmethod
    def forward(ctx, local: Tensor, group) -> Tensor:
        best = local.detach().clone()
        dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
        ctx.save_for_backward(local == best)
        ctx.group = group
        return best

    @staticmethod
    def backward(ctx, grad: Tensor):
        (here,) = ctx.saved_tensors
        total = grad.contiguous().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        return total * here, None


def _batch_of(x: Tensor, dim: int) -> int:
    """The batch size of a sequence tensor ``x`` whose time axis is ``dim`` (the other of
    the first two axes; 1 for an unbatched sequence)."""
    if x.dim() < 3:
        return 1
    return x.shape[0] if dim == 1 else x.shape[1]


def gather_time(y: Tensor, tg: TimeGroup, steps: int, cfactor, dim: int = 0) -> Tensor:
    """The full sequence from every rank's slice ``y`` (an all-gather; for checks and output).
    ``cfactor`` as for :func:`scatter_time`."""
    cfactor = chunk_length(cfactor, steps, _batch_of(y, dim))
    slices = time_slices(steps, tg.size, cfactor)
    width = max(t1 - t0 for t0, t1 in slices)
    y = y.movedim(dim, 0)
    padded = y.new_zeros((width, *y.shape[1:]))
    padded[: y.shape[0]] = y
    parts = [torch.empty_like(padded) for _ in range(tg.size)]
    dist.all_gather(parts, padded.contiguous(), group=tg.group)
    full = torch.cat([p[: t1 - t0] for p, (t0, t1) in zip(parts, slices)])
    return full.movedim(0, dim)


def data_time_mesh(data: int, time: int, device_type: str = "cpu"):
    """A 2-D ``torch.distributed.device_mesh`` ("data" x "time") over the initialised world.

    Returns ``(data_group, time_group)``: give ``time_group`` to ``GRU(time_group=...)`` and
    reduce gradients over ``data_group`` as for any data-parallel model (DDP on it, or an
    all-reduce); the GRU has already summed its parameters' gradients over time.
    """
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (data, time), mesh_dim_names=("data", "time"))
    return mesh.get_group("data"), TimeGroup(mesh.get_group("time"))


def init_time_parallel(timeout_s: float = 60.0, backend: Optional[str] = None) -> TimeGroup:
    """Initialise torch.distributed from torchrun's environment (gloo on CPU, NCCL on CUDA)
    with a timeout for hung or dead ranks, and return the whole world as one TimeGroup."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        atexit.register(_destroy_at_exit)
    return TimeGroup()


def _destroy_at_exit() -> None:
    """Destroy the process group that :func:`init_time_parallel` made, while the interpreter
    is whole: its backend's threads, left running into the interpreter's exit, can abort the
    process. No barrier: destroying is local, and a rank that exits on an error must not wait
    for the others."""
    if dist.is_initialized():
        dist.destroy_process_group()
