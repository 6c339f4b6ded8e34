"""LSTM math for the layer solve: the step on the stacked state ``u = [h, c]``, its
linearisation, adjoint step and gate gradients, and :class:`LSTMCell` (the
:class:`mgrit_gru.layer.cell.Cell` that gathers them).

Gates are stacked (i, f, g, o) as in ``torch.nn.LSTM``. With ``gx = W_ih x + b_ih + b_hh``
(precomputed for all steps; both biases add to the same pre-activations)::

    a = gx + W_hh h
    i = sigmoid(a_i)   f = sigmoid(a_f)   g = tanh(a_g)   o = sigmoid(a_o)
    c' = f * c + i * g
    h' = o * tanh(c')

The state of a step is ``u = [h, c]`` (``2H`` per row): the MGRIT core sees one tensor. The
vector-Jacobian product of one step is linear in the incoming adjoint ``[lam_h', lam_c']``::

    s      = lam_c' + A * lam_h'                        A = o (1 - tanh(c')^2)
    d      = [C_i * s, C_f * s, C_g * s, C_o * lam_h']  (the gate pre-activations' gradient)
    lam_h  = d @ W_hh + D_h * lam_h'
    lam_c  = D_c * s

with ``C_i = g i (1 - i)``, ``C_f = c f (1 - f)``, ``C_g = i (1 - g^2)``, ``C_o = tanh(c') o
(1 - o)`` (``C``: five coefficients per hidden unit) and the diagonal ``D = [D_h, D_c] = [0,
f]``. With the gates frozen a step maps ``u`` affinely with that same diagonal factor: ``c' =
f c + i g`` and ``h'`` (a function of ``c'`` alone) carries no ``h``; ``f`` is the LSTM's
analogue of the GRU's ``z``. An identity step (padding, a sequence past its length) has
``D = 1`` and ``C = 0``, as the GRU's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .. import workspace
from ..layer.cell import Linearisation

KEPT = 4  # kept gates per hidden unit: i, f, g, o (activated)
COEFFS = 5  # per hidden unit: A, C_i, C_f, C_g, C_o


def fold_bias(b_ih: Optional[Tensor], b_hh: Optional[Tensor]) -> Optional[Tensor]:
    """The input-gate bias that :func:`step` expects: ``b_ih + b_hh``."""
    if b_ih is None or b_hh is None:
        return b_ih if b_hh is None else b_hh
    return b_ih + b_hh


def activated_gates(u: Tensor, gx: Tensor, w_hh: Tensor) -> Tensor:
    """``[i, f, g, o]`` ``(rows, 4H)`` of steps from states ``u`` ``(..., 2H)`` and input gates
    ``gx`` ``(..., 4H)``: one GEMM, then the activations in place."""
    H = w_hh.shape[1]
    rows = u.numel() // u.shape[-1]
    a = torch.addmm(gx.reshape(rows, 4 * H), u[..., :H].reshape(rows, H), w_hh.t())
    if a.requires_grad:  # out of place: autograd records it
        sig, tanh = torch.sigmoid, torch.tanh
        return torch.cat([sig(a[:, : 2 * H]), tanh(a[:, 2 * H : 3 * H]), sig(a[:, 3 * H :])], -1)
    a[:, : 2 * H].sigmoid_()
    a[:, 2 * H : 3 * H].tanh_()
    a[:, 3 * H :].sigmoid_()
    return a


def _identity(dt: Optional[Tensor], value: Tensor, fill: float) -> Tensor:
    """``value`` on real steps (``dt > 0``), ``fill`` on identity steps."""
    return value if dt is None else torch.where(dt > 0, value, fill)


def step(
    u: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    dt: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
    keep: Optional[Tensor] = None,
    factor: Optional[Tensor] = None,
) -> Tensor:
    """One LSTM step of states ``u`` ``(..., 2H)`` (``[h, c]``) with input gates ``gx``
    ``(..., 4H)``; ``dt`` ``(..., 1)`` in {0, 1}: 0 is the identity step. ``keep``
    ``(..., 4H)`` receives the gates, ``factor`` ``(..., 2H)`` the frozen-gate diagonal
    ``[0, f]`` (1 on identity steps). Writes into ``out`` if given."""
    H = w_hh.shape[1]
    lead, rows = u.shape[:-1], u.numel() // u.shape[-1]
    a = activated_gates(u, gx, w_hh)
    i, f, g, o = a.split(H, dim=-1)
    c = u[..., H:].reshape(rows, H)
    if a.requires_grad or u.requires_grad:
        c_new = torch.addcmul(f * c, i, g)  # out-of-place: autograd records it
        new = torch.cat([o * torch.tanh(c_new), c_new], dim=-1)
    else:  # both halves written in place into one buffer
        new = u.new_empty((rows, 2 * H))
        c_new = torch.mul(f, c, out=new[:, H:]).addcmul_(i, g)
        torch.tanh(c_new, out=new[:, :H]).mul_(o)
    new = new.view(*lead, 2 * H)
    if keep is not None:
        keep.copy_(a.view(*lead, 4 * H))
    if factor is not None:
        factor[..., :H] = 0.0
        factor[..., H:] = f.view(*lead, H)
        if dt is not None:
            factor.copy_(_identity(dt, factor, 1.0))
    if dt is not None:
        new = torch.where(dt > 0, new, u)
    return new if out is None else out.copy_(new)


def _coefficients(u: Tensor, a: Tensor, dt: Optional[Tensor], out_C=None) -> Linearisation:
    H = u.shape[-1] // 2
    lead = u.shape[:-1]
    i, f, g, o = (t.view(*lead, H) for t in a.reshape(-1, 4 * H).split(H, dim=-1))
    c = u[..., H:]
    tc = torch.tanh(f * c + i * g)
    C = u.new_empty((*lead, COEFFS * H)) if out_C is None else out_C
    A, C_i, C_f, C_g, C_o = C.split(H, dim=-1)
    torch.addcmul(o, o * tc, tc, value=-1.0, out=A)
    torch.mul(g, i, out=C_i).mul_(torch.rsub(i, 1.0))
    torch.mul(c, f, out=C_f).mul_(torch.rsub(f, 1.0))
    torch.addcmul(i, i * g, g, value=-1.0, out=C_g)
    torch.mul(tc, o, out=C_o).mul_(torch.rsub(o, 1.0))
    D = torch.cat([torch.zeros_like(f), f], dim=-1)
    if dt is not None:
        D = _identity(dt, D, 1.0)
        C.copy_(_identity(dt, C, 0.0))
    return Linearisation(D, C, None)


def linearise(u: Tensor, gx: Tensor, w_hh: Tensor, dt=None, out_C=None) -> Linearisation:
    """The adjoint coefficients ``D`` ``(..., 2H)`` and ``C`` ``(..., 5H)`` of the steps from
    states ``u`` ``(..., 2H)`` with input gates ``gx`` ``(..., 4H)`` (one GEMM)."""
    return _coefficients(u, activated_gates(u, gx, w_hh), dt, out_C)


def linearise_kept(u: Tensor, kept: Tensor, dt=None, out_C=None) -> Linearisation:
    """:func:`linearise` from the gates ``[i, f, g, o]`` that :func:`step` kept."""
    return _coefficients(u, kept, dt, out_C)


def _gate_grads(lam: Tensor, C: Tensor, out: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``d = [C_i s, C_f s, C_g s, C_o lam_h]`` ``(rows, 4, H)`` and ``s = lam_c + A lam_h``
    ``(rows, H)`` for adjoints ``lam`` ``(..., 2H)``. Rows of one step's units are views
    (``unbind``): at a small batch each operation's call costs more than its arithmetic."""
    rows, H = lam.numel() // lam.shape[-1], lam.shape[-1] // 2
    lam_h, lam_c = lam.reshape(rows, 2, H).unbind(1)
    A, C_i, C_f, C_g, C_o = C.reshape(rows, COEFFS, H).unbind(1)
    s = torch.addcmul(lam_c, A, lam_h)
    d = lam.new_empty((rows, 4, H)) if out is None else out.view(rows, 4, H)
    d_i, d_f, d_g, d_o = d.unbind(1)
    torch.mul(C_i, s, out=d_i)
    torch.mul(C_f, s, out=d_f)
    torch.mul(C_g, s, out=d_g)
    torch.mul(C_o, lam_h, out=d_o)
    return d, s


