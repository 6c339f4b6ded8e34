"""GRU math shared by every solver and backend: steps, their linearisation, gradients.

Gates are stacked (r, z, n) as in ``torch.nn.GRU``. With ``gx = W_ih x + b_ih`` (precomputed
for all steps) and ``gh = W_hh h + b_hh``::

    r = sigmoid(gx_r + gh_r)   z = sigmoid(gx_z + gh_z)   n = tanh(gx_n + r * gh_n)
    h' = h + theta * (n - h)

    classic step  (torch.nn.GRU, forward Euler with dt = 1):  theta = dt (1 - z)
    implicit step (Moon & Cyr 2022; stable for any dt):        theta = dt (1 - z) / (1 + dt (1 - z))

``dt = 0`` is the identity step (used to pad grids). A step can keep its gates for the
backward: ``[r, z, n, gh_n]`` (4H per row, :data:`KEPT`), from which :func:`linearise_kept`
needs no GEMM. The vector-Jacobian product of one step is linear in the incoming adjoint
``lam``::

    J^T lam = D * lam + (C * [lam, lam, lam]) @ W_hh

with per-step coefficients ``D`` (shape ``(..., H)``) and ``C`` (``(..., 3H)``); the gradient of
the gate pre-activations of the input side is ``[C_r, C_z, A_n] * lam``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .. import workspace

CELLS = ("classic", "implicit")
KEPT = 4  # kept gates per hidden unit: r, z, n and gh_n = W_hn h + b_hn


def recurrent_gates(h: Tensor, w_hh: Tensor, b_hh: Optional[Tensor]) -> Tensor:
    """``W_hh h + b_hh`` for states ``h`` of shape ``(..., H)`` -> ``(..., 3H)``: one GEMM."""
    flat = h.reshape(-1, h.shape[-1])
    out = flat @ w_hh.t() if b_hh is None else torch.addmm(b_hh, flat, w_hh.t())
    return out.view(*h.shape[:-1], w_hh.shape[0])


def tanh_(x: Tensor) -> Tensor:
    """tanh of a fresh tensor, in place where autograd allows. Large tensors use
    2 sigmoid(2x) - 1: on the CPU torch's sigmoid is several times faster than its tanh (0.06
    against 0.35 ms for 131k floats here; absolute error at round-off); small ones take the
    single op, since there launch overhead dominates."""
    if x.requires_grad:
        return torch.tanh(x)
    if x.numel() <= 16384:
        return x.tanh_()
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


def fold_bias(b_ih: Optional[Tensor], b_hh: Optional[Tensor], H: int) -> Optional[Tensor]:
    """The input-gate bias that :func:`step` expects: ``b_ih`` plus the r and z parts of
    ``b_hh`` (they add to the same pre-activations; the n part stays inside ``r * (...)``)."""
    if b_hh is None:
        return b_ih
    folded = torch.cat([b_hh[: 2 * H], torch.zeros_like(b_hh[2 * H :])])
    return folded if b_ih is None else b_ih + folded


def step(
    h: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    b_hn: Optional[Tensor],
    cell: str,
    dt: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
    keep: Optional[Tensor] = None,
    factor: Optional[Tensor] = None,
) -> Tensor:
    """One GRU step for a batch of states.

    Args:
        h: states ``(..., H)``.
        gx: input gates ``(..., 3H)`` with ``h``'s leading shape (any strides), computed with
            the folded bias of :func:`fold_bias`: ``W_ih x + b_ih + [b_hr, b_hz, 0]``.
        w_hh: ``(3H, H)``; b_hn: the n part of ``b_hh`` ``(H,)`` or None.
        cell: ``"classic"`` or ``"implicit"``.
        dt: step sizes broadcastable to ``(..., 1)``; None means 1.
        out: optional output ``(..., H)``.
        keep: optional ``(..., 4H)`` (any strides) that receives the step's gates
            ``[r, z, n, gh_n]`` for :func:`linearise_kept`.
        factor: optional ``(..., H)`` that receives the step's diagonal factor with the gates
            frozen, ``1 - theta`` (``z`` for the classic step): ``h' = factor * h + theta n``.
    """
    H = h.shape[-1]
    flat = h.reshape(-1, H)
    rows = flat.shape[0]
    # The kept gates are computed in a contiguous scratch and copied out in one go: writing
    # them piecemeal into the (strided, cache-cold) destination cost more here.
    gates = None if keep is None else workspace.buffer("step.kept", (rows, KEPT * H), h)
    # r, z: the input gates enter as addmm's bias term, fused into the GEMM.
    pre_rz = gx[..., : 2 * H].reshape(rows, 2 * H)
    w_rz, w_n = w_hh[: 2 * H].t(), w_hh[2 * H :].t()
    rz_out, n_out = (None, None) if gates is None else (gates[:, : 2 * H], gates[:, 3 * H :])
    rz = torch.addmm(pre_rz, flat, w_rz, out=rz_out).sigmoid_().view(*h.shape[:-1], 2 * H)
    r, z = rz[..., :H], rz[..., H:]
    if b_hn is None:
        ghn = torch.mm(flat, w_n, out=n_out).view(h.shape)
    else:
        ghn = torch.addmm(b_hn, flat, w_n, out=n_out).view(h.shape)
    n_pre = None if gates is None else gates[:, 2 * H : 3 * H].view(h.shape)
    n = tanh_(torch.addcmul(gx[..., 2 * H :], r, ghn, out=n_pre))
    if keep is not None:
        keep.copy_(gates.view(keep.shape))
    if cell == "classic" and dt is None:
        if factor is not None:
            factor.copy_(z)
        return torch.lerp(n, h, z, out=out)  # n + z (h - n) = h + (1 - z)(n - h)
    theta = torch.rsub(z, 1.0)
    if dt is not None:
        theta.mul_(dt)
    if cell == "implicit":
        theta = theta.div_(theta + 1.0)
    if factor is not None:
        torch.neg(theta, out=factor).add_(1.0)
    return torch.lerp(h, n, theta, out=out)


class Linearisation(NamedTuple):
    D: Tensor  # (..., H)   dh'/dh through the direct path
    C: Tensor  # (..., 3H)  dh'/d(gh) per unit of lam, gates (r, z, n)
    A_n: Tensor  # (..., H) dh'/d(pre-activation of n) per unit of lam


def linearise(
    h: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    b_hn: Optional[Tensor],
    cell: str,
    dt: Optional[Tensor] = None,
    out_C: Optional[Tensor] = None,
) -> Linearisation:
    """Adjoint coefficients of :func:`step` at states ``h`` (any leading shape, all at once);
    arguments as for :func:`step`. The gates are recomputed (one GEMM). ``out_C``: a
    contiguous ``(..., 3H)`` tensor to hold ``C``."""
    H = h.shape[-1]
    gh = recurrent_gates(h, w_hh, None)
    rz = torch.sigmoid(gh[..., : 2 * H] + gx[..., : 2 * H])
    r, z = rz[..., :H], rz[..., H:]
    ghn = gh[..., 2 * H :] if b_hn is None else gh[..., 2 * H :] + b_hn
    n = tanh_(torch.addcmul(gx[..., 2 * H :], r, ghn))
    return _coefficients(h, r, z, n, ghn, cell, dt, out_C)


def linearise_kept(
    h: Tensor,
    kept: Tensor,
    cell: str,
    dt: Optional[Tensor] = None,
    out_C: Optional[Tensor] = None,
) -> Linearisation:
    """:func:`linearise` from the gates ``[r, z, n, gh_n]`` ``(..., 4H)`` that :func:`step`
    kept when it stepped from ``h``: elementwise work only."""
    H = h.shape[-1]
    r, z, n, ghn = kept.split(H, dim=-1)
    return _coefficients(h, r, z, n, ghn, cell, dt, out_C)


def _coefficients(h, r, z, n, ghn, cell: str, dt, out_C=None) -> Linearisation:
    # Each line is one or two fused elementwise passes: this runs over every fine step.
    H = h.shape[-1]
    one_z = torch.rsub(z, 1.0)
    w = one_z if dt is None else one_z * dt  # dt (1 - z)
    C = h.new_empty((*h.shape[:-1], 3 * H)) if out_C is None else out_C
    C_r, C_z, C_n = C[..., :H], C[..., H : 2 * H], C[..., 2 * H :]
    torch.sub(h, n, out=C_z).mul_(z).mul_(one_z)  # dh'/dz = dt (h - n) z (1 - z) ...
    if dt is not None:
        C_z.mul_(dt)
    if cell == "classic":  # theta = w: dtheta/dz = -dt
        theta = w
        D = z if dt is None else torch.rsub(w, 1.0)  # 1 - theta
    else:  # theta = w / (1 + w): dtheta/dz = -dt / (1 + w)^2
        D = torch.reciprocal(w + 1.0)
        C_z.mul_(D).mul_(D)  # ... / (1 + w)^2 for the implicit step
        theta = w * D
    A_n = torch.addcmul(theta, theta * n, n, value=-1.0)  # theta (1 - n^2)
    torch.mul(A_n, ghn, out=C_r).mul_(torch.addcmul(r, r, r, value=-1.0))  # ... r (1 - r)
    torch.mul(A_n, r, out=C_n)
    return Linearisation(D, C, A_n)


def adjoint_step(
    lam: Tensor, D: Tensor, C: Tensor, w_hh: Tensor, out: Optional[Tensor] = None
) -> Tensor:
    """``J^T lam = D * lam + (C * [lam, lam, lam]) @ W_hh`` for ``lam`` of shape ``(..., H)``."""
    H = lam.shape[-1]
    lead = lam.shape[:-1]
    weighted = (C.reshape(*lead, 3, H) * lam.unsqueeze(-2)).reshape(-1, 3 * H)
    direct = (D * lam).reshape(-1, H)
    if out is None:
        return torch.addmm(direct, weighted, w_hh).view(*lead, H)
    torch.addmm(direct, weighted, w_hh, out=out.view(-1, H))
    return out


class GateGrads(NamedTuple):
    d_gx: Tensor  # (..., 3H) gradient of W_ih x + b_ih
    d_gh: Tensor  # (..., 3H) gradient of W_hh h + b_hh


def gate_grads(
    lam_next: Tensor, C: Tensor, A_n: Tensor, out: Optional[GateGrads] = None
) -> GateGrads:
    """Gate pre-activation gradients of steps from ``lam_{i+1}`` ``(..., H)`` and the steps'
    coefficients ``C`` ``(..., 3H)``, ``A_n`` ``(..., H)``; any number of steps at once.
    ``out``: contiguous tensors ``(..., 3H)`` to write them into."""
    H = lam_next.shape[-1]
    lead = lam_next.shape[:-1]
    if out is None:
        out = GateGrads(C.new_empty(C.shape), C.new_empty(C.shape))
    d_gx, d_gh = out
    torch.mul(C.reshape(*lead, 3, H), lam_next.unsqueeze(-2), out=d_gh.view(*lead, 3, H))
    d_gx[..., : 2 * H] = d_gh[..., : 2 * H]
    torch.mul(A_n, lam_next, out=d_gx[..., 2 * H :])
    return out


def fused_forward(x, h0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
    """All points ``(T + 1, B, H)`` of the serial forward by ``torch._VF.gru`` (the kernel of
    ``torch.nn.GRU``), point 0 being h0; None where cuDNN refuses the shape."""
    params = [w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else [])
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    try:
        y, _ = torch._VF.gru(
            x, h0.unsqueeze(0), params, b_ih is not None, 1, 0.0, False, False, False
        )
    except RuntimeError as exc:
        # cuDNN refuses some shapes outright (on an H200 with cuDNN 9.19: T = 65536, where
        # torch.nn.GRU fails too); the library's own loop solves them instead
        if "CUDNN_STATUS" in str(exc):
            return None
        raise
    points = x.new_empty((T + 1, B, H))
    points[0] = h0
    points[1:] = y
    return points


def _triton():
    """The GRU's Triton sweeps (:mod:`mgrit_gru.gru.gru_triton`), imported at the first one:
    they need triton, which a CPU-only install may lack."""
    from . import gru_triton

    return gru_triton


class GRUCell:
    """The GRU as a :class:`mgrit_gru.layer.cell.Cell` for the layer solve: ``kind``
    ``"classic"`` (torch.nn.GRU) or ``"implicit"`` (Moon & Cyr's implicit step, which also
    steps the Implicit coarse levels of either)."""

    name = "gru"
    gates, state, kept, coeffs, extra = 3, 1, KEPT, 3, 1
    costs: dict = {}  # the cost model's own kinds

    def __init__(self, kind: str = "classic", kernels: Optional[str] = None) -> None:
        if kind not in CELLS:
            raise ValueError(f"GRU: unknown cell={kind!r}; choose one of {CELLS}")
        self.kind = kind
        self.kernels = kernels  # mgrit_gru.kernels.CHOICES, or None: the process default
        self.fused = kind == "classic"  # torch's loop is the classic GRU
        self.fused_complete = True  # a GRU's state is h
        self.fused_adjoint = False  # the library's adjoint loop beats torch's backward here

    def __repr__(self) -> str:
        return f"GRUCell({self.kind!r})"

    @property
    def implicit(self) -> GRUCell:
        return GRUCell("implicit", self.kernels)

    def fold_bias(self, b_ih, b_hh, H: int):
        return fold_bias(b_ih, b_hh, H)

    def recurrent_bias(self, b_hh, H: int):
        return None if b_hh is None else b_hh[2 * H :]

    def step(self, u, gx, w_hh, rb, dt=None, out=None, keep=None, factor=None) -> Tensor:
        return step(u, gx, w_hh, rb, self.kind, dt, out=out, keep=keep, factor=factor)

    def linearise(self, u, gx, w_hh, rb, dt=None, out_C=None):
        from ..layer.cell import Linearisation as Lin

        return Lin(*linearise(u, gx, w_hh, rb, self.kind, dt, out_C))

    def linearise_kept(self, u, kept, dt=None, out_C=None):
        from ..layer.cell import Linearisation as Lin

        return Lin(*linearise_kept(u, kept, self.kind, dt, out_C))

    def adjoint_step(self, lam, D, C, w_hh, out=None) -> Tensor:
        return adjoint_step(lam, D, C, w_hh, out)

    def gate_grads(self, lam_next, C, extra, out=None) -> GateGrads:
        return gate_grads(lam_next, C, extra, None if out is None else GateGrads(*out))

    # The compiled sweeps: ``kernel`` is what mgrit_gru.kernels.compiled_for chose, the C++
    # module (its gru_* functions, gru_cpu.cpp) or the Triton token (name "triton"), on which
    # the GRU launches its own Triton sweeps (gru_triton.py; same arguments).

    def kernel_forward(
        self, kernel, x0, out, gx, w_hh, rb, g, keep, factor, dt, pad, j0, check=()
    ) -> None:
        run = _triton().forward if kernel.name == "triton" else kernel.gru_forward
        run(x0, out, gx, w_hh, rb, g, keep, factor, dt, self.kind == "implicit", *pad, j0, *check)

    def kernel_adjoint(self, kernel, x0, out, D, C, w_hh, g, check=()) -> None:
        run = _triton().adjoint if kernel.name == "triton" else kernel.gru_adjoint
        run(x0, out, D, C, w_hh, g, *check)

    def kernel_vjp(self, kernel, points, kept, dt, w_hh, d_out, d_last) -> tuple:
        T, B, H = kept.shape[0], kept.shape[1], w_hh.shape[1]
        # pooled: fresh memory of this size costs more in page faults than the loop
        d_gx = workspace.buffer("bwd.d_gx", (T, B, 3 * H), points)
        d_gh = workspace.buffer("bwd.d_gh", (T, B, 3 * H), points)
        lam0 = points.new_empty((B, H))
        implicit = self.kind == "implicit"
        args = (points, kept, d_out, d_last, dt, implicit, w_hh, d_gx, d_gh, lam0)
        if kernel.name == "triton":
            _triton().serial_adjoint(*args)
            return d_gx, d_gh, lam0, None
        # the C++ sweep sums the biases' gradients as it writes the rows
        sums = (points.new_empty(3 * H), points.new_empty(3 * H))
        kernel.gru_serial_adjoint(*args, *sums)
        return d_gx, d_gh, lam0, sums

    def compiled_passes(self, kernel) -> bool:
        return hasattr(kernel, "gru_coefficients")  # the C++ module's; not the Triton token

    def kernel_coefficients(self, kernel, points, kept, dt, D, C, extra) -> None:
        kernel.gru_coefficients(points, kept, dt, self.kind == "implicit", D, C, extra)

    def kernel_gate_grads(self, kernel, lam_rev, C_rev, extra, buffer) -> tuple:
        d_gx, d_gh = buffer("bwd.d_gx"), buffer("bwd.d_gh")
        sums = (d_gx.new_empty(d_gx.shape[-1]), d_gx.new_empty(d_gx.shape[-1]))  # the biases'
        kernel.gru_gate_grads(lam_rev, C_rev, extra, d_gx, d_gh, *sums)
        return d_gx, d_gh, sums

    def fused_forward(self, x, u0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
        return fused_forward(x, u0, w_ih, w_hh, b_ih, b_hh)

    def fused_vjp(self, *args) -> None:
        return None

    def complete_points(self, points, *args) -> Tensor:
        """Nothing to fill: torch's GRU kernel returns the whole state."""
        return points

    def reference_layer(self, x, u0, w_ih, w_hh, b_ih, b_hh, mask=None):
        from . import reference

        return reference.layer(x, u0, w_ih, w_hh, b_ih, b_hh, self.kind, mask)

    def state_clamp(self, u0: Tensor):
        """A GRU step is a convex combination of its state and a tanh in (-1, 1), so every
        state lies within ``max(1, |h0|)``."""
        bound = max(1.0, u0.abs().max().item())
        return lambda states: states.clamp_(-bound, bound)
