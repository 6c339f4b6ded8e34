"""The Triton sweeps' shared part: one kernel launch per sweep on the GPU (and, for the tests,
on the CPU through Triton's interpreter, ``TRITON_INTERPRET=1`` set before triton is imported).

This module names no cell. Each cell's Triton sweeps live in the cell's folder, beside its
math and its C++ sweeps (``mgrit_gru/<cell>/<cell>_triton.py``), built from the helpers here:
the jitted pieces (loads of ``W_hh`` blocks, tiles, ``dot``, the activations), the argument
layout and checks, and the launch (:func:`launch`, which :func:`compile_only` turns into
ahead-of-time compiles). :func:`kernels` is what :func:`mgrit_gru.kernels.compiled_for` hands
the layer where the Triton sweeps serve the tensors: a token (``name == "triton"``) that the
layer passes to the cell's ``kernel_forward`` / ``kernel_adjoint`` / ``kernel_vjp``
(:class:`mgrit_gru.layer.cell.Cell`); the cell then launches its own Triton sweeps, as on the
C++ module it calls that module's functions.

A program owns a tile of ``BR`` rows (rows are chunk x batch of a sweep, the batch of a
serial adjoint), keeps their state in registers and loops over the sweep's steps: per step
one ``tl.dot`` per gate against ``W_hh`` and the gate math elementwise, the state stored once.
Where the hidden size fits (``BH <= HOLD``) the program loads ``W_hh`` once, split by gate,
and keeps it in registers for every step; above, each step multiplies in blocks of ``BK``
columns read back from the state it has just stored (and ``W_hh`` from the cache). The step
count is a runtime argument (no recompile per T); shapes are masked tiles, so any hidden size
and row count run. float32 products honour torch's TF32 setting (the stopping tests' rounding
floor reads the same setting); bfloat16 and float16 tensors are stored as such and computed
in float32; float64 stays float64.
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import torch

try:  # the import itself is what tells whether Triton is here
    import triton
    import triton.language as tl

    _IMPORT_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - depends on the machine
    triton = tl = None
    _IMPORT_ERROR = f"triton cannot be imported ({type(exc).__name__}: {exc})"

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
BR = 16  # rows per program (tl.dot's smallest tile)
HOLD = 64  # hidden sizes up to this hold W_hh in registers; above, BK-column blocks
BK = 64


# what triton saw when it was imported (setting the variable later changes nothing there)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"


def interpreting() -> bool:
    """Whether Triton runs its kernels on the CPU: ``TRITON_INTERPRET=1`` when triton was
    imported."""
    return _INTERPRET and os.environ.get("TRITON_INTERPRET", "") == "1"


def error(device: torch.device) -> Optional[str]:
    """Why the Triton sweeps cannot run on ``device`` (None: they can)."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return None
    return (
        f"the Triton kernels run on CUDA tensors (or on the CPU under TRITON_INTERPRET=1, "
        f"for tests), not on {device.type}"
    )


def blocks(H: int) -> tuple[int, int]:
    """``(BH, BK)``: the padded hidden size and the product's column block."""
    bh = max(16, triton.next_power_of_2(H))
    return bh, (bh if bh <= HOLD else min(BK, bh))


def meta(t: torch.Tensor, H: int) -> dict:
    """A launch's block sizes and product precision for hidden size ``H``, tensors like ``t``."""
    bh, bk = blocks(H)
    return {"BH": bh, "BK": bk, "PREC": precision(t)}


def precision(t: torch.Tensor) -> str:
    """``tl.dot``'s input precision for tensors like ``t``: TF32 where torch computes float32
    products in TF32 (or coarser), full precision otherwise."""
    from ..core.stopping import roundoff

    if t.dtype == torch.float32 and roundoff(torch.float32, t.device.type) > 2.0**-20:
        return "tf32"
    return "ieee"


def strides(t: Optional[torch.Tensor], like: torch.Tensor) -> tuple:
    """The first three strides of an ``(S, n, B, W)`` tensor whose last axis is contiguous,
    and the tensor to pass (``like`` stands in for an absent one; its flag is off)."""
    if t is None:
        return like, 0, 0, 0
    if t.dim() != 4 or (t.stride(3) != 1 and t.size(3) != 1):
        raise RuntimeError("mgrit kernels: expected (S, n, B, W) with a contiguous last axis")
    return t, t.stride(0), t.stride(1), t.stride(2)


def layout(x0: torch.Tensor, out: torch.Tensor, *tensors) -> tuple[list, list]:
    """What a sweep kernel takes of its ``(S, n, B, W)`` tensors ``x0``, ``out`` and then
    ``tensors`` (None: absent, ``out`` stands in): their pointers, and the first three strides
    of each but ``x0``'s first (it holds one step)."""
    args = [strides(t, out) for t in (x0, out, *tensors)]
    return [a[0] for a in args], [v for a in args for v in a[1:]][1:]


def check(name: str, like: torch.Tensor, *tensors) -> None:
    for t in tensors:
        if t is not None and (t.device != like.device or t.dtype != like.dtype):
            raise RuntimeError(
                f"{name}: every argument must be a tensor of the states' device and dtype"
            )


def grid(rows: int) -> tuple:
    return (triton.cdiv(max(rows, 1), BR),)


def launch(kernel, rows: int, *args, **meta) -> None:
    """One launch over ``rows`` rows (no launch for none); under :func:`compile_only`, the
    kernel compiled for that target instead."""
    warps = 4 if meta.get("BH", 16) <= 64 else 8
    if _target is not None:
        _compiled.append(_compile(kernel, args, dict(meta, BR=BR), warps, _target))
        return
    if rows == 0:
        return
    kernel[grid(rows)](*args, BR=BR, num_warps=warps, **meta)