def adjoint_step(lam: Tensor, D: Tensor, C: Tensor, w_hh: Tensor, out=None) -> Tensor:
    """``J^T lam`` for adjoints ``lam`` ``(..., 2H)`` (``[lam_h', lam_c']``) of steps with
    coefficients ``D``, ``C`` (:func:`linearise`)."""
    H = w_hh.shape[1]
    rows = lam.numel() // lam.shape[-1]
    d, s = _gate_grads(lam, C, None)
    D_h, D_c = D.reshape(rows, 2, H).unbind(1)
    new = lam.new_empty(lam.shape) if out is None else out
    new_h, new_c = new.view(rows, 2, H).unbind(1)
    direct = torch.mul(D_h, lam.reshape(rows, 2, H)[:, 0])
    torch.addmm(direct, d.view(rows, 4 * H), w_hh, out=new_h)
    torch.mul(D_c, s, out=new_c)
    return new


def gate_grads(lam_next: Tensor, C: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """The gradient of the gate pre-activations ``(..., 4H)`` of steps whose outputs'
    adjoints are ``lam_next`` ``(..., 2H)``: the rows of ``dW_ih = d^T x``, ``dW_hh = d^T h``,
    ``db = sum d``, ``dx = d W_ih``."""
    d, _ = _gate_grads(lam_next, C, out)
    return d.view(*lam_next.shape[:-1], d.shape[1] * d.shape[2])


def reference_layer(x, u0, w_ih, w_hh, b_ih, b_hh, mask=None) -> tuple[Tensor, Tensor]:
    """``(states (T, B, 2H), u_n)`` of one layer in plain autograd code, one step after
    another (differentiable to any order; for double backward and torch.func)."""
    H = w_hh.shape[1]
    gx = x @ w_ih.t()
    bias = fold_bias(b_ih, b_hh)
    if bias is not None:
        gx = gx + bias
    u, out = u0, []
    for t in range(x.shape[0]):
        h, c = u[..., :H], u[..., H:]
        i, f, g, o = (gx[t] + h @ w_hh.t()).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        new = torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=-1)
        u = new if mask is None else torch.where(mask[t].unsqueeze(-1) > 0, new, u)
        out.append(u)
    return torch.stack(out), u


