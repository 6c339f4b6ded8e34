"""One autograd.Function per layer and direction of any cell: forward solve + adjoint solve."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import trace, workspace
from ..core.cycle import LocalComm
from ..options import MGRIT
from ..stats import RunStats, SolveStats
from .solve import adjoint_solve, compiled_kernel, compiled_passes, forward_solve

# rows (steps x batch) per call of a cell's compiled gate gradients (kernel_gate_grads): a
# block's GEMMs are large enough to run at the GEMM's rate on every thread, its two gate
# buffers (rows x gates x H each) stay bounded at long sequences
GATE_BLOCK_ROWS = 1 << 16


class LayerFunction(torch.autograd.Function):
    """``u, u_n = layer(x, u0)`` for x ``(T, B, I)``, u0 ``(B, S)`` (the cell's state, ``S =
    cell.state * H``; the GRU's h, the LSTM's [h, c]); u ``(T, B, S)``.

    ``u`` holds the state after every step (past a sequence's length: its final state; the
    module takes the outputs h from it and zeroes those past the length)."""

    @staticmethod
    def forward(
        ctx,
        x,
        h0,
        w_ih,
        w_hh,
        b_ih,
        b_hh,
        cell,
        options: MGRIT,
        record: RunStats,
        where: tuple[int, bool],
        mask: Optional[Tensor],
        tg,
        keep: bool,
        control,
    ):
        keep = keep and any(ctx.needs_input_grad[:6])
        points, hier, stats = forward_solve(
            x, h0, w_ih, b_ih, w_hh, b_hh, cell, options, where, mask, tg, keep, control
        )
        record.forward.append(stats)
        ctx.save_for_backward(x, h0, w_ih, w_hh, b_ih, b_hh, points, mask)
        ctx.hier, ctx.cell, ctx.options, ctx.record, ctx.where = hier, cell, options, record, where
        ctx.tg, ctx.control = tg, control
        T = x.shape[0]
        # the global end state lives on the last rank (in this direction)
        comm = LocalComm(where[1]) if tg is None else tg.comm(reverse=where[1])
        h_n = comm.last(points[T].clone())
        # a tensor of its own, not a view of the saved points: the caller may change it in
        # place (y.relu_(), y[0] = 0), as torch's RNNs allow, without touching the backward's
        return points[1:].clone(), h_n

    @staticmethod
    def backward(ctx, d_y, d_hn):
        if torch.is_grad_enabled():  # create_graph=True: the backward must be differentiable
            return _differentiable_backward(ctx, d_y, d_hn)
        x, _, w_ih, w_hh, b_ih, b_hh, points, mask = ctx.saved_tensors
        tg = ctx.tg
        comm = LocalComm(ctx.where[1]) if tg is None else tg.comm(reverse=ctx.where[1])
        d_hn = comm.sum_(d_hn.clone())  # every rank's loss may use h_n: sum, apply it at the end
        if tg is not None and tg.rank != comm.order[-1]:
            d_hn.zero_()
        adj = adjoint_solve(
            points,
            x,
            w_ih,
            b_ih,
            ctx.hier,
            w_hh,
            b_hh,
            ctx.cell,
            ctx.options,
            d_y,
            d_hn,
            ctx.where,
            mask,
            tg,
            ctx.control,
        )
        ctx.record.backward.append(adj.stats)
        need = ctx.needs_input_grad
        if adj.grads is not None:  # torch's kernel solved it (one process: nothing to sum)
            d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh = adj.grads
        elif adj.gates is not None:  # a compiled serial adjoint (one process): its GEMMs
            d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh = _gate_gemms(
                *adj.gates, x, w_ih, points, w_hh.shape[1], need[0]
            )
        else:
            d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh = _gradients(
                adj, x, w_ih, w_hh, points, ctx.cell, comm, need[0]
            )
        return (
            d_x if need[0] else None,
            d_h0 if need[1] else None,
            d_w_ih if need[2] else None,
            d_w_hh if need[3] else None,
            d_b_ih if b_ih is not None and need[4] else None,
            d_b_hh if b_hh is not None and need[5] else None,
            *(None,) * 8,  # cell, options, record, where, mask, tg, keep, control
        )


def _gradients(adj, x, w_ih, w_hh, points, cell, comm, need_x: bool) -> tuple:
    """``(dx, du0, dW_ih, dW_hh, db_ih, db_hh)`` from the solved adjoint, summed over a time
    group's ranks. Parallel over time: per block, the gate gradients of all its steps, then
    GEMMs over its rows."""
    T, B, I = x.shape
    H = w_hh.shape[1]
    d_x = x.new_empty(x.shape) if need_x else None
    d_w_ih, d_w_hh = torch.zeros_like(w_ih), torch.zeros_like(w_hh)
    d_b_ih = w_hh.new_zeros(w_hh.shape[0])
    d_b_hh = w_hh.new_zeros(w_hh.shape[0])
    grads = (d_w_ih, d_w_hh, d_b_ih, d_b_hh)
    with trace.bulk("gradients", T * B, H, x):
        compiled = _compiled_gradients(adj, cell, x, w_ih, points, d_x, grads)
        for k0, k1, lam, C, extra in () if compiled else adj.blocks(T, B):
            shape = (*C.shape[:-1], w_hh.shape[0])
            out = [workspace.buffer(f"bwd.block {name}", shape, C) for name in ("d_gx", "d_gh")]
            d_gx, d_gh = cell.gate_grads(lam, C, extra, out)
            _block_gemms(d_gx, d_gh, None, k0, k1, x, w_ih, points, d_x, grads)
    d_h0 = adj.lam_rev[T].clone()
    if not comm.first:  # parameters and h0 are shared by the time slices
        d_h0.zero_()
    _sum_together(comm, (d_w_ih, d_w_hh, d_b_ih, d_b_hh, d_h0))
    return d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh


def _sum_together(comm, tensors: tuple) -> None:
    """``tensors`` summed over a time group's ranks, in place, in one all-reduce (one message
    and one wait for the slowest rank, not one per tensor: each costs a message's latency,
    98-264 us over gloo's loopback here); a sum is elementwise: the same values, up to the
    order in which more than two ranks' additions meet."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    comm.sum_(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def _compiled_gradients(adj, cell, x, w_ih, points, d_x, grads) -> bool:
    """:func:`_gradients`' loop where the cell runs its gate gradients compiled for this
    layer's kernel (:func:`~mgrit_gru.layer.solve.compiled_passes`): per block of
    GATE_BLOCK_ROWS rows one parallel pass for the gate gradients, then the GEMMs over the
    block's rows, into ``d_x`` and ``grads`` ``(dW_ih, dW_hh, db_ih, db_hh)`` (zeros:
    accumulated). False where it does not (nothing written then)."""
    kernel = compiled_kernel(cell, x)
    if not compiled_passes(cell, kernel):
        return False
    T, B = x.shape[:2]
    C_rev, lam_rev = adj.C_rev, adj.lam_rev
    G = w_ih.shape[0]
    steps = max(1, GATE_BLOCK_ROWS // max(B, 1))
    for k0 in range(0, T, steps):
        k1 = min(T, k0 + steps)
        C, lam = C_rev[T - k1 : T - k0], lam_rev[T - k1 : T - k0]
        extra = None if adj.extra is None else adj.extra[k0:k1].contiguous()

        def buffer(name: str, rows: int = k1 - k0) -> Tensor:
            return workspace.buffer(name, (rows, B, G), C_rev)

        d_gx, d_gh, sums = cell.kernel_gate_grads(kernel, lam, C, extra, buffer)
        _block_gemms(d_gx, d_gh, sums, k0, k1, x, w_ih, points, d_x, grads)
    return True


def _block_gemms(d_gx, d_gh, sums, k0, k1, x, w_ih, points, d_x, grads) -> None:
    """Steps ``k0 .. k1 - 1``' share of the gradients from their gate gradients ``(k1 - k0,
    B, G)``: ``d_x`` written, ``grads`` ``(dW_ih, dW_hh, db_ih, db_hh)`` accumulated;
    ``sums``: the biases' share where the kernel took it (else summed here)."""
    I, G, H = x.shape[-1], d_gx.shape[-1], grads[1].shape[1]
    same = d_gh is d_gx  # one tensor (an LSTM's): its column sums serve both biases
    d_gx, d_gh = d_gx.reshape(-1, G), d_gh.reshape(-1, G)
    d_w_ih, d_w_hh, d_b_ih, d_b_hh = grads
    if d_x is not None:
        torch.mm(d_gx, w_ih, out=d_x[k0:k1].view(-1, I))
    d_w_ih.addmm_(d_gx.t(), x[k0:k1].reshape(-1, I))
    d_w_hh.addmm_(d_gh.t(), points[k0:k1, :, :H].reshape(-1, H))
    b_ih, b_hh = _bias_grads(d_gx, d_gh, same, sums)
    d_b_ih += b_ih
    d_b_hh += b_hh


def _bias_grads(rows_gx: Tensor, rows_gh: Tensor, same: bool, sums) -> tuple[Tensor, Tensor]:
    """``(db_ih, db_hh)``: ``sums`` where the kernel took them, else the gate gradients' sums
    over their rows ``(N, G)``; ``same``: one tensor (an LSTM's), whose one sum serves both
    biases (each its own copy)."""
    if sums is not None:
        return sums
    total = rows_gx.sum(0)
    return total, total.clone() if same else rows_gh.sum(0)


def _gate_gemms(d_gx, d_gh, d_h0, sums, x, w_ih, points, H: int, need_x: bool) -> tuple:
    """``(dx, du0, dW_ih, dW_hh, db_ih, db_hh)`` from every step's gate pre-activation
    gradients ``d_gx`` (of ``W_ih x + b_ih``) and ``d_gh`` (of ``W_hh h + b_hh``) ``(T, B,
    G)``, all at once: the GEMMs of :func:`_gradients` over all ``T B`` rows (``dx`` only
    where it is needed); ``sums``: the biases' gradients where the kernel took them."""
    T, B, I = x.shape
    G = d_gx.shape[-1]
    rows_gx, rows_gh = d_gx.reshape(T * B, G), d_gh.reshape(T * B, G)
    d_x = torch.mm(rows_gx, w_ih).view(T, B, I) if need_x else None
    d_w_ih = torch.mm(rows_gx.t(), x.reshape(T * B, I))
    d_w_hh = torch.mm(rows_gh.t(), points[:T, :, :H].reshape(T * B, H))
    return d_x, d_h0, d_w_ih, d_w_hh, *_bias_grads(rows_gx, rows_gh, d_gh is d_gx, sums)


def _differentiable_backward(ctx, d_y, d_hn):
    """The vector-Jacobian product by autograd through the serial recurrence (the cell's
    reference layer), recorded so that it can be differentiated again: the gradient of the
    serial layer, which MGRIT's forward matches within its tolerance."""
    if ctx.tg is not None:
        raise RuntimeError(
            f"mgrit_gru.{ctx.cell.name.upper()}: double backward (create_graph=True) is not "
            "supported with time_group=; run the layer without a time group for gradient penalties"
        )
    x, h0, w_ih, w_hh, b_ih, b_hh, _, mask = ctx.saved_tensors
    ctx.hier.release_kept()
    inputs = (x, h0, w_ih, w_hh, b_ih, b_hh)
    need = [n and t is not None for t, n in zip(inputs, ctx.needs_input_grad[:6])]
    wrt = [t for t, n in zip(inputs, need) if n]
    grads = iter(())
    if wrt:
        y, h_n = ctx.cell.reference_layer(x, h0, w_ih, w_hh, b_ih, b_hh, mask)
        grads = iter(
            torch.autograd.grad((y, h_n), wrt, (d_y, d_hn), create_graph=True, allow_unused=True)
        )
    out = [next(grads) if n else None for n in need]
    ctx.record.backward.append(
        SolveStats("backward", *ctx.where, x.shape[0], 1, 0, (), True, False)
    )
    return (*out, *(None,) * 8)


def solve_layer(
    x,
    h0,
    w_ih,
    w_hh,
    b_ih,
    b_hh,
    cell,
    options,
    record,
    where=(0, False),
    mask=None,
    tg=None,
    control=None,
):
    """One layer and direction of ``cell`` (a :class:`mgrit_gru.layer.cell.Cell`).
    ``mask`` ``(T, B)``: 1 up to each sequence's length, then 0 (the state stays fixed there,
    so the last state is each sequence's state at its own end). ``control``: the module's
    :class:`mgrit_gru.layer.control.AutoChoice` (``solver="auto"``) or
    :class:`~mgrit_gru.layer.control.DivergenceMemory` (``on_divergence="backoff"``), or
    None."""
    keep = options.keep_gates and torch.is_grad_enabled()  # else no backward reads them
    return LayerFunction.apply(
        x, h0, w_ih, w_hh, b_ih, b_hh, cell, options, record, where, mask, tg, keep, control
    )
