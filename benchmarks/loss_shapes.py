"""The stopping tests on trained networks, per loss shape: cycles, gradient error, fallbacks.

    python benchmarks/loss_shapes.py [--batches 2] [--ranks 1 2] [--json PATH]
        [--cache runs/trained-models] [--summary JSON]

Checkpoints (made once by benchmarks/trained_models.py's recipes, cached in --cache): sMNIST
and ACSF1 trained on the last state (epochs 6/10 and 20/30), sMNIST trained on the mean and
on the max of its outputs (epoch 10) and ACSF1 on the mean (epoch 30). On each, for every loss
shape a user trains with:

- ``last``: the head on the final state;
- ``mean`` / ``max``: the head on the mean / max of the outputs over time;
- ``step``: a per-step loss (the head on every output, each step has the sequence's label,
  as in sequence labelling), averaged over steps and sequences;

in float32 and float64, in one process and on 2 time-parallel ranks (gloo, one thread each),
one training step per batch with the library's explicit ``MGRIT()`` (its defaults: tolerance
"auto", secant coarse correction, FCF, no cost guard, fall back at the cycle cap): forward and
adjoint cycles (the largest over the batches), solves converged to precision
(``SolveStats.at_floor``), fallbacks, and the relative error of the gradient (every GRU
parameter and the input) against the serial solve in the same dtype; beside it, torch.nn.GRU's
own error against the same serial solve: how much the loss itself amplifies rounding (a max
over time can pick another step for a difference of one rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trained_models as tm  # noqa: E402

from mgrit_gru import GRU, MGRIT  # noqa: E402

CHECKPOINTS = {  # recipe name -> epochs
    "smnist": (6, 10),
    "smnist-mean": (10,),
    "smnist-max": (10,),
    "acsf1": (20, 30),
    "acsf1-mean": (30,),
}
LOSSES = ("last", "mean", "max", "step")
DTYPES = (torch.float32, torch.float64)
HEADER = (
    f"{'checkpoint':<16} {'loss':<5} {'dtype':<8} {'ranks':>5} {'fwd':>4} {'bwd':>4} "
    f"{'at floor':>8} {'fb':>3} {'rel grad err':>12} {'torch err':>9}"
)


def loss_of(loss: str, head, y, h_last, labels, split=None):
    """The loss of one shape from the GRU's outputs ``y`` (B, T, H) and final state;
    ``split`` = (time group, global T, chunk length) where ``y`` is a rank's slice. Across
    ranks the objective is the sum of every rank's loss: one that every rank computes from
    global values (``h_n``, a pooled output) is divided by the group's size, as the training
    application does; the per-step loss is a sum of local parts."""
    share = 1.0 if split is None else split[0].size
    if loss == "last":
        return F.cross_entropy(head(h_last), labels) / share
    if loss == "step":  # every step has the sequence's label
        targets = labels[:, None].expand(-1, y.shape[1])
        per = F.cross_entropy(head(y).transpose(1, 2), targets, reduction="none")
        return per.mean() if split is None else per.sum() / (labels.shape[0] * split[1])
    if split is None:
        return F.cross_entropy(head(y.mean(1) if loss == "mean" else y.amax(1)), labels)
    from mgrit_gru.distributed import time_max, time_mean

    tg, steps, m = split
    reduce = time_mean if loss == "mean" else time_max
    pooled = reduce(y, tg, steps, m)
    return F.cross_entropy(head(pooled), labels) / share


def gradient(rnn, head, x, labels, loss: str, split=None):
    """One step's GRU parameter and input gradients, flattened, and the stats."""
    x = x.detach().clone().requires_grad_()
    rnn.zero_grad(set_to_none=True)
    y, h_n = rnn(x)
    loss_of(loss, head, y, h_n[-1], labels, split).backward()
    grads = [p.grad.flatten() for p in rnn.parameters()] + [x.grad.flatten()]
    return torch.cat(grads), getattr(rnn, "last_stats", None)


def cases(cache: Path, batches: int):
    """(label, GRU state, head state, batches, classes, input size) per checkpoint."""
    for name, epochs in CHECKPOINTS.items():
        tm.make_checkpoints(name, cache, torch.get_num_threads())
        for epoch in epochs:
            folder = cache / name / f"epoch-{epoch}"
            cfg, model, _, cached, _ = tm.load_cached(folder)
            rnn_state = {k[4:]: v for k, v in model.state_dict().items() if k.startswith("rnn.")}
            head = model.head
            yield (f"{name}/{epoch}", rnn_state, head, cached[:batches], cfg)