def affine_scan(f: Tensor, b: Tensor, c0: Tensor, out: Tensor) -> Tensor:
    """``c_{t+1} = f_t c_t + b_t`` for the ``T`` steps of ``f``, ``b`` ``(T, ...)`` from ``c0``:
    all ``c_1 .. c_T`` into ``out`` ``(T, ...)``, in about ``3 sqrt(T)`` operations instead of
    ``T``. Blocks of ``K ~ sqrt(T)`` steps run side by side from 0 (each block's own offset
    and factor product), the blocks' starts then follow one after another, and every step
    adds its block's start times its factor product. No division: factors that underflow to
    0 are exact, and the result is the sequential recurrence up to rounding."""
    T = f.shape[0]
    K = max(1, math.isqrt(T))
    n = -(-T // K)
    if n * K > T:  # identity steps to whole blocks
        extra = (n * K - T, *f.shape[1:])
        f, b = torch.cat([f, f.new_ones(extra)]), torch.cat([b, b.new_zeros(extra)])
    fb, bb = f.view(n, K, *f.shape[1:]), b.view(n, K, *b.shape[1:])
    local = f.new_empty((n, K, *f.shape[1:]))  # each block's states from 0
    prod = f.new_empty((n, K, *f.shape[1:]))  # and its factor products
    local[:, 0], prod[:, 0] = bb[:, 0], fb[:, 0]
    for k in range(1, K):
        torch.addcmul(bb[:, k], fb[:, k], local[:, k - 1], out=local[:, k])
        torch.mul(fb[:, k], prod[:, k - 1], out=prod[:, k])
    starts = f.new_empty((n, *f.shape[1:]))
    starts[0] = c0
    for j in range(1, n):
        torch.addcmul(local[j - 1, K - 1], prod[j - 1, K - 1], starts[j - 1], out=starts[j])
    full = local.addcmul_(prod, starts.unsqueeze(1)).view(n * K, *f.shape[1:])
    return out.copy_(full[:T])


def fused_forward(x, u0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
    """The points ``(T + 1, B, 2H)`` of the serial forward by ``torch._VF.lstm`` (the kernel of
    ``torch.nn.LSTM``): h at every point, c at the ends only (the kernel returns no more; the
    inner c are zero until :func:`complete_points` rebuilds them, where a backward needs
    them). None where cuDNN refuses the shape."""
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    params = [w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else [])
    hx = (u0[:, :H].unsqueeze(0).contiguous(), u0[:, H:].unsqueeze(0).contiguous())
    try:
        y, _, c_n = torch._VF.lstm(x, hx, params, b_ih is not None, 1, 0.0, False, False, False)
    except RuntimeError as exc:  # as the GRU's: cuDNN refuses some lengths outright
        if "CUDNN_STATUS" in str(exc):
            return None
        raise
    points = x.new_empty((T + 1, B, 2 * H))
    points[0] = u0
    points[1:, :, :H] = y
    points[1:T, :, H:] = 0.0
    points[T, :, H:] = c_n[0]
    return points


def complete_points(points, x, w_ih, w_hh, b_ih, b_hh, block: int = 4096) -> Tensor:
    """A copy of a :func:`fused_forward`'s points with the inner c rebuilt from the h's: the
    gates of all steps are one GEMM (per block of ``block`` steps) and ``c_{t+1} = f_t c_t +
    i_t g_t`` a linear recurrence with known coefficients (:func:`affine_scan`)."""
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    points = points.clone()
    bias = fold_bias(b_ih, b_hh)
    for k0 in range(0, T - 1, block):  # c_T is the kernel's
        k1 = min(T - 1, k0 + block)
        gx = x[k0:k1] @ w_ih.t()
        if bias is not None:
            gx += bias
        a = activated_gates(points[k0:k1], gx, w_hh).view(k1 - k0, B, 4 * H)  # reads h only
        i, f, g = a[..., :H], a[..., H : 2 * H], a[..., 2 * H : 3 * H]
        c = torch.empty_like(f)
        affine_scan(f, i * g, points[k0, :, H:], out=c)
        points[k0 + 1 : k1 + 1, :, H:] = c
    return points


def _forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh) -> tuple:
    """torch's LSTM kernel over detached leaves under autograd: ``(leaves, (y, h_n, c_n))``,
    the graph :func:`fused_vjp` runs back through."""
    H = w_hh.shape[1]
    biased = b_ih is not None
    leaves = [
        t.detach().requires_grad_()
        for t in (x, u0[:, :H], u0[:, H:], w_ih, w_hh, *((b_ih, b_hh) if biased else ()))
    ]
    x_, h0, c0, *params = leaves
    with torch.enable_grad():
        outs = torch._VF.lstm(
            x_, (h0.unsqueeze(0), c0.unsqueeze(0)), params, biased, 1, 0.0, True, False, False
        )
    return leaves, tuple(outs)


def fused_forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh) -> tuple[Optional[Tensor], Optional[tuple]]:
    """``(points, graph)``: :func:`fused_forward`'s points by torch's kernel run under
    autograd (as torch.nn.LSTM runs it in training) and its graph, which :func:`fused_vjp`
    runs back through instead of running the forward again; ``(None, None)`` where cuDNN
    refuses the shape."""
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    try:
        graph = _forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh)
    except RuntimeError as exc:
        if "CUDNN_STATUS" in str(exc):
            return None, None
        raise
    y, _, c_n = graph[1]
    points = x.new_empty((T + 1, B, 2 * H))
    points[0] = u0
    points[1:, :, :H] = y.detach()
    points[1:T, :, H:] = 0.0
    points[T, :, H:] = c_n[0].detach()
    return points, graph


