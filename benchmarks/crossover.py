"""Where MGRIT stops paying: training-step speed-up over sequence length and batch size.

    python benchmarks/crossover.py [--T 64 256 1024 4096] [--batch 1 4 16 64 256] [--threads 1]

For every (T, B): the training step (forward + backward) of torch.nn.GRU, the serial solver
and MGRIT(cfactor="auto"), timed side by side in this process exactly as ``mgrit-gru bench``
times them (input 32, hidden 64, fp32, random-init GRU, median of --repeats). Prints one
table with MGRIT's speed-up over each and, per batch size, the shortest T at which MGRIT is
at least 10% faster than torch.nn.GRU and than the serial solver (a margin above this
machine's run-to-run noise).
"""

from __future__ import annotations

import argparse

import torch

from mgrit_gru.bench import bench_one_length, parse_setting

WIN = 1.1  # a speed-up counts from here


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"crossover: input={args.input} hidden={args.hidden} float32 threads={args.threads} "
        f"repeats={args.repeats} torch {torch.__version__}; training step ms; "
        "x = MGRIT(cfactor=auto)'s speed-up"
    )
    print(
        f"{'B':>5} {'T':>6} {'torch ms':>9} {'serial ms':>10} {'mgrit ms':>9} "
        f"{'x torch':>8} {'x serial':>9} {'it f/b':>7} {'max|dy|':>8}"
    )
    first_win: dict[int, dict[str, int]] = {}
    for B in args.batch:
        for T in args.T:
            run = argparse.Namespace(
                batch=B,
                input=args.input,
                hidden=args.hidden,
                dtype="float32",
                device="cpu",
                zbias=0.0,
                seed=0,
                no_torch=False,
                no_memory=True,
                repeats=args.repeats,
            )
            rows = bench_one_length(T, run, [parse_setting("cfactor=auto")], log=lambda _: None)
            by = {r["solver"]: r for r in rows}
            torch_row, serial_row = by["torch.nn.GRU"], by["serial"]
            mgrit = next(r for r in rows if r["solver"].startswith("mgrit"))
            print(
                f"{B:5d} {T:6d} {torch_row['train_s'] * 1e3:9.1f} "
                f"{serial_row['train_s'] * 1e3:10.1f} {mgrit['train_s'] * 1e3:9.1f} "
                f"{mgrit['speedup_vs_torch']:8.2f} {mgrit['speedup_vs_serial']:9.2f} "
                f"{mgrit['fwd_iters']}/{mgrit['bwd_iters']:<5} {mgrit['max_abs_y_err']:8.1e}",
                flush=True,
            )
            wins = first_win.setdefault(B, {})
            for key, ratio in (("torch", "speedup_vs_torch"), ("serial", "speedup_vs_serial")):
                if key not in wins and mgrit[ratio] >= WIN:
                    wins[key] = T
    print(f"shortest T (of those run) at which MGRIT's training step is >= {WIN:.1f}x faster:")
    for B, wins in first_win.items():
        print(
            f"  B={B}: than torch.nn.GRU from T={wins.get('torch', 'none')}, "
            f"than serial from T={wins.get('serial', 'none')}"
        )


if __name__ == "__main__":
    main()