_target = None  # a triton GPUTarget while compile_only() is on
_compiled: list = []
_TYPES = {
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}


@contextlib.contextmanager
def compile_only(arch: int = 90):
    """Within the block a launch compiles its kernel for an NVIDIA GPU of compute capability
    ``arch`` (ahead of time, no GPU needed: Triton's own ptxas) and runs nothing; yields the
    list of ``(kernel name, constexprs, cubin bytes)`` compiled. This is how a machine without
    a GPU checks that every kernel the GPU would run compiles."""
    global _target
    from triton.backends.compiler import GPUTarget

    _target, _compiled[:] = GPUTarget("cuda", arch, 32), []
    try:
        yield _compiled
    finally:
        _target = None


def _compile(kernel, args, meta, warps, target):
    from triton.compiler import ASTSource

    signature, constexprs = {}, {}
    for name, value in zip(kernel.arg_names, args):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            signature[name] = "fp32"
    for name, value in meta.items():
        signature[name] = "constexpr"
        constexprs[(kernel.arg_names.index(name),)] = value
    source = ASTSource(kernel, signature, constexprs=constexprs)
    compiled = triton.compile(source, target=target, options={"num_warps": warps})
    return (
        f"{kernel.fn.__module__.split('.')[-1]}.{kernel.fn.__name__}",
        meta,
        len(compiled.asm["cubin"]),
    )


if triton is not None:

    @triton.jit
    def sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def tanh(x):
        # 2 sigmoid(2x) - 1: no overflow for any x (exp(-2x) -> inf gives -1)
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0

    @triton.jit
    def load_w(w, row0, H, BH: tl.constexpr, TRANSPOSE: tl.constexpr):
        """A gate's (BH, BH) block of W_hh (rows row0 .. row0 + H), zero past H; TRANSPOSE:
        as the right operand of h @ W^T (element [k, j] = W[row0 + j, k])."""
        k = tl.arange(0, BH)
        mask = (k[:, None] < H) & (k[None, :] < H)
        if TRANSPOSE:
            return tl.load(w + (row0 + k[None, :]) * H + k[:, None], mask=mask, other=0.0)
        return tl.load(w + (row0 + k[:, None]) * H + k[None, :], mask=mask, other=0.0)

    @triton.jit
    def load_wk(w, row0, k0, H, BH: tl.constexpr, BK: tl.constexpr, TRANSPOSE: tl.constexpr):
        """Rows k0 .. k0 + BK of :func:`load_w`'s block."""
        k = k0 + tl.arange(0, BK)
        j = tl.arange(0, BH)
        mask = (k[:, None] < H) & (j[None, :] < H)
        if TRANSPOSE:
            return tl.load(w + (row0 + j[None, :]) * H + k[:, None], mask=mask, other=0.0)
        return tl.load(w + (row0 + k[:, None]) * H + j[None, :], mask=mask, other=0.0)

    @triton.jit
    def tile(p, col0, rmask, H, BH: tl.constexpr):
        """A (BR, BH) tile of H columns from column col0 of the rows at pointers p, in
        float32 (float64 stays float64), zero where masked."""
        k = tl.arange(0, BH)
        x = tl.load(
            p[:, None] + col0 + k[None, :], mask=rmask[:, None] & (k[None, :] < H), other=0.0
        )
        if x.dtype != tl.float64:  # (one return: Triton types every return alike)
            x = x.to(tl.float32)
        return x

    @triton.jit
    def put(p, col0, x, rmask, H, BH: tl.constexpr):
        k = tl.arange(0, BH)
        tl.store(
            p[:, None] + col0 + k[None, :],
            x.to(p.dtype.element_ty),
            mask=rmask[:, None] & (k[None, :] < H),
        )

    @triton.jit
    def dot(a, w, PREC: tl.constexpr):
        """``a @ w`` with ``a`` cast to ``w``'s dtype (bf16 products for bf16 weights),
        accumulated in float32 (float64 for float64)."""
        if w.dtype == tl.float64:
            y = tl.dot(a.to(w.dtype), w, input_precision=PREC, out_dtype=tl.float64)
        else:
            y = tl.dot(a.to(w.dtype), w, input_precision=PREC)
        return y

    @triton.jit
    def rows_of(pid, R, B, BR: tl.constexpr):
        """Row indices of a program's tile, their chunk and batch indices (int64), the mask."""
        r = pid * BR + tl.arange(0, BR)
        return (r // B).to(tl.int64), (r % B).to(tl.int64), r < R


def at(t: Optional[torch.Tensor], k: int) -> torch.Tensor:
    """The view of contiguous ``t`` from step ``k`` on (its pointer: that step's first value)."""
    if not t.is_contiguous():
        raise RuntimeError("mgrit kernels: the serial adjoint takes contiguous tensors only")
    return t[k:]


class TritonKernels:
    """What :func:`mgrit_gru.kernels.compiled_for` answers where the Triton sweeps serve the
    tensors: the layer hands it to the cell's ``kernel_*`` methods, which launch the cell's own
    Triton sweeps (``<cell>/<cell>_triton.py``); it holds no kernel itself."""

    name = "triton"  # in SolveStats.kernels; the cells tell it from the C++ module by it
    serial_by_torch = True  # a serial solve that cuDNN takes runs there (layer.solve)

    def __repr__(self) -> str:
        return "TritonKernels()"


_kernels: Optional[TritonKernels] = None


def kernels() -> TritonKernels:
    """The one :class:`TritonKernels` of the process."""
    global _kernels
    if _kernels is None:
        _kernels = TritonKernels()
    return _kernels
