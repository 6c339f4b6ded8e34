"""The GRU's serial training step with the biases' gradients summed inside the compiled serial
adjoint (as it writes each step's gate gradients) against summed afterwards by PyTorch (two
more passes over T x B x 3H numbers), both ways interleaved round by round in one process.

    python benchmarks/bias_sums.py [--T 16384] [--batch 1 4 16] [--threads 1 2] [--rounds 7]
        [--dry-run]

Input 32, hidden 64, float32, random weights, ``solver="serial"`` on the compiled kernels.
Printed per row: the least and the median of the rounds each way and the ratio of the least.
Time only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coarse_maps import least_median, measure  # noqa: E402  (this folder's: the A/B timing)

from mgrit_gru import kernels, workspace  # noqa: E402
from mgrit_gru.cost import cpu_name  # noqa: E402
from mgrit_gru.gru import cell as gru_cell  # noqa: E402
from mgrit_gru.projection import record  # noqa: E402

_ORIGINAL = gru_cell.GRUCell.kernel_vjp
_FUSED = {"on": True}


def _vjp(self, kernel, points, kept, dt, w_hh, d_out, d_last):
    """The cell's kernel_vjp, or (``_FUSED`` off) the same sweep without the sums."""
    if _FUSED["on"] or kernel.name == "triton":
        return _ORIGINAL(self, kernel, points, kept, dt, w_hh, d_out, d_last)
    T, B, H = kept.shape[0], kept.shape[1], w_hh.shape[1]
    d_gx = workspace.buffer("bwd.d_gx", (T, B, 3 * H), points)
    d_gh = workspace.buffer("bwd.d_gh", (T, B, 3 * H), points)
    lam0 = points.new_empty((B, H))
    implicit = self.kind == "implicit"
    kernel.gru_serial_adjoint(points, kept, d_out, d_last, dt, implicit, w_hh, d_gx, d_gh, lam0)
    return d_gx, d_gh, lam0, None  # the layer sums them (torch.sum over the T B rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dry-run", action="store_true", help="T = 256, B = 2, one round")
    args = p.parse_args(argv)
    if args.dry_run:
        args.T, args.batch, args.rounds = 256, [2], 1
    if any(n < 1 for n in (*args.threads, *args.batch, args.rounds, args.T)):
        p.error("--T, --batch, --threads and --rounds must be positive")
    if kernels.load() is None:
        p.error(f"no compiled kernels here: {kernels.error()}")
    gru_cell.GRUCell.kernel_vjp = _vjp
    print(
        f"# {cpu_name()}; torch {torch.__version__}; float32; serial GRU training step, "
        f"T = {args.T}; least (median) of {args.rounds} interleaved rounds"
    )
    print("| B | threads | sums in PyTorch ms | in the sweep ms | speed-up |")
    print("|---|---|---|---|---|")
    for B in args.batch:
        step = record.training_step(args.T, B, 32, 64, "serial")
        times = measure(step, args.threads, args.rounds, _FUSED)
        for n in args.threads:
            a, b = times[(n, False)], times[(n, True)]
            print(f"| {B} | {n} | {least_median(a)} | {least_median(b)} | {min(a) / min(b):.3f}x |")


if __name__ == "__main__":
    main()
