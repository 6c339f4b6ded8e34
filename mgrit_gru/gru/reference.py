"""A GRU layer as plain autograd code: one step after another, every operation recorded.

Slow (one autograd node per operation and step) but differentiable to any order. It serves
where the analytic adjoint cannot: a backward that must itself be differentiated
(``create_graph=True``: gradient penalties, Hessian-vector products).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


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
    if b_ih is not None:
        gx = gx + b_ih
    h, out = h0, []
    for t in range(x.shape[0]):
        gh = h @ w_hh.t()
        if b_hh is not None:
            gh = gh + b_hh
        r = torch.sigmoid(gx[t, :, :H] + gh[:, :H])
        z = torch.sigmoid(gx[t, :, H : 2 * H] + gh[:, H : 2 * H])
        n = torch.tanh(gx[t, :, 2 * H :] + r * gh[:, 2 * H :])
        w = 1 - z
        if mask is not None:
            w = w * mask[t].unsqueeze(-1)
        theta = w if cell == "classic" else w / (1 + w)
        h = h + theta * (n - h)
        out.append(h)
    return torch.stack(out), h
