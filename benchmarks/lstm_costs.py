"""The LSTM's steps against the GRU's, for the cost model's LSTM multipliers
(``mgrit_gru.lstm.cell.LSTMCell.costs``).

    python benchmarks/lstm_costs.py [--hidden 64] [--rows 4 2048] [--batches 4 32]

The cost model (:mod:`mgrit_gru.cost`) is measured on GRU steps: a step of ``rows`` states
costs ``o + c * rows``. This prints, at one thread, the library's LSTM and GRU forward and
adjoint steps at a small and a large row count (overhead ``o`` from the small, per-row ``c``
from the difference) and their ratios; and, per step of a serial sweep over ``--batches``
sequences, the LSTM's serial forward (torch's kernel) and serial adjoint (torch's backward)
against the GRU's fused forward, with the overhead and per-row multipliers fitted over the
batches; and the compiled sweeps (:mod:`mgrit_gru.kernels`, the cost kinds "sweep" and
"sweep_adjoint") of both cells at the two row counts. Ratios move less between machines
than times do; the shipped multipliers were measured on an Intel Xeon (2026-12-04), the
compiled sweeps' on an AMD EPYC (2026-12-04).
"""

from __future__ import annotations

import argparse
import time

import torch

from mgrit_gru.gru import cell as G
from mgrit_gru.lstm import cell as L


