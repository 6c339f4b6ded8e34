"""Why a fixed cycle budget can train worse than the serial solve: per training step, the
budget's error in the states and in the gradient against the exact gradient of the same
weights.

    python benchmarks/budget_error.py --dataset npz:runs/budget-data/gunpoint.npz \
        [--pool max --batch-size 7 --lr 0.01 --epochs 40] [--every 5] [--json out.json]

The run trains as ``mgrit-gru train --recipe budget`` (the solver of ``--train-with``:
``budget``: the fixed 2/1 budget, ``serial``: the exact solve) and, every ``--every`` steps,
solves the same batch with the same weights twice: with the fixed 2/1 budget (its forward
states, the forward's and the adjoint's residuals after their cycles, its gradient g_b) and
with the exact serial solve (the reference gradient g). Printed per check: the relative
gradient error ||g_b - g|| / ||g||, its cosine, the same per parameter group (the GRU's,
the head's), the states' error (largest difference over the largest state), the logits'
error, the head's argmax agreement (max pooling reads one step per unit: the share of
(sequence, unit) pairs whose maximum sits at another step) and the network's memory (the
mean update gate z, the chunk factor: the product of z over 32 steps, as mean log10, and the
share of (sequence, chunk, unit) whose chunk factor is above 0.1: chunks that remember their
start). Results: docs/convergence.md, "Training through a cycle budget".
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F

from mgrit_gru import MGRIT, Budget
from mgrit_gru.app.config import TrainConfig, with_recipe
from mgrit_gru.app.train import Classifier, _batches, _lengths, load_data, make_optimizer


def grads(model, x, y, lengths, solver):
    model.zero_grad(set_to_none=True)
    with model.rnn.using(solver):
        logits = model(x, lengths)
        F.cross_entropy(logits, y).backward()
    stats = model.rnn.last_stats
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out, logits.detach(), stats


def flat(g, prefix=None):
    return torch.cat([v.flatten() for k, v in g.items() if prefix is None or k.startswith(prefix)])


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def cos(a, b):
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def memory(model, x):
    """The update gates of the one GRU layer: mean z, and mean log10 of z's product over
    chunks of 32 steps (how much of a chunk's start survives its end)."""
    rnn = model.rnn
    H = rnn.hidden_size
    w_ih, w_hh, b_ih, b_hh = rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0
    with torch.no_grad(), rnn.using("serial"):
        h, _ = rnn(x)
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        gi = x @ w_ih.T + b_ih
        gh = h_prev @ w_hh.T + b_hh
        z = torch.sigmoid(gi[..., H : 2 * H] + gh[..., H : 2 * H])
        T = z.shape[1] // 32 * 32
        logz = torch.log10(z[:, :T].clamp_min(1e-30)).reshape(z.shape[0], -1, 32, H).sum(2)
    return float(z.mean()), float(logz.mean()), float((logz > -1).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--pool", default="max")
    p.add_argument("--batch-size", type=int, default=7)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--schedule", default="constant")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--train-with", default="budget", choices=["budget", "serial"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(
        **with_recipe(
            dict(
                recipe="budget",
                dataset=a.dataset,
                pool=a.pool,
                batch_size=a.batch_size,
                lr=a.lr,
                schedule=a.schedule,
                epochs=a.epochs,
                seed=a.seed,
            )
        )
    )
    torch.manual_seed(cfg.seed)
    data = load_data(cfg)
    dtype = getattr(torch, a.dtype)
    model = Classifier(cfg, data.x_train.shape[-1], data.num_classes).to(dtype)
    opt = make_optimizer(cfg, model.parameters())
    budget = MGRIT(budget=Budget(2, 1))
    exact = MGRIT.serial()
    train_solver = budget if a.train_with == "budget" else exact
    rows, step = [], 0
    for epoch in range(cfg.epochs):
        order = torch.randperm(
            len(data.y_train), generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
        )
        for rows_ in _batches(len(order), cfg.batch_size, order):
            x = data.x_train[rows_].to(dtype)
            y = data.y_train[rows_]
            lengths = _lengths(data.len_train, rows_, "cpu")
            if step % a.every == 0:
                gb, lb, sb = grads(model, x, y, lengths, budget)
                ge, le, _ = grads(model, x, y, lengths, exact)
                with torch.no_grad(), model.rnn.using(budget):
                    hb, _ = model.rnn(x)
                with torch.no_grad(), model.rnn.using(exact):
                    he, _ = model.rnn(x)
                state_err = float((hb - he).abs().max() / he.abs().max())
                arg = float((hb.argmax(1) != he.argmax(1)).float().mean())
                zmean, logA, remembered = memory(model, x)
                row = dict(
                    epoch=epoch + 1,
                    step=step,
                    grad_rel=rel(flat(gb), flat(ge)),
                    grad_cos=cos(flat(gb), flat(ge)),
                    rnn_rel=rel(flat(gb, "rnn"), flat(ge, "rnn")),
                    head_rel=rel(flat(gb, "head"), flat(ge, "head")),
                    state_err=state_err,
                    logit_rel=rel(lb, le),
                    argmax_moved=arg,
                    fwd_res=sb.forward[0].residuals[-1],
                    bwd_res=sb.backward[0].residuals[-1] if sb.backward else math.nan,
                    z_mean=zmean,
                    log10_chunk_factor=logA,
                    chunks_remembering=remembered,
                )
                rows.append(row)
                print(
                    " ".join(
                        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()
                    ),
                    flush=True,
                )
            model.zero_grad(set_to_none=True)
            with model.rnn.using(train_solver):
                loss = F.cross_entropy(model(x, lengths), y)
            loss.backward()
            opt.step()
            step += 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
