"""The paper's experiment, projected: speed-up of a training step over the serial solver (and
over torch.nn.GRU) against P = 1, 2, 4, ..., 64 time-parallel ranks and T = 1k to 64k, on a
trained checkpoint (its own cycles, to the tolerance) and with a fixed budget, for this CPU
joined by shared memory, 10 GbE and InfiniBand, and one H200. Every figure is projected
(mgrit-gru project; the models' validation: docs/projection.md).

    python benchmarks/projection_table.py --checkpoint RUN_DIR [--T 1024 4096 16384 65536]
        [--ranks 1 2 4 8 16 32 64] [--batch 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrit_gru.projection import cli  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a mgrit-gru train run (default: random weights)")
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--json", help="write every row here")
    p.add_argument("--summary", metavar="JSON", help="only print the tables of a --json file")
    args = p.parse_args()
    if args.summary:
        rows = json.loads(Path(args.summary).read_text())
        args.T = sorted({r["T"] for r in rows})
        print_tables(rows, args.T)
        return 0
    rows = []
    for T in args.T:
        for device, links in (("cpu", ["shm", "10gbe", "ib"]), ("cuda", None)):
            ns = argparse.Namespace(
                T=T,
                batch=args.batch,
                input=32,
                hidden=64,
                layers=1,
                checkpoint=args.checkpoint,
                device=device,
                link=links,
                ranks=args.ranks if device == "cpu" else [1],
                solvers=["mgrit", "budget"],
                json=True,
            )
            got, dev = cli.project(ns)
            for r in got:
                r["T"] = T
            rows += got
            print(f"T={T} {dev.name}: {len(got)} rows", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_tables(rows, args.T)
    return 0


def print_tables(rows: list[dict], Ts: list[int]) -> None:
    """Per device and link, speed-up over the serial solver (over torch.nn.GRU) per T,
    solver and P; ``cycles``: forward/adjoint per P (the chunk length, and so the cycles,
    depends on P)."""
    print("PROJECTED speed-up of a training step over the serial solver (over torch.nn.GRU)")
    for device in sorted({r["device"] for r in rows}):
        mine = [r for r in rows if r["device"] == device]
        links = sorted({r["link"] for r in mine if r["link"] is not None}) or [None]
        Ps = sorted({r["ranks"] for r in mine})
        for link in links:
            print(f"\n{device}" + (f" + {link}" if link else ""))
            print("| T | solver | cycles | " + " | ".join(f"P={P}" for P in Ps) + " |")
            print("|---|---|---|" + "---|" * len(Ps))
            for T in Ts:
                for solver in ("mgrit", "budget"):
                    cells, cycles = [], []
                    for P in Ps:
                        hit = [
                            r
                            for r in mine
                            if (r["T"], r["solver"], r["ranks"]) == (T, solver, P)
                            and (P == 1 or r["link"] == link)
                        ]
                        if not hit:
                            cells.append("-")
                            continue
                        r = hit[0]
                        if r.get("cycles") and r["cycles"] not in cycles:
                            cycles.append(r["cycles"])
                        xt = "" if r["x_torch"] is None else f" ({r['x_torch']:.2f})"
                        cells.append(f"{r['x_serial']:.2f}{xt}")
                    cyc = ", ".join(cycles) or "-"
                    print(f"| {T} | {solver} | {cyc} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
