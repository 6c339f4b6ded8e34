"""Does torch.compile speed up the solver's kernels? Eager against compiled, side by side.

    python benchmarks/compile_check.py [--rows 1024] [--hidden 64] [--repeats 2000]

Times, on one CPU thread in fp32, the three per-row kernels that a training step repeats:

- ``step``: one batched GRU step (the F-relaxation's unit: two GEMMs and the gate math), as
  the library runs it (hand-fused eager: bias folded into addmm, in-place sigmoid, tanh via
  sigmoid, lerp) and as plain torch code compiled with torch.compile (inductor);
- ``adjoint_step``: one batched adjoint step (one GEMM, two products);
- ``coefficients``: the backward's per-step linearisation from kept gates (elementwise only:
  the chain that fusion should help most).

Each compiled function is warmed up (compiled) first; eager and compiled runs alternate, and
the median of 5 rounds is printed with the ratio. Compilation needs a C++ compiler.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgrit_gru.gru import cell


def plain_step(h, gx, w_hh, b_hn):
    H = h.shape[-1]
    gh = h @ w_hh.t()
    r = torch.sigmoid(gx[:, :H] + gh[:, :H])
    z = torch.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
    n = torch.tanh(gx[:, 2 * H :] + r * (gh[:, 2 * H :] + b_hn))
    return n + z * (h - n)


def plain_adjoint(lam, D, C, w_hh):
    H = lam.shape[-1]
    weighted = (C.view(-1, 3, H) * lam.unsqueeze(1)).view(-1, 3 * H)
    return D * lam + weighted @ w_hh


def plain_coefficients(h, kept):
    r, z, n, ghn = kept.split(h.shape[-1], dim=-1)
    A_n = (1.0 - n * n) * (1.0 - z)
    C = torch.cat([A_n * ghn * r * (1.0 - r), (h - n) * z * (1.0 - z), A_n * r], dim=-1)
    return z, C, A_n


def per_call_us(fn, args, repeats):
    fn(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1024, help="rows per batched step (chunks x B)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    R, H = args.rows, args.hidden
    h, gx = torch.randn(R, H) * 0.5, torch.randn(R, 3 * H)
    w_hh, b_hn = torch.randn(3 * H, H) / H**0.5, torch.randn(H)
    lam, D, C = torch.randn(R, H), torch.rand(R, H), torch.randn(R, 3 * H)
    kept = torch.empty(R, 4 * H)
    cell.step(h, gx, w_hh, b_hn, "classic", keep=kept)
    out = torch.empty(R, H)
    cases = [
        (
            "step",
            lambda *a: cell.step(*a, "classic", out=out),
            plain_step,
            (h, gx, w_hh, b_hn),
        ),
        (
            "adjoint_step",
            lambda *a: cell.adjoint_step(*a, out=out),
            plain_adjoint,
            (lam, D, C, w_hh),
        ),
        (
            "coefficients",
            lambda a, b: cell.linearise_kept(a, b, "classic"),
            plain_coefficients,
            (h, kept),
        ),
    ]
    print(
        f"compile_check: rows={R} hidden={H} float32 threads=1 torch {torch.__version__}; "
        "median us per call of 5 rounds"
    )
    print(
        f"{'kernel':14s} {'eager':>9s} {'plain eager':>12s} {'compiled':>9s} "
        f"{'eager/compiled':>15s}"
    )
    for name, eager, plain, a in cases:
        start = time.perf_counter()
        compiled = torch.compile(plain, dynamic=False)
        ref, got = eager(*a), compiled(*a)
        ref, got = (
            (ref if isinstance(ref, tuple) else (ref,)),
            (got if isinstance(got, tuple) else (got,)),
        )
        err = max((x - y).abs().max().item() for x, y in zip(ref, got))
        compile_s = time.perf_counter() - start
        rounds = {k: [] for k in ("eager", "plain", "compiled")}
        for _ in range(5):
            rounds["eager"].append(per_call_us(eager, a, args.repeats))
            rounds["plain"].append(per_call_us(plain, a, args.repeats))
            rounds["compiled"].append(per_call_us(compiled, a, args.repeats))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        print(
            f"{name:14s} {med['eager']:9.1f} {med['plain']:12.1f} {med['compiled']:9.1f} "
            f"{med['eager'] / med['compiled']:15.2f}   (compiled in {compile_s:.0f} s, "
            f"max diff {err:.1e})"
        )


if __name__ == "__main__":
    main()
