"""Recording the trace of a training step: one GRU stack's forward, a per-step loss and the
backward, at a given shape, solver and chunk length, on random weights or a checkpoint's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from .. import trace as tr
from ..layer.solve import step_kind
from ..module import GRU
from ..options import MGRIT, Budget, auto_cfactor

SOLVERS = ("serial", "auto", "mgrit", "budget", "torch")


def options(solver: str, cfactor: Optional[int]):
    """The ``solver=`` of a named solver: "mgrit" (defaults: to the tolerance), "budget"
    (``Budget()``: 2 forward / 1 adjoint cycles), "serial", "auto" (the default choice)."""
    if solver in ("serial", "auto"):
        return solver
    base = MGRIT() if cfactor is None else MGRIT(cfactor=cfactor)
    if solver == "mgrit":
        return base
    if solver == "budget":
        return base.replace(budget=Budget())
    raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")


def cfactor_for(steps: int, batch: int, hidden: int, device: str, ranks: int) -> int:
    """The chunk length ``cfactor="auto"`` gives ``ranks`` time-parallel ranks (with this
    process's kernels, as a module's call would)."""
    return auto_cfactor(steps, batch, hidden, device, MGRIT(), ranks, step_kind(None, device))


def training_step(
    steps: int,
    batch: int,
    input_size: int,
    hidden: int,
    solver: str = "torch",
    cfactor: Optional[int] = None,
    layers: int = 1,
    weights: Optional[dict] = None,
    inputs: Optional[torch.Tensor] = None,
    seed: int = 0,
    device: str = "cpu",
    time_group=None,
    cell: str = "gru",
) -> Callable[[], GRU]:
    """A function that runs one training step and returns the module (its ``last_stats``).

    ``weights``: a torch.nn.GRU state_dict (a checkpoint's layers) instead of random ones;
    ``inputs`` ``(steps, batch, input_size)`` instead of random ones; ``device``: where it
    runs; ``time_group``: this rank's slice of the same step (``cfactor`` an int), every rank
    building the same model and inputs. The loss is ``sum(y * w) + sum(h_n)`` with fixed
    random ``w``: every step's output and the end state carry gradient (over a time group,
    ``h_n`` on its last rank only, so that the ranks' losses add up to one process's).
    ``cell="lstm"``: an LSTM stack of the same sizes instead (random weights; its ``h_n`` is
    the final h)."""
    from ..lstm.module import LSTM

    if cell not in ("gru", "lstm"):
        raise ValueError(f"cell must be 'gru' or 'lstm', got {cell!r}")
    if cell == "lstm" and weights is not None:
        raise ValueError("weights= holds a torch.nn.GRU's state: not for cell='lstm'")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ref = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(input_size, hidden, layers)
    if weights is not None:
        ref.load_state_dict(weights)
    x = inputs if inputs is not None else torch.randn(steps, batch, input_size, generator=gen)
    w = torch.randn(steps, batch, hidden, generator=gen) / (steps * batch) ** 0.5
    ref, x, w = ref.to(device), x.to(device), w.to(device)
    ours = GRU if cell == "gru" else LSTM
    module = ref if solver == "torch" else ours.from_torch(ref, solver=options(solver, cfactor))
    with_end = True
    if time_group is not None:
        from ..distributed import scatter_time

        module.time_group = time_group
        x, w = scatter_time(x, time_group, cfactor), scatter_time(w, time_group, cfactor)
        with_end = time_group.rank == time_group.size - 1

    def step():
        module.zero_grad(set_to_none=True)
        xr = x.detach().requires_grad_()
        y, h_n = module(xr)
        h_n = h_n[0] if isinstance(h_n, tuple) else h_n  # an LSTM's (h, c)
        loss = (y * w).sum() + (h_n.sum() if with_end else 0.0)
        loss.backward()
        step.loss = float(loss.detach())
        return module

    step.inputs, step.weights = x, weights  # what it solves (a time group's: its slice)
    return step


def record_step(
    step: Callable[[], GRU], count_ops: bool = True, warm: bool = True, **meta
) -> tuple:
    """The trace of one call of ``step`` (``warm``: after one untraced call, which fills the
    work buffers as any later step finds them) and the module's stats."""
    if warm:
        step()
    with tr.record(count_ops=count_ops, **meta) as t:
        module = step()
    return t, getattr(module, "last_stats", None)


def from_run(run, steps: int, batch: int):
    """A ``mgrit-gru train`` run's GRU and inputs for a step of ``steps`` x ``batch``:
    ``(weights, inputs, input_size, hidden, layers)``; the weights as a torch.nn.GRU
    state_dict, the inputs ``(steps, batch, F)`` its training sequences joined end to end."""
    from pathlib import Path

    from ..app import train

    run = Path(run)
    cfg = train.read_config(run)
    if getattr(cfg, "model", "gru") != "gru":
        raise ValueError(
            f"{run} is a --model {cfg.model} run: the projection knows the GRU's steps only "
            "(traces and device models are the GRU's); project a GRU run, or give no "
            "--checkpoint for random weights"
        )
    state = train.load_checkpoint(run)["model"]
    weights = {k[len("rnn.") :]: v for k, v in state.items() if k.startswith("rnn.")}
    if not weights or any(k.endswith("_reverse") for k in weights):
        raise ValueError(f"{run} holds no one-directional GRU (bidirectional, or another model)")
    hidden = weights["weight_hh_l0"].shape[1]
    layers = sum(1 for k in weights if k.startswith("weight_hh_l"))
    x = train.load_data(cfg).x_train
    per = -(-steps // x.shape[1])
    if per * batch > x.shape[0]:
        raise ValueError(
            f"{run}'s data has {x.shape[0]} training sequences of {x.shape[1]} steps: too few "
            f"for batch {batch} x T {steps}"
        )
    seqs = x[: per * batch].reshape(batch, per * x.shape[1], x.shape[2])[:, :steps]
    return weights, seqs.transpose(0, 1).contiguous(), x.shape[2], hidden, layers
