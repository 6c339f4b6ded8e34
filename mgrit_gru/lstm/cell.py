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

from typing import Optional

import torch
from torch import Tensor

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


def _gate_grads(lam_h: Tensor, lam_c: Tensor, C: Tensor, out: Optional[Tensor]) -> Tensor:
    """``d = [C_i s, C_f s, C_g s, C_o lam_h]``, ``s = lam_c + A lam_h`` ``(..., 4H)``."""
    H = lam_h.shape[-1]
    A, C_i, C_f, C_g, C_o = C.split(H, dim=-1)
    s = torch.addcmul(lam_c, A, lam_h)
    d = lam_h.new_empty((*lam_h.shape[:-1], 4 * H)) if out is None else out
    torch.mul(
        C[..., H : 4 * H].reshape(*s.shape[:-1], 3, H),
        s.unsqueeze(-2),
        out=d[..., : 3 * H].view(*s.shape[:-1], 3, H),
    )
    torch.mul(C_o, lam_h, out=d[..., 3 * H :])
    return d


def adjoint_step(lam: Tensor, D: Tensor, C: Tensor, w_hh: Tensor, out=None) -> Tensor:
    """``J^T lam`` for adjoints ``lam`` ``(..., 2H)`` (``[lam_h', lam_c']``) of steps with
    coefficients ``D``, ``C`` (:func:`linearise`)."""
    H = w_hh.shape[1]
    lead, rows = lam.shape[:-1], lam.numel() // lam.shape[-1]
    lam_h, lam_c = lam[..., :H], lam[..., H:]
    d = _gate_grads(lam_h, lam_c, C, None)
    new = lam.new_empty((rows, 2 * H)) if out is None else out.view(rows, 2 * H)
    direct = (D[..., :H] * lam_h).reshape(rows, H)
    torch.addmm(direct, d.reshape(rows, 4 * H), w_hh, out=new[:, :H])
    s = torch.addcmul(lam_c, C[..., :H], lam_h)
    torch.mul(D[..., H:], s, out=new[:, H:].view(*lead, H))
    return new.view(*lead, 2 * H) if out is None else out


def gate_grads(lam_next: Tensor, C: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """The gradient of the gate pre-activations ``(..., 4H)`` of steps whose outputs'
    adjoints are ``lam_next`` ``(..., 2H)``: the rows of ``dW_ih = d^T x``, ``dW_hh = d^T h``,
    ``db = sum d``, ``dx = d W_ih``."""
    H = lam_next.shape[-1] // 2
    return _gate_grads(lam_next[..., :H], lam_next[..., H:], C, out)


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


class LSTMCell:
    """The LSTM as a :class:`mgrit_gru.layer.cell.Cell`: state ``[h, c]``; coarse levels by
    the frozen-gate or secant chunk maps (it has no implicit step); no fused serial loop
    (torch's LSTM kernel returns h at every step but c only at the end, and the adjoint
    needs c everywhere)."""

    name = "lstm"
    gates, state, kept, coeffs, extra = 4, 2, KEPT, COEFFS, 0
    fused = False
    implicit = None

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

    def fused_forward(self, x, u0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
        return None

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
