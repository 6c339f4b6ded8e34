"""GRU math shared by every solver and backend: steps, their linearisation, gradients.

Gates are stacked (r, z, n) as in ``torch.nn.GRU``. With ``gx = W_ih x + b_ih`` (precomputed
for all steps) and ``gh = W_hh h + b_hh``::

    r = sigmoid(gx_r + gh_r)   z = sigmoid(gx_z + gh_z)   n = tanh(gx_n + r * gh_n)
    h' = h + theta * (n - h)

    classic step  (torch.nn.GRU, forward Euler with dt = 1):  theta = dt (1 - z)
    implicit step (Moon & Cyr 2022; stable for any dt):        theta = dt (1 - z) / (1 + dt (1 - z))

``dt = 0`` is the identity step (used to pad grids). The vector-Jacobian product of one step
is linear in the incoming adjoint ``lam``::

    J^T lam = D * lam + (C * [lam, lam, lam]) @ W_hh

with per-step coefficients ``D`` (shape ``(..., H)``) and ``C`` (``(..., 3H)``); the gradient of
the gate pre-activations of the input side is ``[C_r, C_z, A_n] * lam``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

CELLS = ("classic", "implicit")


def recurrent_gates(h: Tensor, w_hh: Tensor, b_hh: Optional[Tensor]) -> Tensor:
    """``W_hh h + b_hh`` for states ``h`` of shape ``(..., H)`` -> ``(..., 3H)``: one GEMM."""
    flat = h.reshape(-1, h.shape[-1])
    out = flat @ w_hh.t() if b_hh is None else torch.addmm(b_hh, flat, w_hh.t())
    return out.view(*h.shape[:-1], w_hh.shape[0])


def step(
    h: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: str,
    dt: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """One GRU step for a batch of states.

    Args:
        h: states ``(..., H)``.
        gx: input gates ``(..., 3H)``, broadcastable against ``h``'s leading shape.
        cell: ``"classic"`` or ``"implicit"``.
        dt: step sizes broadcastable to ``(..., 1)``; None means 1.
        out: optional output ``(..., H)``.
    """
    H = h.shape[-1]
    gh = recurrent_gates(h, w_hh, b_hh)
    rz = torch.sigmoid(gh[..., : 2 * H].add_(gx[..., : 2 * H]))
    r, z = rz[..., :H], rz[..., H:]
    n = torch.tanh(torch.addcmul(gx[..., 2 * H :], r, gh[..., 2 * H :]))
    if cell == "classic" and dt is None:
        return torch.lerp(n, h, z, out=out)  # n + z (h - n) = h + (1 - z)(n - h)
    theta = torch.rsub(z, 1.0)
    if dt is not None:
        theta.mul_(dt)
    if cell == "implicit":
        theta = theta.div_(theta + 1.0)
    return torch.lerp(h, n, theta, out=out)


class Linearisation(NamedTuple):
    D: Tensor  # (..., H)   dh'/dh through the direct path
    C: Tensor  # (..., 3H)  dh'/d(gh) per unit of lam, gates (r, z, n)
    A_n: Tensor  # (..., H) dh'/d(pre-activation of n) per unit of lam


def linearise(
    h: Tensor,
    gx: Tensor,
    w_hh: Tensor,
    b_hh: Optional[Tensor],
    cell: str,
    dt: Optional[Tensor] = None,
) -> Linearisation:
    """Adjoint coefficients of :func:`step` at states ``h`` (any leading shape, all at once)."""
    H = h.shape[-1]
    gh = recurrent_gates(h, w_hh, b_hh)
    rz = torch.sigmoid(gx[..., : 2 * H] + gh[..., : 2 * H])
    r, z = rz[..., :H], rz[..., H:]
    ghn = gh[..., 2 * H :]
    n = torch.tanh(torch.addcmul(gx[..., 2 * H :], r, ghn))
    a = 1.0 - z
    step_size = 1.0 if dt is None else dt
    w = a * step_size
    if cell == "classic":
        theta = w
        dtheta_dz = -torch.ones_like(z) * step_size
    else:
        theta = w / (1.0 + w)
        dtheta_dz = -step_size / (1.0 + w) ** 2
    D = 1.0 - theta
    A_n = theta * (1.0 - n * n)
    K_z = (n - h) * dtheta_dz
    C = torch.cat([A_n * ghn * r * (1.0 - r), K_z * z * (1.0 - z), A_n * r], dim=-1)
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
    d_gx: Tensor  # (T, B, 3H) gradient of W_ih x + b_ih
    d_gh: Tensor  # (T, B, 3H) gradient of W_hh h + b_hh


def gate_grads(lam_next: Tensor, lin: Linearisation) -> GateGrads:
    """Gate pre-activation gradients of every step at once from ``lam_{i+1}`` ``(T, B, H)``."""
    lam3 = lam_next.repeat(*([1] * (lam_next.dim() - 1)), 3)
    d_gh = lin.C * lam3
    d_gx = d_gh.clone()
    H = lam_next.shape[-1]
    d_gx[..., 2 * H :] = lin.A_n * lam_next
    return GateGrads(d_gx, d_gh)
