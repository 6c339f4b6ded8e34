"""One autograd.Function per GRU layer and direction: forward solve + adjoint solve."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .gru import cell as gru
from .gru.solve import adjoint_solve, forward_solve
from .options import MGRIT
from .stats import RunStats


def input_gates(x: Tensor, w_ih: Tensor, b_ih: Optional[Tensor]) -> Tensor:
    """``W_ih x_t + b_ih`` for all t at once: one GEMM over ``T * B`` rows."""
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ w_ih.t() if b_ih is None else torch.addmm(b_ih, flat, w_ih.t())
    return out.view(*x.shape[:-1], w_ih.shape[0])


class GRULayerFunction(torch.autograd.Function):
    """``y, h_n = layer(x, h0)`` for x ``(T, B, I)``, h0 ``(B, H)``; y ``(T, B, H)``."""

    @staticmethod
    def forward(
        ctx,
        x,
        h0,
        w_ih,
        w_hh,
        b_ih,
        b_hh,
        cell: str,
        options: MGRIT,
        record: RunStats,
        where: tuple[int, bool],
    ):
        gx = input_gates(x, w_ih, b_ih)
        points, hier, stats = forward_solve(gx, h0, w_hh, b_hh, cell, options, where)
        record.forward.append(stats)
        ctx.save_for_backward(x, w_ih, w_hh, b_hh, points, gx)
        ctx.hier, ctx.cell, ctx.options, ctx.record, ctx.where = hier, cell, options, record, where
        ctx.has_b_ih = b_ih is not None
        T = x.shape[0]
        return points[1:], points[T].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, d_y, d_hn):
        x, w_ih, w_hh, b_hh, points, gx = ctx.saved_tensors
        T = x.shape[0]
        lam, lin, stats = adjoint_solve(
            points, gx, ctx.hier, w_hh, b_hh, ctx.cell, ctx.options, d_y, d_hn, ctx.where
        )
        ctx.record.backward.append(stats)
        grads = gru.gate_grads(lam[1:], lin)
        H3 = w_hh.shape[0]
        d_gx = grads.d_gx.reshape(-1, H3)
        d_gh = grads.d_gh.reshape(-1, H3)
        need = ctx.needs_input_grad
        d_x = (d_gx @ w_ih).view_as(x) if need[0] else None
        d_h0 = lam[0] if need[1] else None
        d_w_ih = d_gx.t() @ x.reshape(-1, x.shape[-1]) if need[2] else None
        d_w_hh = d_gh.t() @ points[:T].reshape(-1, w_hh.shape[1]) if need[3] else None
        d_b_ih = d_gx.sum(0) if ctx.has_b_ih and need[4] else None
        d_b_hh = d_gh.sum(0) if b_hh is not None and need[5] else None
        return d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh, None, None, None, None


def gru_layer(x, h0, w_ih, w_hh, b_ih, b_hh, cell, options, record, where=(0, False)):
    return GRULayerFunction.apply(x, h0, w_ih, w_hh, b_ih, b_hh, cell, options, record, where)
