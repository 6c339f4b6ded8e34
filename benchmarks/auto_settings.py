"""Grid search of cfactor x levels against MGRIT(cfactor="auto", levels="auto").

    python benchmarks/auto_settings.py [--T 1024 4096 16384 65536] [--batch 4] [--hidden 64]
                                       [--threads 1] [--repeats 3] [--zbias 0]

For each T, times one training step (forward + backward) of every setting, interleaved repeat by
repeat in one process, and prints the grid, the best setting, the automatic choice and its time
relative to the best (the issue's target: within 20%). Settings that do not converge to the
forward accuracy bound (max |y - y_serial| <= 1e-4) are marked and not eligible as "best".
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from mgrit_gru import GRU, MGRIT
from mgrit_gru.bench import problem
from mgrit_gru.layer.solve import step_kind

CFACTORS = (8, 16, 32, 64, 128)
LEVELS = (2, 3, 4)


def step(module, x, w_y, w_h):
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    y, hn = module(x)
    ((y * w_y).sum() + (hn * w_h).sum()).backward()
    return y.detach()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--zbias", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(
        f"auto_settings: B={args.batch} input={args.input} hidden={args.hidden} float32 "
        f"threads={torch.get_num_threads()} repeats={args.repeats} zbias={args.zbias} "
        f"torch {torch.__version__}"
    )
    for T in args.T:
        ref, x, w_y, w_h = problem(T, args.batch, args.input, args.hidden, zbias=args.zbias)
        serial = GRU.from_torch(ref, solver="serial")
        y_ref = step(serial, x, w_y, w_h)
        auto = MGRIT(cfactor="auto", levels="auto")
        kind = step_kind(None, x.device.type)  # the module's rule for the steps it runs
        chosen = auto.resolve(T, args.batch, args.hidden, x.device.type, kind=kind)
        rows = {"serial": (serial, True)}
        settings = {f"auto -> cfactor={chosen.cfactor},levels={chosen.levels}": auto}
        for m in CFACTORS:
            for levels in LEVELS:
                if -(-T // m ** (levels - 1)) >= 2:  # the coarsest level has >= 2 steps
                    settings[f"cfactor={m},levels={levels}"] = MGRIT(cfactor=m, levels=levels)
        for name, opts in settings.items():
            module = GRU.from_torch(ref, solver=opts)
            y = step(module, x, w_y, w_h)  # warm-up, accuracy
            stats = module.last_stats
            ok = (y - y_ref).abs().max().item() <= 1e-4 and not stats.fell_back
            rows[name] = (module, ok)
        times = {name: [] for name in rows}
        for _ in range(args.repeats):
            for name, (module, _ok) in rows.items():
                start = time.perf_counter()
                step(module, x, w_y, w_h)
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) for name, t in times.items()}
        eligible = {n: t for n, t in med.items() if rows[n][1] and not n.startswith("auto")}
        eligible.pop("serial", None)
        best = min(eligible, key=eligible.get)
        auto_name = next(n for n in med if n.startswith("auto"))
        print(f"\nT={T}: train ms per setting (* = not within 1e-4 of serial or fell back)")
        for name, t in sorted(med.items(), key=lambda kv: kv[1]):
            mark = "" if rows[name][1] else " *"
            print(f"  {name:<34} {1e3 * t:9.1f}{mark}")
        print(
            f"T={T}: best {best} {1e3 * med[best]:.1f} ms; {auto_name} "
            f"{1e3 * med[auto_name]:.1f} ms = {med[auto_name] / med[best]:.2f}x the best; "
            f"serial {1e3 * med['serial']:.1f} ms"
        )


if __name__ == "__main__":
    main()
