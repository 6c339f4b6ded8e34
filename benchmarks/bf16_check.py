"""Would bf16 GEMMs speed up the solve? fp32 against bf16, side by side, with the error it costs.

    python benchmarks/bf16_check.py [--hidden 64] [--input 32] [--batch 4] [--T 16384]

Under ``torch.autocast`` the solver runs in fp32 (see docs/limits.md). This script
measures, on one CPU thread, what a bf16 path would change in each GEMM-carrying part of a
training step, at the shapes the solver uses:

- ``step``: one batched GRU step over R rows (an F-relaxation's unit), as the library runs it
  in fp32, and with its recurrent GEMM in bf16 (state and gate math in fp32: what autocast
  with fp32 state would run); R = T * B / m for the chunk lengths m that ``cfactor="auto"``
  picks at B=4 (T=1k..64k: 128 to 1024 rows);
- ``input gates``: ``W_ih x + b`` over all T * B rows at once (the forward's one big GEMM);
- ``backward block``: the three GEMMs of one 2048-row block of the backward (input gradient,
  both weight gradients), accumulated in fp32.

Each fp32 / bf16 pair alternates for 5 rounds; the median per call is printed with the ratio
(< 1: bf16 is faster). Then the price: a serial forward of T steps with bf16 recurrent GEMMs
against the fp32 one (max abs output difference). The CPU needs bf16 GEMM support in oneDNN
(e.g. AVX512-BF16 or AMX) for bf16 to have a chance.

Only the backward block gained here. A path that ran just those GEMMs in bf16 under autocast
was built and timed end to end (commit 86ae8ab: training step at T=16384, B=4 with and
without autocast, interleaved): 0.93-1.03x in four runs for a 2.7e-3 relative gradient error,
so it was removed and the GRU stays fp32 under autocast.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgrit_gru.gru import cell


def per_call_us(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def bf16_step(h, gx, w_lp, b_hn, out):
    """A GRU step whose recurrent GEMM runs in bf16; the state and the gate math stay fp32."""
    H = h.shape[-1]
    gh = h.bfloat16() @ w_lp.t()
    rz = torch.add(gx[:, : 2 * H], gh[:, : 2 * H]).sigmoid_()
    r, z = rz[:, :H], rz[:, H:]
    n = torch.addcmul(gx[:, 2 * H :], r, gh[:, 2 * H :] + b_hn).tanh_()
    return torch.lerp(n, h, z, out=out)


def compare(name: str, fp32, bf16, repeats: int) -> None:
    rounds = {"fp32": [], "bf16": []}
    for _ in range(5):
        rounds["fp32"].append(per_call_us(fp32, repeats))
        rounds["bf16"].append(per_call_us(bf16, repeats))
    a, b = statistics.median(rounds["fp32"]), statistics.median(rounds["bf16"])
    print(f"{name:28s} {a:10.1f} {b:10.1f} {b / a:8.2f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--input", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--T", type=int, default=16384, help="length for the big GEMMs")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    H, I, B, T = args.hidden, args.input, args.batch, args.T
    w_hh, b_hn = torch.randn(3 * H, H) / H**0.5, torch.randn(H) * 0.1
    w_lp = w_hh.bfloat16()
    print(
        f"bf16_check: hidden={H} input={I} batch={B} T={T} threads=1 torch {torch.__version__}; "
        "median us per call of 5 rounds; ratio = bf16 / fp32"
    )
    print(f"{'operation':28s} {'fp32 us':>10s} {'bf16 us':>10s} {'ratio':>8s}")
    for rows in (128, 256, 512, 1024, 2048):
        h, gx, out = torch.rand(rows, H) - 0.5, torch.randn(rows, 3 * H), torch.empty(rows, H)
        compare(
            f"step, {rows} rows",
            lambda h=h, gx=gx, out=out: cell.step(h, gx, w_hh, b_hn, "classic", out=out),
            lambda h=h, gx=gx, out=out: bf16_step(h, gx, w_lp, b_hn, out),
            max(20, 200_000 // rows),
        )
    x, w_ih, b_ih = torch.randn(T * B, I), torch.randn(3 * H, I) / I**0.5, torch.randn(3 * H)
    gates = torch.empty(T * B, 3 * H)
    x_lp, w_ih_lp = x.bfloat16(), w_ih.bfloat16()
    compare(
        f"input gates, {T * B} rows",
        lambda: torch.addmm(b_ih, x, w_ih.t(), out=gates),
        lambda: torch.add(x.bfloat16() @ w_ih_lp.t(), b_ih, out=gates),
        5,
    )
    rows = 2048
    d_g, xs, hs = torch.randn(rows, 3 * H), x[:rows], torch.rand(rows, H)
    d_x, d_w_ih, d_w_hh = torch.empty(rows, I), torch.zeros(3 * H, I), torch.zeros(3 * H, H)

    def block_fp32():
        torch.mm(d_g, w_ih, out=d_x)
        d_w_ih.addmm_(d_g.t(), xs)
        d_w_hh.addmm_(d_g.t(), hs)

    def block_bf16():
        g = d_g.bfloat16()
        d_x.copy_(g @ w_ih_lp)
        d_w_ih.add_(g.t() @ x_lp[:rows])
        d_w_hh.add_(g.t() @ hs.bfloat16())

    compare(f"backward block, {rows} rows", block_fp32, block_bf16, 200)

    steps = min(T, 4096)
    gx = torch.randn(steps, B, 3 * H)
    h32, hbf = torch.zeros(B, H), torch.zeros(B, H)
    worst = 0.0
    for k in range(steps):
        h32 = cell.step(h32, gx[k], w_hh, b_hn, "classic")
        hbf = bf16_step(hbf, gx[k], w_lp, b_hn, torch.empty(B, H))
        worst = max(worst, (h32 - hbf).abs().max().item())
    print(f"serial forward of {steps} steps, bf16 recurrent GEMMs: max |y - y_fp32| = {worst:.1e}")


if __name__ == "__main__":
    main()
