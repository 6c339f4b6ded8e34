"""The speed a run got: its training step against torch's (torch.nn.GRU or torch.nn.LSTM) and
the serial solver's, on the same batches with the same (final) weights, timed interleaved in
one process."""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F

from ..layer.module import Recurrent
from ..options import MGRIT
from .config import torch_module_name


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 thread", "2 threads"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _step(model, x, lengths, y) -> None:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x, lengths), y).backward()


def speed_check(cfg, model, data, batches: int = 8, repeats: int = 3) -> dict:
    """Median time of one training step (forward and backward of the loss; no optimiser step)
    of ``model`` as trained (its solver and what it has learnt, on a copy), of the same
    weights with the serial solver and with torch's module, over the first ``batches``
    training batches, interleaved ``repeats`` times. Returns the times and ratios."""
    from .train import Classifier, _lengths

    device = next(model.parameters()).device
    state = model.state_dict()
    models = {cfg.solver: copy.deepcopy(model)}
    for name in ("torch", "serial"):
        if name != cfg.solver and not (name == "torch" and cfg.cell != "classic"):
            other = Classifier(cfg.replace(solver=name), data.features, data.num_classes)
            other.load_state_dict(state)
            models[name] = other.to(device)
    if isinstance(models.get("serial"), torch.nn.Module) and cfg.solver != "serial":
        models["serial"].rnn.solver = MGRIT.serial()
    count = min(batches, len(data.y_train) // cfg.batch_size)
    rows = [torch.arange(i * cfg.batch_size, (i + 1) * cfg.batch_size) for i in range(count)]
    work = [
        (
            data.x_train[r].to(device),
            _lengths(data.len_train, r, device),
            data.y_train[r].to(device),
        )
        for r in rows
    ]
    for m in models.values():
        m.train()
        _step(m, *work[0])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in models}
    share = [0, 0]
    kernels: set[str] = set()  # which kernels ran the library's solves (SolveStats.kernels)
    for _ in range(repeats):
        for xb, lengths, yb in work:
            for name, m in models.items():
                start = time.perf_counter()
                _step(m, xb, lengths, yb)
                times[name].append(time.perf_counter() - start)
                stats = getattr(m.rnn, "last_stats", None)
                if name == cfg.solver and isinstance(m.rnn, Recurrent) and stats is not None:
                    kernels |= {s.kernels for s in stats.solves}
                    done, total = stats.mgrit_share
                    share[0] += done
                    share[1] += total
    why = None
    if (
        cfg.solver == "auto"
        and share[1]
        and share[0] < share[1]
        and isinstance(model.rnn, Recurrent)
    ):
        why = _why_serial(models[cfg.solver], work[0])
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    own = ms[cfg.solver]
    result = {
        "solver": cfg.solver,
        "model": cfg.model,
        "batches": count,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "step_ms": ms,
        "x_torch": ms["torch"] / own if "torch" in ms else None,
        "x_serial": ms["serial"] / own if "serial" in ms else None,
        "mgrit_share": share[0] / share[1] if share[1] else None,
        "why": why,
        "kernels": sorted(kernels),
    }
    return result


def _why_serial(model, batch) -> str:
    """Why the automatic choice solved (some of) the calls serially, in words: what one
    training step of these weights costs MGRIT (an explicit ``MGRIT()`` on one batch: its
    cycles, and a cycle's modelled cost against a serial sweep's)."""
    probe = copy.deepcopy(model)
    probe.rnn.solver = MGRIT()
    _step(probe, *batch)
    stats = probe.rnn.last_stats
    solves = [s for s in stats.solves if s.iterations > 0 and s.serial_cost > 0]
    cycles = f"{stats.forward_iterations} forward / {stats.backward_iterations} adjoint cycles"
    if not solves:
        return f"these weights need {cycles} here"
    per_cycle = max(s.cost / (s.iterations + 1) / s.serial_cost for s in solves)
    rows = batch[0].shape[0]
    return (
        f"these weights need {cycles} here, and one cycle at batch {rows} costs about "
        f"{per_cycle:.1f} serial sweeps on this machine's cost model"
    )


def speed_line(result: dict) -> str:
    """One line for the end of a run."""
    if "skipped" in result:
        return f"speed: check skipped ({result['skipped']})"
    ms, own = result["step_ms"], result["solver"]
    parts = [f"{own} {ms[own]:.1f} ms"]
    torch_name = torch_module_name(result.get("model", "gru"))
    for name, label in (("torch", torch_name), ("serial", "serial")):
        if name in ms and name != own:
            parts.append(f"{label} {ms[name]:.1f} ms ({ms[name] / ms[own]:.2f}x)")
    kernels = result.get("kernels")
    ran = f", {'/'.join(kernels)} kernels" if kernels else ""
    text = (
        f"speed: training step ({result['batches']} batches, final weights, "
        f"{count(result['threads'], 'thread')}{ran}): " + " | ".join(parts)
    )
    if result.get("mgrit_share") is not None:
        text += f"; MGRIT gave {100 * result['mgrit_share']:.0f}% of the solves"
    if result.get("why"):
        text += f" (the rest were solved serially: {result['why']})"
    return text
