"""MGRIT settings on a *trained* model: time and gradient error of one training step.

    python benchmarks/trained_settings.py RUN_DIR [--batches 3] [--threads 2]

Loads the run's checkpoint, takes batches of its training data and, side by side in one process,
times a forward+backward step with the serial solver and with several MGRIT settings, reporting
forward/backward iterations, fallbacks and the relative gradient error against serial.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from mgrit_gru import MGRIT
from mgrit_gru.app.train import Classifier, load_checkpoint, load_data, read_config

SETTINGS = {
    "mgrit default": MGRIT(),
    "early_exit=False": MGRIT(early_exit=False),
    "keep_gates=False": MGRIT(keep_gates=False),
    "cfactor=auto": MGRIT(cfactor="auto"),
    "cfactor=64": MGRIT(cfactor=64),
    "backward_tol=1e-3": MGRIT(backward_tol=1e-3),
    "backward_tol=1e-2": MGRIT(backward_tol=1e-2),
    "backward_max_iters=2": MGRIT(backward_max_iters=2),
    "cfactor=16": MGRIT(cfactor=16),
    "cfactor=16,backward_tol=1e-2": MGRIT(cfactor=16, backward_tol=1e-2),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    cfg = read_config(__import__("pathlib").Path(args.run))
    state = load_checkpoint(__import__("pathlib").Path(args.run))
    data = load_data(cfg)
    model = Classifier(cfg.replace(solver="serial"), data.features, data.num_classes)
    model.load_state_dict(state["model"])
    rows = [torch.arange(i * cfg.batch_size, (i + 1) * cfg.batch_size) for i in range(args.batches)]

    def step(solver):
        model.rnn.solver = solver if solver != "serial" else MGRIT.serial()
        grads, times, its = [], [], []
        for r in rows:
            model.zero_grad()
            start = time.perf_counter()
            loss = F.cross_entropy(model(data.x_train[r]), data.y_train[r])
            loss.backward()
            times.append(time.perf_counter() - start)
            grads.append(torch.cat([q.grad.flatten() for q in model.parameters()]))
            s = model.rnn.last_stats
            its.append((s.forward_iterations, s.backward_iterations, s.fell_back))
        return grads, statistics.median(times), its

    ref, t_ref, _ = step("serial")
    step("serial")
    print(
        f"run {args.run} (epoch {state['epoch']}), batch {cfg.batch_size}, "
        f"threads {args.threads}; serial step {1e3 * t_ref:.0f} ms"
    )
    print(f"{'setting':<32} {'ms':>6} {'x serial':>8} {'rel grad err':>12}  fwd/bwd it (fallback)")
    for name, opts in SETTINGS.items():
        g, t, its = step(opts)
        err = max(((a - b).norm() / b.norm()).item() for a, b in zip(g, ref))
        print(f"{name:<32} {1e3 * t:>6.0f} {t_ref / t:>8.2f} {err:>12.1e}  {its}")


if __name__ == "__main__":
    main()