def fused_vjp(x, u0, w_ih, w_hh, b_ih, b_hh, d_states, d_last, graph=None) -> Optional[tuple]:
    """``(dx, du0, dW_ih, dW_hh, db_ih, db_hh)`` of one layer by torch's LSTM kernel and its
    own backward, from the gradients of the states after every step ``d_states`` ``(T, B,
    2H)`` (their c half zero: the kernel takes gradients of h only) and of the last state
    ``d_last`` ``(B, 2H)``: back through ``graph`` (a :func:`fused_forward_graph`'s, freed
    here), else the forward run again under autograd. None where cuDNN refuses the shape."""
    H = w_hh.shape[1]
    biased = b_ih is not None
    try:
        leaves, (y, h_n, c_n) = graph or _forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh)
        with torch.enable_grad():
            grads = torch.autograd.grad(
                (y, h_n, c_n),
                leaves,
                (d_states[..., :H], d_last[:, :H].unsqueeze(0), d_last[:, H:].unsqueeze(0)),
            )
    except RuntimeError as exc:
        if "CUDNN_STATUS" in str(exc):
            return None
        raise
    d_x, d_h0, d_c0, d_w_ih, d_w_hh, *d_b = grads
    d_b_ih, d_b_hh = d_b if biased else (None, None)
    return d_x, torch.cat([d_h0, d_c0], dim=-1), d_w_ih, d_w_hh, d_b_ih, d_b_hh