def run_case(label, rnn_state, head, batches, cfg, loss, dtype, tg=None):
    """One row: cycles, floor counts, fallbacks and the gradient error (max over batches)."""
    features = batches[0][0].shape[-1]
    serial = GRU(features, cfg.hidden, batch_first=True, solver="serial").to(dtype)
    serial.load_state_dict(rnn_state)
    ours = GRU(features, cfg.hidden, batch_first=True, solver=MGRIT(), time_group=tg).to(dtype)
    ours.load_state_dict(rnn_state)
    torch_gru = serial.to_torch()  # an implementation of its own: the loss's own sensitivity
    head = head.to(dtype)
    fwd = bwd = floor = fallbacks = 0
    err = torch_err = 0.0
    for x, labels in batches:
        x = x.to(dtype)
        ref, _ = gradient(serial, head, x, labels, loss)
        other, _ = gradient(torch_gru, head, x, labels, loss)
        torch_err = max(torch_err, ((other - ref).norm() / ref.norm()).item())
        if tg is None:
            got, stats = gradient(ours, head, x, labels, loss)
        else:
            from mgrit_gru.distributed import gather_time, scatter_time

            m = ours.time_cfactor(x.shape[1], x.shape[0])
            local = scatter_time(x, tg, m, dim=1)
            got, stats = gradient(ours, head, local, labels, loss, (tg, x.shape[1], m))
            n_par = sum(p.numel() for p in ours.parameters())
            dx = got[n_par:].view_as(local)
            full_dx = gather_time(dx, tg, x.shape[1], m, dim=1)
            got = torch.cat([got[:n_par], full_dx.flatten()])
        err = max(err, ((got - ref).norm() / ref.norm()).item())
        fwd = max(fwd, stats.forward_iterations)
        bwd = max(bwd, stats.backward_iterations)
        floor += sum(getattr(s, "at_floor", False) for s in stats.solves)  # older checkouts: none
        fallbacks += sum(s.fell_back for s in stats.solves)
    return {
        "checkpoint": label,
        "loss": loss,
        "dtype": str(dtype).split(".")[-1],
        "ranks": 1 if tg is None else tg.size,
        "fwd_cycles": fwd,
        "bwd_cycles": bwd,
        "at_floor": floor,
        "solves": 2 * len(batches),
        "fallbacks": fallbacks,
        "grad_err": err,
        "torch_err": torch_err,
    }


def row_text(r: dict) -> str:
    return (
        f"{r['checkpoint']:<16} {r['loss']:<5} {r['dtype']:<8} {r['ranks']:>5} "
        f"{r['fwd_cycles']:>4} {r['bwd_cycles']:>4} {r['at_floor']:>4}/{r['solves']:<3} "
        f"{r['fallbacks']:>3} {r['grad_err']:>12.1e} {r['torch_err']:>9.1e}"
    )


def all_rows(cache: Path, batches: int, tg=None, log=print) -> list[dict]:
    rows = []
    for label, rnn_state, head, data, cfg in cases(cache, batches):
        for loss in LOSSES:
            for dtype in DTYPES:
                row = run_case(label, rnn_state, head, data, cfg, loss, dtype, tg)
                rows.append(row)
                log(row_text(row))
    return rows


def _worker(rank: int, size: int, port: int, cache: str, batches: int, out: str) -> None:
    from mgrit_gru.distributed import TimeGroup

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=300))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    try:
        log = print if rank == 0 else (lambda *a: None)
        rows = all_rows(Path(cache), batches, TimeGroup(), log)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def summarise(rows: list[dict]) -> str:
    """The table of docs/convergence.md: per loss, dtype and ranks, over every checkpoint: the
    largest
    forward and adjoint cycles, the largest adjoint-minus-forward cycles, solves converged to
    precision, fallbacks, and the largest gradient error."""
    out = [
        "| loss | dtype | ranks | fwd cycles | bwd cycles | bwd - fwd (max) | at floor | "
        "fallbacks | rel. gradient error (max) | torch.nn.GRU's (max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["loss"], r["dtype"], r["ranks"]) for r in rows}, key=str)
    for loss, dtype, ranks in keys:
        group = [r for r in rows if (r["loss"], r["dtype"], r["ranks"]) == (loss, dtype, ranks)]
        fwd = [r["fwd_cycles"] for r in group]
        bwd = [r["bwd_cycles"] for r in group]
        out.append(
            f"| {loss} | {dtype} | {ranks} | {min(fwd)}-{max(fwd)} | {min(bwd)}-{max(bwd)} | "
            f"{max(b - f for b, f in zip(bwd, fwd)):+d} | "
            f"{sum(r['at_floor'] for r in group)}/{sum(r['solves'] for r in group)} | "
            f"{sum(r['fallbacks'] for r in group)} | "
            f"{max(r['grad_err'] for r in group):.1e} | "
            f"{max(r.get('torch_err', float('nan')) for r in group):.1e} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="runs/trained-models", help="checkpoint folder")
    p.add_argument("--batches", type=int, default=2, help="training batches per checkpoint")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="1 and/or 2")
    p.add_argument("--json", help="write all rows as JSON")
    p.add_argument(
        "--summary",
        metavar="JSON",
        help="only print the table of docs/convergence.md from a --json",
    )
    args = p.parse_args()
    if args.summary:
        print(summarise(json.loads(Path(args.summary).read_text())))
        return
    warnings.simplefilter("ignore")  # fallbacks are counted in the table
    torch.set_num_threads(1)
    print(f"loss_shapes: MGRIT() defaults, batches={args.batches}, torch {torch.__version__}")
    print(HEADER)
    rows = []
    if 1 in args.ranks:
        rows += all_rows(Path(args.cache), args.batches)
    if 2 in args.ranks:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = Path(args.cache) / "loss_shapes_ranks.json"
        mp.spawn(_worker, args=(2, port, args.cache, args.batches, str(out)), nprocs=2)
        rows += json.loads(out.read_text())
    print()
    print(summarise(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
