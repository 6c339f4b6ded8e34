"""The calibration of mgrit_gru.cost: the time of one step of each kind against its rows.

    python benchmarks/step_cost.py [--hidden 32 64 128] [--rows 8 32 128 512 2048]

Each kind is timed as the solves run it (fp32, one thread): ``"step"`` and ``"adjoint"`` as a
level-0 F-relaxation of the MGRIT core over ``rows`` states (the propagator, the core's loop
and the cost meter included), ``"fused"`` as the serial forward that runs torch.nn.GRU's own
loop (per step, batch = rows). Per kind and hidden size it fits ``time = o + c * rows`` by
least squares over the row counts given and prints the fit at H = 64 in the form of
``mgrit_gru.cost.CALIBRATION`` (``c`` scaled by ``(64 / H)^H_EXPONENT``), and how well the
model's H-scaling predicts the other hidden sizes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgrit_gru import cost
from mgrit_gru.core import Grid
from mgrit_gru.core.cycle import LocalComm, _Solver
from mgrit_gru.gru import solve as gs


def _median_us(fn, per: int, rounds: int = 5) -> float:
    fn()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) / per * 1e6)
    return statistics.median(out)


def sweep_us(kind: str, rows: int, H: int, steps: int = 64) -> float:
    """One F-relaxation of ``steps`` steps over ``rows`` states (chunks of one row each)."""
    grid = Grid(N=steps * rows, m=steps, n=rows)
    meter = cost.Meter(H)
    w_hh = torch.randn(3 * H, H) / H**0.5
    if kind == "step":
        gates = torch.randn(grid.M, 1, 3 * H)
        op = gs.ForwardStep(grid, gates, w_hh, torch.randn(H), "classic", meter=meter)
    else:
        D, C = torch.rand(grid.M, 1, H), torch.rand(grid.M, 1, 3 * H) * 0.1
        op = gs.AdjointStep(grid, D, C, w_hh, meter)
    u = torch.rand(steps, rows, 1, H) - 0.5
    relax = _Solver([grid], [op], "F", LocalComm())
    return _median_us(lambda: relax.f_relax(0, u, None), steps - 1)


def fused_us(batch: int, H: int, T: int = 512) -> float:
    ref = torch.nn.GRU(1, H)
    x, h0 = torch.randn(T, batch, 1), torch.zeros(batch, H)
    params = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0]
    with torch.no_grad():
        return _median_us(lambda: gs.fused_forward(x, h0, *params), T)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(r for r, _ in points) / n
    my = sum(t for _, t in points) / n
    c = sum((r - mx) * (t - my) for r, t in points) / sum((r - mx) ** 2 for r, _ in points)
    return max(my - c * mx, 0.0), c


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128, 512, 2048])
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"step_cost: one thread, fp32, torch {torch.__version__}; times in us per step")
    fits: dict[str, dict[int, tuple[float, float]]] = {}
    for kind in ("step", "adjoint", "fused"):
        for H in args.hidden:
            rows = [r for r in args.rows if kind != "fused" or r <= 128]
            measure = fused_us if kind == "fused" else (lambda r, h, k=kind: sweep_us(k, r, h))
            points = [(r, measure(r, H)) for r in rows]
            o, c = fit(points)
            fits.setdefault(kind, {})[H] = (o, c)
            text = "  ".join(f"{r}:{t:.1f}" for r, t in points)
            print(f"{kind:<8} H={H:<4} {text}  -> o={o:.1f} c={c:.4f}")
    print(f"\nCALIBRATION['cpu'] at H=64, c scaled by (64/H)^{cost.H_EXPONENT} from each H:")
    for kind, per_h in fits.items():
        scaled = {H: c * (64 / H) ** cost.H_EXPONENT for H, (_, c) in per_h.items()}
        o64, c64 = per_h.get(64, next(iter(per_h.values())))
        print(
            f'  "{kind}": ({o64:.1f}, {c64:.3f}),   c at H=64 from each H: '
            + ", ".join(f"{H}: {v:.3f}" for H, v in scaled.items())
        )


if __name__ == "__main__":
    main()