def per_call_us(fn, calls: int) -> float:
    for _ in range(max(3, calls // 10)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def steps(H: int, rows: int) -> dict[str, float]:
    calls = 2000 if rows <= 64 else 200
    u, gx, w = torch.randn(rows, 2 * H), torch.randn(rows, 4 * H), torch.randn(4 * H, H)
    out, keep, fac = torch.empty(rows, 2 * H), torch.empty(rows, 4 * H), torch.empty(rows, 2 * H)
    lam, D, C = torch.randn(rows, 2 * H), torch.rand(rows, 2 * H), torch.rand(rows, 5 * H)
    h, gxg, wg, b = torch.randn(rows, H), torch.randn(rows, 3 * H), torch.randn(3 * H, H), None
    og, keepg, facg = torch.empty(rows, H), torch.empty(rows, 4 * H), torch.empty(rows, H)
    Dg, Cg = torch.rand(rows, H), torch.rand(rows, 3 * H)
    return {
        "lstm step": per_call_us(lambda: L.step(u, gx, w, out=out, keep=keep, factor=fac), calls),
        "lstm adjoint": per_call_us(lambda: L.adjoint_step(lam, D, C, w, out), calls),
        "gru step": per_call_us(
            lambda: G.step(h, gxg, wg, b, "classic", out=og, keep=keepg, factor=facg), calls
        ),
        "gru adjoint": per_call_us(lambda: G.adjoint_step(h, Dg, Cg, wg, og), calls),
    }


def serial(H: int, B: int, T: int = 2048) -> dict[str, float]:
    x = torch.randn(T, B, 32)
    lstm, gru = torch.nn.LSTM(32, H), torch.nn.GRU(32, H)
    lw = [
        p.detach() for p in (lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
    ]
    gw = [p.detach() for p in (gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)]
    u0, h0 = torch.zeros(B, 2 * H), torch.zeros(B, H)
    d, d_last = torch.randn(T, B, 2 * H), torch.randn(B, 2 * H)
    d[..., H:] = 0
    with torch.no_grad():
        lstm_fwd = per_call_us(lambda: L.fused_forward(x, u0, *lw), 5) / T
        gru_fwd = per_call_us(lambda: G.fused_forward(x, h0, *gw), 5) / T
    lstm_adj = per_call_us(lambda: L.fused_vjp(x, u0, *lw, d, d_last), 3) / T
    return {"lstm fused": lstm_fwd, "lstm fused adjoint": lstm_adj, "gru fused": gru_fwd}


def compiled(H: int, rows: int, S: int = 64) -> dict[str, float]:
    """Per step of a compiled sweep of ``S`` steps over ``rows`` states (one chunk each)."""
    from functools import partial

    from mgrit_gru import kernels

    K = kernels.compiled_for("compiled", torch.zeros(1))
    calls = max(3, 20000 // (S * max(1, rows // 4)))
    out = {}
    for name, width, gates, coeffs in (("lstm", 2 * H, 4, 5), ("gru", H, 3, 3)):
        x0, o = torch.randn(1, rows, 1, width), torch.empty(S, rows, 1, width)
        gx, w = torch.randn(S, rows, 1, gates * H), torch.randn(gates * H, H) / H**0.5
        keep, fac = torch.empty(S, rows, 1, 4 * H), torch.empty(S, rows, 1, width)
        D, C = torch.rand(S, rows, 1, width), torch.rand(S, rows, 1, coeffs * H)
        if name == "lstm":
            fwd = partial(K.lstm_forward, x0, o, gx, w, None, keep, fac, None, -1, 0, 0, 0)
            adj = partial(K.lstm_adjoint, x0, o, D, C, w, None)
        else:
            fwd = partial(
                K.gru_forward, x0, o, gx, w, None, None, keep, fac, None, False, -1, 0, 0, 0
            )
            adj = partial(K.gru_adjoint, x0, o, D, C, w, None)
        out[f"{name} sweep"] = per_call_us(fwd, calls) / S
        out[f"{name} sweep_adjoint"] = per_call_us(adj, calls) / S
    return out


GRID = ((16, 1, 8), (64, 16, 8), (64, 4, 64), (784, 32, 64), (4096, 4, 64))


def model_check() -> None:
    """The cost model's price of the LSTM's serial solves (torch's kernel forward and
    backward) against their measured time over a grid of small and large shapes: a ratio
    within 0.5-2 is the aim."""
    from mgrit_gru import cost

    print("serial LSTM by torch's kernel, model / measured (T, B, H):")
    for T, B, H in GRID:
        x, lstm = torch.randn(T, B, 3), torch.nn.LSTM(3, H)
        w = [p.detach() for p in (lstm.weight_ih_l0, lstm.weight_hh_l0)]
        w += [p.detach() for p in (lstm.bias_ih_l0, lstm.bias_hh_l0)]
        u0, d, d_last = torch.zeros(B, 2 * H), torch.randn(T, B, 2 * H), torch.randn(B, 2 * H)
        d[..., H:] = 0
        calls = max(3, 2000 // T)
        with torch.no_grad():
            fwd = per_call_us(lambda: L.fused_forward(x, u0, *w), calls)  # noqa: B023
        adj = per_call_us(lambda: L.fused_vjp(x, u0, *w, d, d_last), calls)  # noqa: B023
        costs = L.LSTMCell.costs
        mf = cost.serial_us("fused", T, B, H, "cpu", costs)
        ma = cost.serial_us("fused_adjoint", T, B, H, "cpu", costs)
        print(
            f"  T={T:<5} B={B:<3} H={H:<3} forward {mf:8.0f} / {fwd:8.0f} us = {mf / fwd:.2f}"
            f"   adjoint {ma:8.0f} / {adj:8.0f} us = {ma / adj:.2f}"
        )


def fit(small: float, large: float, rows: tuple[int, int]) -> tuple[float, float]:
    c = (large - small) / (rows[1] - rows[0])
    return max(small - c * rows[0], 0.0), c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--rows", type=int, nargs=2, default=[4, 2048])
    p.add_argument("--batches", type=int, nargs=2, default=[4, 32])
    args = p.parse_args()
    torch.set_num_threads(1)
    H, rows = args.hidden, tuple(args.rows)
    small, large = steps(H, rows[0]), steps(H, rows[1])
    print(f"one thread, H = {H}, torch {torch.__version__}; us per step")
    for kind in ("step", "adjoint"):
        lo, lc = fit(small[f"lstm {kind}"], large[f"lstm {kind}"], rows)
        go, gc = fit(small[f"gru {kind}"], large[f"gru {kind}"], rows)
        print(
            f"{kind:>8}: LSTM o {lo:6.1f} c {lc:.3f} | GRU o {go:6.1f} c {gc:.3f} | "
            f"multipliers o {lo / go:.2f} c {lc / gc:.2f}"
        )
    small, large = compiled(H, rows[0]), compiled(H, rows[1])
    for kind in ("sweep", "sweep_adjoint"):
        lo, lc = fit(small[f"lstm {kind}"], large[f"lstm {kind}"], rows)
        go, gc = fit(small[f"gru {kind}"], large[f"gru {kind}"], rows)
        print(
            f"{kind:>8}: LSTM o {lo:6.2f} c {lc:.3f} | GRU o {go:6.2f} c {gc:.3f} | "
            f"multipliers o {lo / max(go, 1e-9):.2f} c {lc / gc:.2f} (compiled)"
        )
    a, b = serial(H, args.batches[0]), serial(H, args.batches[1])
    go, gc = fit(a["gru fused"], b["gru fused"], tuple(args.batches))
    for kind in ("lstm fused", "lstm fused adjoint"):
        lo, lc = fit(a[kind], b[kind], tuple(args.batches))
        print(
            f"{kind:>18}: o {lo:6.2f} c {lc:.3f} | GRU fused o {go:6.2f} c {gc:.3f} | "
            f"multipliers o {lo / max(go, 1e-9):.2f} c {lc / gc:.2f}"
        )


if __name__ == "__main__":
    main()
    model_check()
