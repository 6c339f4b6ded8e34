"""LSTM math for the time-stepping solvers: the step on the stacked state ``u = [h, c]``,
its linearisation and the gate gradients.

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
    lam_h  = d @ W_hh
    lam_c  = f * s

with ``C_i = g i (1 - i)``, ``C_f = c f (1 - f)``, ``C_g = i (1 - g^2)``, ``C_o = tanh(c') o
(1 - o)``, all of the forward step: six coefficients per hidden unit (:data:`COEFFS`). With the
gates frozen a step maps ``c`` affinely (``c' = f c + i g``): the factor ``f`` is the LSTM's
analogue of the GRU's ``z``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

COEFFS = 6  # per hidden unit: A, C_i, C_f, C_g, C_o, f


def fold_bias(b_ih: Optional[Tensor], b_hh: Optional[Tensor]) -> Optional[Tensor]:
    """The input-gate bias that :func:`step` expects: ``b_ih + b_hh``."""
    if b_ih is None or b_hh is None:
        return b_ih if b_hh is None else b_hh
    return b_ih + b_hh


def gates(u: Tensor, gx: Tensor, w_hh: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(i, f, g, o)`` of a step from states ``u`` ``(..., 2H)`` and input gates ``gx``
    ``(..., 4H)``: one GEMM."""
    H = w_hh.shape[1]
    h = u[..., :H]
    a = torch.addmm(gx.reshape(-1, 4 * H), h.reshape(-1, H), w_hh.t()).view(gx.shape)
    i, f, g, o = a.chunk(4, dim=-1)
    return torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)


def step(
    u: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    out: Optional[Tensor] = None,
    dt: Optional[Tensor] = None,
) -> Tensor:
    """One LSTM step of states ``u`` ``(..., 2H)`` (``[h, c]``) with input gates ``gx``
    ``(..., 4H)``; ``dt`` ``(..., 1)`` in {0, 1}: 0 is the identity step (padding, a
    sequence past its length). Writes into ``out`` if given."""
    H = w_hh.shape[1]
    i, f, g, o = gates(u, gx, w_hh)
    c_new = f * u[..., H:] + i * g
    h_new = o * torch.tanh(c_new)
    new = torch.cat([h_new, c_new], dim=-1)
    if dt is not None:
        new = torch.where(dt > 0, new, u)
    if out is None:
        return new
    return out.copy_(new)


class Linearisation(NamedTuple):
    """A step's VJP coefficients ``(..., 6H)`` (:data:`COEFFS`, in that order)."""

    coeffs: Tensor


def linearise(u: Tensor, gx: Tensor, w_hh: Tensor, dt: Optional[Tensor] = None) -> Tensor:
    """The VJP coefficients ``(..., 6H)`` of the steps from states ``u`` ``(..., 2H)`` with
    input gates ``gx`` ``(..., 4H)`` (``dt`` 0: the identity step, whose VJP passes ``lam``
    through: coefficients ``A = 0, C = 0, f = 1`` and ``lam_h`` kept by :func:`adjoint_step`)."""
    H = w_hh.shape[1]
    i, f, g, o = gates(u, gx, w_hh)
    c = u[..., H:]
    tc = torch.tanh(f * c + i * g)
    coeffs = torch.cat(
        [
            o * (1 - tc * tc),
            g * i * (1 - i),
            c * f * (1 - f),
            i * (1 - g * g),
            tc * o * (1 - o),
            f,
        ],
        dim=-1,
    )
    if dt is not None:  # identity: A = C = 0, f = 1 (lam_c passes, lam_h by adjoint_step)
        identity = torch.zeros_like(coeffs)
        identity[..., 5 * H :] = 1.0
        coeffs = torch.where(dt > 0, coeffs, identity)
    return coeffs


def adjoint_step(
    lam: Tensor,
    coeffs: Tensor,
    w_hh: Tensor,
    dt: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """``J^T lam`` for adjoints ``lam`` ``(..., 2H)`` (``[lam_h', lam_c']``) of steps with
    coefficients ``coeffs`` (:func:`linearise`); ``dt`` 0 steps pass ``lam`` through."""
    H = w_hh.shape[1]
    lam_h, lam_c = lam[..., :H], lam[..., H:]
    A, C_i, C_f, C_g, C_o, f = coeffs.split(H, dim=-1)
    s = lam_c + A * lam_h
    d = torch.cat([C_i * s, C_f * s, C_g * s, C_o * lam_h], dim=-1)
    new_h = (d.reshape(-1, 4 * H) @ w_hh).view(lam_h.shape)
    if dt is not None:
        new_h = torch.where(dt > 0, new_h, lam_h)
    new = torch.cat([new_h, f * s], dim=-1)
    if out is None:
        return new
    return out.copy_(new)


def gate_grads(lam_next: Tensor, coeffs: Tensor) -> Tensor:
    """The gradient of the gate pre-activations ``(..., 4H)`` of steps whose outputs'
    adjoints are ``lam_next`` ``(..., 2H)``: the rows of ``dW_ih = d^T x``, ``dW_hh = d^T h``,
    ``db = sum d``, ``dx = d W_ih``."""
    H = lam_next.shape[-1] // 2
    lam_h, lam_c = lam_next[..., :H], lam_next[..., H:]
    A, C_i, C_f, C_g, C_o, _ = coeffs.split(H, dim=-1)
    s = lam_c + A * lam_h
    return torch.cat([C_i * s, C_f * s, C_g * s, C_o * lam_h], dim=-1)