def _triton():
    """The LSTM's Triton sweeps (:mod:`mgrit_gru.lstm.lstm_triton`), imported at the first one:
    they need triton, which a CPU-only install may lack."""
    from . import lstm_triton

    return lstm_triton


class LSTMCell:
    """The LSTM as a :class:`mgrit_gru.layer.cell.Cell`: state ``[h, c]``; coarse levels by
    the frozen-gate or secant chunk maps (it has no implicit step); the serial forward by
    torch's LSTM kernel (:func:`fused_forward`; c rebuilt only where a backward needs it:
    :func:`complete_points`), the serial adjoint by its backward (:func:`fused_vjp`)."""

    name = "lstm"
    gates, state, kept, coeffs, extra = 4, 2, KEPT, COEFFS, 0
    fused = fused_adjoint = True
    fused_complete = False  # torch's kernel returns c at the end only
    implicit = None
    # Against the GRU's steps (H = 64, one thread; benchmarks/lstm_costs.py, on an Intel
    # Xeon: ratios, which the machine moves less than the times): the library's step and
    # adjoint step; the serial forward by torch's kernel, its serial adjoint by torch's
    # backward (both against the GRU's fused forward).
    costs = {
        "step": ("step", 1.0, 1.4),
        "adjoint": ("adjoint", 2.7, 1.85),
        # torch's kernel: per step 0.05 / 0.3 of the GRU's fused overhead, and a fixed cost per
        # call (its primitive's set-up: 60 us forward, 250 us for the backward's two runs on
        # the AMD EPYC, 2026-12-05: benchmarks/lstm_costs.py), the fourth entry, in units of
        # the GRU's fused o
        "fused": ("fused", 0.05, 0.5, 5.0),
        "fused_adjoint": ("fused", 0.3, 3.8, 21.0),
        # the compiled sweeps (AMD EPYC, 2026-12-04; their overhead is ~0 for both cells)
        "sweep": ("sweep", 1.0, 1.36),
        "sweep_adjoint": ("sweep_adjoint", 1.0, 1.58),
    }
    # the serial solve beside the compiled CPU sweeps: torch's kernel or theirs, whichever the
    # cost model prices lower (mgrit_gru.cost.SERIAL_KINDS)
    serial_kinds = ("lstm_torch", "lstm_torch_adjoint", "lstm_sweep", "lstm_sweep_adjoint")

    def __init__(self, kernels: Optional[str] = None) -> None:
        self.kernels = kernels  # mgrit_gru.kernels.CHOICES, or None: the process default

    def __repr__(self) -> str:
        return "LSTMCell()"

    def fold_bias(self, b_ih, b_hh, H: int):
        return fold_bias(b_ih, b_hh)

    def recurrent_bias(self, b_hh, H: int):
        return None  # both biases fold into the input gates

    def step(self, u, gx, w_hh, rb, dt=None, out=None, keep=None, factor=None) -> Tensor:
        return step(u, gx, w_hh, dt, out, keep, factor)

    def linearise(self, u, gx, w_hh, rb, dt=None, out_C=None) -> Linearisation:
        return linearise(u, gx, w_hh, dt, out_C)

    def linearise_kept(self, u, kept, dt=None, out_C=None) -> Linearisation:
        return linearise_kept(u, kept, dt, out_C)

    def adjoint_step(self, lam, D, C, w_hh, out=None) -> Tensor:
        return adjoint_step(lam, D, C, w_hh, out)

    def gate_grads(self, lam_next, C, extra, out=None) -> tuple[Tensor, Tensor]:
        d = gate_grads(lam_next, C, None if out is None else out[0])
        return d, d  # both biases and both weights see the same pre-activations

    # The compiled sweeps: ``kernel`` is what mgrit_gru.kernels.compiled_for chose, the C++
    # module (its lstm_* functions, lstm_cpu.cpp) or the Triton token (name "triton"), on which
    # the LSTM launches its own Triton sweeps (lstm_triton.py; same arguments).

    def kernel_forward(
        self, kernel, x0, out, gx, w_hh, rb, g, keep, factor, dt, pad, j0, check=()
    ) -> None:
        run = _triton().forward if kernel.name == "triton" else kernel.lstm_forward
        run(x0, out, gx, w_hh, g, keep, factor, dt, *pad, j0, *check)

    def kernel_adjoint(self, kernel, x0, out, D, C, w_hh, g, check=()) -> None:
        run = _triton().adjoint if kernel.name == "triton" else kernel.lstm_adjoint
        run(x0, out, D, C, w_hh, g, *check)

    def compiled_passes(self, kernel) -> bool:
        return hasattr(kernel, "lstm_coefficients")  # the C++ module's; not the Triton token

    def kernel_coefficients(self, kernel, points, kept, dt, D, C, extra) -> None:
        kernel.lstm_coefficients(points, kept, dt, D, C)

    def kernel_gate_grads(self, kernel, lam_rev, C_rev, extra, buffer) -> tuple:
        d = buffer("bwd.d_gx")
        kernel.lstm_gate_grads(lam_rev, C_rev, d)
        return d, d, None  # both biases and weights see the same pre-activations

    def kernel_vjp(self, kernel, points, kept, dt, w_hh, d_out, d_last) -> tuple:
        T, B, H = kept.shape[0], kept.shape[1], w_hh.shape[1]
        d = workspace.buffer("bwd.d_gx", (T, B, 4 * H), points)  # pooled, as the GRU's
        lam0 = points.new_empty((B, 2 * H))
        run = _triton().serial_adjoint if kernel.name == "triton" else kernel.lstm_serial_adjoint
        run(points, kept, d_out, d_last, dt, w_hh, d, lam0)
        return d, d, lam0, None  # both biases and weights see the same pre-activations

    def fused_forward(self, x, u0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
        return fused_forward(x, u0, w_ih, w_hh, b_ih, b_hh)

    def complete_points(self, points, x, w_ih, w_hh, b_ih, b_hh) -> Tensor:
        return complete_points(points, x, w_ih, w_hh, b_ih, b_hh)

    def fused_forward_graph(self, x, u0, w_ih, w_hh, b_ih, b_hh) -> tuple:
        return fused_forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh)

    def fused_vjp(
        self, x, u0, w_ih, w_hh, b_ih, b_hh, d_states, d_last, graph=None
    ) -> Optional[tuple]:
        return fused_vjp(x, u0, w_ih, w_hh, b_ih, b_hh, d_states, d_last, graph)

    def reference_layer(self, x, u0, w_ih, w_hh, b_ih, b_hh, mask=None):
        return reference_layer(x, u0, w_ih, w_hh, b_ih, b_hh, mask)

    def state_clamp(self, u0: Tensor):
        """``h = o tanh(c)`` lies in (-1, 1) after a step: h is clamped to ``max(1, |h0|)``;
        ``c`` (which grows by at most 1 a step) is left as it is."""
        H = u0.shape[-1] // 2
        bound = max(1.0, u0[..., :H].abs().max().item())

        def clamp(states: Tensor) -> Tensor:
            states[..., :H].clamp_(-bound, bound)
            return states

        return clamp
