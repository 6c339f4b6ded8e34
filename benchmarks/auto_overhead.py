"""What solver="auto" costs in real training where MGRIT does not pay: the main job's model
trained twice from the same weights, serial and auto, their steps interleaved one by one.

    python benchmarks/auto_overhead.py [--steps 200] [--dataset smnist]

Prints the median and mean step time of the serial run, of auto's steps that ran serially
(skipped MGRIT) and of those that tried MGRIT, and the totals (one thread).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mgrit_gru.app.config import TrainConfig
from mgrit_gru.app.train import Classifier, load_data, make_optimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="training steps per solver")
    p.add_argument("--dataset", default="smnist", help="a built-in data set (default smnist)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(dataset=args.dataset, threads=1)
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    models = {
        s: Classifier(cfg.replace(solver=s), data.features, data.num_classes)
        for s in ("serial", "auto")
    }
    models["auto"].load_state_dict(models["serial"].state_dict())
    optimizers = {s: make_optimizer(cfg, m.parameters()) for s, m in models.items()}
    times: dict[str, list[float]] = {"serial": [], "auto, serial": [], "auto, MGRIT tried": []}
    B, n = cfg.batch_size, len(data.x_train)
    order = torch.randperm(n)
    for i in range(args.steps):
        start = (i * B) % (n - B + 1)
        rows = order[start : start + B]
        x, y = data.x_train[rows], data.y_train[rows]
        for solver in ("serial", "auto") if i % 2 == 0 else ("auto", "serial"):
            model, opt = models[solver], optimizers[solver]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            dt = time.perf_counter() - t0
            if solver == "serial":
                times["serial"].append(dt)
            else:
                tried = any(not s.skipped for s in model.rnn.last_stats.solves)
                times["auto, MGRIT tried" if tried else "auto, serial"].append(dt)
    print(f"auto_overhead: {args.dataset}, {args.steps} steps each, batch {B}, one thread")
    for name, values in times.items():
        if values:
            median, mean = 1e3 * statistics.median(values), 1e3 * statistics.mean(values)
            print(f"  {name:<18} {len(values):>4} steps  median {median:6.1f}  mean {mean:6.1f} ms")
    serial = sum(times["serial"])
    auto = sum(times["auto, serial"]) + sum(times["auto, MGRIT tried"])
    print(f"  total: serial {serial:.2f} s, auto {auto:.2f} s (auto / serial {auto / serial:.3f})")


if __name__ == "__main__":
    main()
