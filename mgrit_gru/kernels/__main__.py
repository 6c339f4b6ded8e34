"""``python -m mgrit_gru.kernels``: build the compiled CPU kernels now (the README's set-up
runs it), or check the cached build; prints where they are, or why they cannot be built (exit 0
either way: the PyTorch code runs without them). ``--rebuild`` builds them anew whatever is
cached (the cached build stays in use until the new one is complete).

``python -m mgrit_gru.kernels --triton [--quick] [ARCH ...]``: compile every Triton kernel
variant the GPU would run (GRU and LSTM; forward, adjoint and serial adjoint sweeps; held and
blocked W_hh; float32, bfloat16, float16, float64) ahead of time for NVIDIA compute
capabilities ARCH (default 90: the H200), no GPU needed (Triton's own ptxas); exit 1 if any
fails to compile.
A blocked variant at H = 160 takes 10-15 s to compile; ``--quick`` (the test suite's) compiles
the blocked path at small blocks instead (H = 20 in blocks of 16: the same code, in seconds)
and leaves out float64 (which only kernels="triton" runs on a GPU)."""

import sys
import warnings


def cpu(rebuild: bool = False) -> int:
    from . import build_dir, error, load
    from . import rebuild as load_anew

    def say(message, *args, **kwargs):  # the library's warnings, as they come, one line each
        print(f"{message}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = say
        module = load_anew() if rebuild else load()
    if module is None:
        from . import _detail

        if _detail and "\n" in _detail:  # the compiler's output, where the build failed
            print(_detail, file=sys.stderr)
        print(f"mgrit-gru: compiled CPU kernels unavailable ({error()}); the PyTorch code runs")
    else:
        print(f"mgrit-gru: compiled CPU kernels ready in {build_dir()}")
    return 0


def triton_aot(archs: list[int], quick: bool = False) -> int:
    import torch

    from . import gpu

    if gpu.triton is None:
        print(f"mgrit-gru: {gpu.error(torch.device('cuda'))}")
        return 1
    if gpu.interpreting():
        print("mgrit-gru: unset TRITON_INTERPRET to compile the Triton kernels")
        return 1
    failed, hold = 0, (gpu.HOLD, gpu.BK)
    for arch in archs:
        dtypes = (torch.float32, torch.bfloat16)
        dtypes += () if quick else (torch.float16, torch.float64)
        for dtype in dtypes:
            for H in (48, 20 if quick else 160):  # W_hh held in registers; in column blocks
                if quick and H == 20:
                    gpu.HOLD, gpu.BK = 16, 16
                try:
                    with gpu.compile_only(arch) as done:
                        _every_sweep(dtype, H)
                    names = sorted({name for name, _, _ in done})
                    print(
                        f"sm_{arch} {str(dtype)[6:]:8s} H={H:3d} ok: {len(done)} kernels "
                        f"({', '.join(names)})"
                    )
                except Exception as exc:  # report every failing variant, then fail
                    failed += 1
                    last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
                    print(f"sm_{arch} {str(dtype)[6:]:8s} H={H:3d} FAILED: {last[0]}")
                finally:
                    gpu.HOLD, gpu.BK = hold
    return 1 if failed else 0


def _every_sweep(dtype, H: int) -> None:
    """Each launch a solve makes, on small tensors (nothing runs under compile_only), made the
    way the layer makes them: through each cell's ``kernel_forward``, ``kernel_adjoint`` and
    ``kernel_vjp`` with the Triton token, on which the cell launches its own Triton sweeps
    (this package imports none of them). Per cell, and per step of it (the GRU's classic and
    implicit): a forward sweep with every optional argument and a serial adjoint with step
    sizes; per cell, a forward sweep with none of them, adjoint sweeps with and without forcing
    and a serial adjoint without step sizes (an unmasked layer's)."""
    import torch

    from ..gru.cell import GRUCell
    from ..lstm.cell import LSTMCell
    from . import gpu

    k = gpu.kernels()
    S, n, B, T = 3, 2, 2, 4
    e = dict(dtype=dtype)
    for cell in (GRUCell("classic"), LSTMCell()):
        W, G, K = cell.state * H, cell.gates * H, cell.kept * H
        x0, out, g = (
            torch.zeros(1, n, B, W, **e),
            torch.zeros(S, n, B, W, **e),
            torch.zeros(S, n, B, W, **e),
        )
        gx, w, rb = torch.zeros(S, n, B, G, **e), torch.zeros(G, H, **e), torch.zeros(H, **e)
        keep, fac = torch.zeros(S, n, B, K, **e), torch.zeros(S, n, B, W, **e)
        dt = torch.ones(S, n, B, 1, **e)
        D, C = torch.zeros(S, n, B, W, **e), torch.zeros(S, n, B, cell.coeffs * H, **e)
        points, kept = torch.zeros(T + 1, B, W, **e), torch.zeros(T, B, K, **e)
        d_out, d_last = torch.zeros(T, B, W, **e), torch.zeros(B, W, **e)
        dts = torch.ones(T, B, **e)
        for step in (cell,) if cell.implicit is None else (cell, cell.implicit):
            step.kernel_forward(k, x0, out, gx, w, rb, g, keep, fac, dt, (0, 0, 1), 0)
            step.kernel_vjp(k, points, kept, dts, w, d_out, d_last)
        cell.kernel_forward(k, x0, out, gx, w, None, None, None, None, None, (-1, 0, 0), 0)
        cell.kernel_adjoint(k, x0, out, D, C, w, g)
        cell.kernel_adjoint(k, x0, out, D, C, w, None)
        cell.kernel_vjp(k, points, kept, None, w, d_out, d_last)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--triton"]:
        quick = "--quick" in argv
        sys.exit(triton_aot([int(a) for a in argv[1:] if a != "--quick"] or [90], quick))
    unknown = [a for a in argv if a != "--rebuild"]
    if unknown:
        print(f"mgrit-gru: unknown arguments {unknown}: --rebuild, or --triton [--quick] [ARCH]")
        sys.exit(2)
    sys.exit(cpu(rebuild="--rebuild" in argv))
