"""A GRU layer as plain autograd code: one step after another, every operation recorded.

Slow (one autograd node per operation and step) but differentiable to any order. It serves
where the analytic adjoint cannot: a backward that must itself be differentiated
(``create_graph=True``: gradient penalties, Hessian-vector products).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import cell as gru


def step(h: Tensor, gx: Tensor, w_hh: Tensor, b_hn, cell: str, dt) -> tuple[Tensor, Tensor]:
    """One GRU step out of place (the math of :func:`mgrit_gru.gru.cell.step`; ``gx`` with
    the folded bias of :func:`~mgrit_gru.gru.cell.fold_bias`) and its diagonal factor
    ``1 - theta`` (the frozen-gate chunk maps are products of these)."""
    H = h.shape[-1]
    gh = h @ w_hh.t()
    r = torch.sigmoid(gx[..., :H] + gh[..., :H])
    z = torch.sigmoid(gx[..., H : 2 * H] + gh[..., H : 2 * H])
    ghn = gh[..., 2 * H :] if b_hn is None else gh[..., 2 * H :] + b_hn
    n = torch.tanh(gx[..., 2 * H :] + r * ghn)
    w = 1 - z if dt is None else (1 - z) * dt
    theta = w if cell == "classic" else w / (1 + w)
    return h + theta * (n - h), 1 - theta


def layer(
    x: Tensor,
    h0: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Optional[Tensor],
    b_hh: Optional[Tensor],
    cell: str,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """``y (T, B, H), h_n (B, H)`` of one layer and direction for x ``(T, B, I)``, h0
    ``(B, H)``; ``mask`` ``(T, B)``: 0 past a sequence's length (the state then stays)."""
    H = w_hh.shape[1]
    gx = x @ w_ih.t()
    bias = gru.fold_bias(b_ih, b_hh, H)
    if bias is not None:
        gx = gx + bias
    b_hn = None if b_hh is None else b_hh[2 * H :]
    h, out = h0, []
    for t in range(x.shape[0]):
        dt = None if mask is None else mask[t].unsqueeze(-1)
        h, _ = step(h, gx[t], w_hh, b_hn, cell, dt)
        out.append(h)
    return torch.stack(out), h
