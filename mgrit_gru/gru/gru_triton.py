"""The GRU's Triton sweeps: one launch runs steps j0 .. j0 + S - 1 of every chunk, or the
whole serial adjoint. :class:`mgrit_gru.gru.cell.GRUCell`'s ``kernel_forward``,
``kernel_adjoint`` and ``kernel_vjp`` call :func:`forward`, :func:`adjoint` and
:func:`serial_adjoint` when the layer hands them the Triton token
(:func:`mgrit_gru.kernels.gpu.kernels`); the shared helpers and the launch are
:mod:`mgrit_gru.kernels.gpu`'s, which names no cell. The math is :mod:`mgrit_gru.gru.cell`'s
``step``, ``adjoint_step`` and ``_coefficients``, which stay the reference (and
``gru_cpu.cpp`` its compiled CPU twin, with the same arguments)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import gpu
from ..kernels.gpu import dot, load_w, load_wk, put, rows_of, sigmoid, tanh, tile


@triton.jit
def _recurrent(
    h,
    p_prev,
    w,
    rmask,
    W_R,
    W_Z,
    W_N,
    H,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    """``h @ W_hh^T`` per gate (r, z, n): from the held blocks, or in BK-column blocks of the
    state at p_prev (the rows just stored) and W_hh from memory."""
    if BK == BH:
        return dot(h, W_R, PREC), dot(h, W_Z, PREC), dot(h, W_N, PREC)
    acc = h.dtype
    qr = tl.zeros((BR, BH), acc)
    qz = tl.zeros((BR, BH), acc)
    qn = tl.zeros((BR, BH), acc)
    for k0 in tl.static_range(0, BH, BK):
        hb = tile(p_prev, k0, rmask, H - k0, BK)
        qr += dot(hb, load_wk(w, 0, k0, H, BH, BK, True), PREC)
        qz += dot(hb, load_wk(w, H, k0, H, BH, BK, True), PREC)
        qn += dot(hb, load_wk(w, 2 * H, k0, H, BH, BK, True), PREC)
    return qr, qz, qn


@triton.jit
def _forward_kernel(
    x0,
    out,
    gx,
    w,
    bhn,
    g,
    keep,
    fac,
    dt,
    x0_s1,
    x0_s2,
    o_s0,
    o_s1,
    o_s2,
    gx_s0,
    gx_s1,
    gx_s2,
    g_s0,
    g_s1,
    g_s2,
    k_s0,
    k_s1,
    k_s2,
    f_s0,
    f_s1,
    f_s2,
    dt_s0,
    dt_s1,
    dt_s2,
    S,
    R,
    B,
    H,
    pad_c,
    pad_lo,
    pad_hi,
    j0,
    HAS_BIAS: tl.constexpr,
    HAS_G: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_FAC: tl.constexpr,
    HAS_DT: tl.constexpr,
    IMPLICIT: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    c, b, rmask = rows_of(tl.program_id(0), R, B, BR)
    cols = tl.arange(0, BH)
    p_prev = x0 + c * x0_s1 + b * x0_s2
    p_out = out + c * o_s1 + b * o_s2
    p_gx = gx + c * gx_s1 + b * gx_s2
    p_g = g + c * g_s1 + b * g_s2
    p_k = keep + c * k_s1 + b * k_s2
    p_f = fac + c * f_s1 + b * f_s2
    p_dt = dt + c * dt_s1 + b * dt_s2
    W_R = 0.0
    W_Z = 0.0
    W_N = 0.0
    if BK == BH:  # held for every step
        W_R = load_w(w, 0, H, BH, True)
        W_Z = load_w(w, H, H, BH, True)
        W_N = load_w(w, 2 * H, H, BH, True)
    bias = tl.zeros((BH,), tl.float32)
    if HAS_BIAS:
        bias = tl.load(bhn + cols, mask=cols < H, other=0.0)
    h = tile(p_prev, 0, rmask, H, BH)
    for s in range(S):
        qr, qz, qn = _recurrent(h, p_prev, w, rmask, W_R, W_Z, W_N, H, BR, BH, BK, PREC)
        r = sigmoid(tile(p_gx, 0, rmask, H, BH) + qr)
        z = sigmoid(tile(p_gx, H, rmask, H, BH) + qz)
        ghn = qn + bias[None, :].to(qn.dtype)
        n = tanh(tile(p_gx, 2 * H, rmask, H, BH) + r * ghn)
        step = 1.0
        if HAS_DT:
            step = tl.load(p_dt, mask=rmask, other=1.0).to(h.dtype)[:, None]
        theta = (1.0 - z) * step
        if IMPLICIT:
            theta = theta / (theta + 1.0)
        j = j0 + s
        identity = (c == pad_c) & (j >= pad_lo) & (j < pad_hi)
        theta = tl.where(identity[:, None], 0.0, theta)
        new = h + theta * (n - h)
        if HAS_G:
            new += tile(p_g, 0, rmask, H, BH)
        put(p_out, 0, new, rmask, H, BH)
        if HAS_KEEP:
            put(p_k, 0, r, rmask, H, BH)
            put(p_k, H, z, rmask, H, BH)
            put(p_k, 2 * H, n, rmask, H, BH)
            put(p_k, 3 * H, ghn, rmask, H, BH)
        if HAS_FAC:
            put(p_f, 0, 1.0 - theta, rmask, H, BH)
        if BK != BH:  # the next step reads this state back in blocks
            tl.debug_barrier()
        if BK != BH:
            h = tile(p_out, 0, rmask, H, BH)
        else:  # as stored (rounded to a half type's precision)
            h = new.to(out.dtype.element_ty).to(h.dtype)
        p_prev = p_out
        p_out += o_s0
        p_gx += gx_s0
        p_g += g_s0
        p_k += k_s0
        p_f += f_s0
        p_dt += dt_s0


def forward(x0, out, gx, w_hh, b_hn, g, keep, factor, dt, implicit, pad_c, pad_lo, pad_hi, j0):
    """``gru_cpu.cpp``'s ``gru_forward`` (same arguments)."""
    gpu.check("gru_forward", out, x0, gx, w_hh, b_hn, g, keep, factor, dt)
    S, n, B, H = out.shape
    w = w_hh.contiguous()
    ptrs, st = gpu.layout(x0, out, gx, g, keep, factor, dt)
    gpu.launch(
        _forward_kernel,
        n * B,
        ptrs[0],
        ptrs[1],
        ptrs[2],
        w,
        out if b_hn is None else b_hn.contiguous(),
        *ptrs[3:],
        *st,
        S,
        n * B,
        B,
        H,
        pad_c,
        pad_lo,
        pad_hi,
        j0,
        HAS_BIAS=b_hn is not None,
        HAS_G=g is not None,
        HAS_KEEP=keep is not None,
        HAS_FAC=factor is not None,
        HAS_DT=dt is not None,
        IMPLICIT=bool(implicit),
        **gpu.meta(out, H),
    )


@triton.jit
def _adjoint_product(
    lam,
    C,
    p_prev,
    p_C,
    rmask,
    w,
    W_R,
    W_Z,
    W_N,
    H,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    """``(C * [lam, lam, lam]) @ W_hh``: held, or in BK blocks of lam and C from memory."""
    if BK == BH:
        cr = tile(p_C, 0, rmask, H, BH)
        cz = tile(p_C, H, rmask, H, BH)
        cn = tile(p_C, 2 * H, rmask, H, BH)
        return dot(cr * lam, W_R, PREC) + dot(cz * lam, W_Z, PREC) + dot(cn * lam, W_N, PREC)
    acc = tl.zeros((BR, BH), lam.dtype)
    for k0 in tl.static_range(0, BH, BK):
        lb = tile(p_prev, k0, rmask, H - k0, BK)
        acc += dot(tile(p_C, k0, rmask, H - k0, BK) * lb, load_wk(w, 0, k0, H, BH, BK, False), PREC)
        acc += dot(
            tile(p_C, H + k0, rmask, H - k0, BK) * lb, load_wk(w, H, k0, H, BH, BK, False), PREC
        )
        acc += dot(
            tile(p_C, 2 * H + k0, rmask, H - k0, BK) * lb,
            load_wk(w, 2 * H, k0, H, BH, BK, False),
            PREC,
        )
    return acc


@triton.jit
def _adjoint_kernel(
    x0,
    out,
    D,
    C,
    w,
    g,
    x0_s1,
    x0_s2,
    o_s0,
    o_s1,
    o_s2,
    d_s0,
    d_s1,
    d_s2,
    c_s0,
    c_s1,
    c_s2,
    g_s0,
    g_s1,
    g_s2,
    S,
    R,
    B,
    H,
    HAS_G: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    c, b, rmask = rows_of(tl.program_id(0), R, B, BR)
    p_prev = x0 + c * x0_s1 + b * x0_s2
    p_out = out + c * o_s1 + b * o_s2
    p_D = D + c * d_s1 + b * d_s2
    p_C = C + c * c_s1 + b * c_s2
    p_g = g + c * g_s1 + b * g_s2
    W_R = 0.0
    W_Z = 0.0
    W_N = 0.0
    if BK == BH:
        W_R = load_w(w, 0, H, BH, False)
        W_Z = load_w(w, H, H, BH, False)
        W_N = load_w(w, 2 * H, H, BH, False)
    lam = tile(p_prev, 0, rmask, H, BH)
    for _ in range(S):
        new = tile(p_D, 0, rmask, H, BH) * lam
        new += _adjoint_product(lam, C, p_prev, p_C, rmask, w, W_R, W_Z, W_N, H, BR, BH, BK, PREC)
        if HAS_G:
            new += tile(p_g, 0, rmask, H, BH)
        put(p_out, 0, new, rmask, H, BH)
        if BK != BH:
            tl.debug_barrier()
        if BK != BH:
            lam = tile(p_out, 0, rmask, H, BH)
        else:
            lam = new.to(out.dtype.element_ty).to(lam.dtype)
        p_prev = p_out
        p_out += o_s0
        p_D += d_s0
        p_C += c_s0
        p_g += g_s0


def adjoint(x0, out, D, C, w_hh, g):
    """``gru_cpu.cpp``'s ``gru_adjoint``."""
    gpu.check("gru_adjoint", out, x0, D, C, w_hh, g)
    S, n, B, H = out.shape
    ptrs, st = gpu.layout(x0, out, D, C, g)
    gpu.launch(
        _adjoint_kernel,
        n * B,
        *ptrs[:4],
        w_hh.contiguous(),
        ptrs[4],
        *st,
        S,
        n * B,
        B,
        H,
        HAS_G=g is not None,
        **gpu.meta(out, H),
    )


@triton.jit
def _serial_adjoint_kernel(
    points,
    kept,
    d_out,
    d_last,
    dt,
    w,
    d_gx,
    d_gh,
    lam0,
    T,
    B,
    H,
    s_state,
    s_kept,
    s_gates,
    HAS_DT: tl.constexpr,
    IMPLICIT: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    # every tensor contiguous; the pointers given are those of the last step, walked back
    zero, b, rmask = rows_of(tl.program_id(0), B, B, BR)
    W_R = 0.0
    W_Z = 0.0
    W_N = 0.0
    if BK == BH:
        W_R = load_w(w, 0, H, BH, False)
        W_Z = load_w(w, H, H, BH, False)
        W_N = load_w(w, 2 * H, H, BH, False)
    p_h = points + b * H
    p_k = kept + b * 4 * H
    p_f = d_out + b * H
    p_dt = dt + b
    p_gx = d_gx + b * 3 * H
    p_gh = d_gh + b * 3 * H
    lam = tile(p_f, 0, rmask, H, BH) + tile(d_last + b * H, 0, rmask, H, BH)
    for it in range(T):
        k = T - 1 - it
        h = tile(p_h, 0, rmask, H, BH)
        r = tile(p_k, 0, rmask, H, BH)
        z = tile(p_k, H, rmask, H, BH)
        n = tile(p_k, 2 * H, rmask, H, BH)
        ghn = tile(p_k, 3 * H, rmask, H, BH)
        step = 1.0
        if HAS_DT:
            step = tl.load(p_dt, mask=rmask, other=1.0).to(lam.dtype)[:, None]
        oz = 1.0 - z
        wv = oz * step
        Cz = (h - n) * z * oz * step
        if IMPLICIT:
            Dg = 1.0 / (wv + 1.0)
            Cz = Cz * Dg * Dg
            An = wv * Dg * (1.0 - n * n)
        else:
            Dg = 1.0 - wv
            An = wv * (1.0 - n * n)
        gr = An * ghn * r * (1.0 - r) * lam
        gz = Cz * lam
        gn = An * r * lam
        put(p_gx, 0, gr, rmask, H, BH)
        put(p_gx, H, gz, rmask, H, BH)
        put(p_gx, 2 * H, An * lam, rmask, H, BH)
        put(p_gh, 0, gr, rmask, H, BH)
        put(p_gh, H, gz, rmask, H, BH)
        put(p_gh, 2 * H, gn, rmask, H, BH)
        if BK == BH:
            prod = dot(gr, W_R, PREC) + dot(gz, W_Z, PREC) + dot(gn, W_N, PREC)
        else:
            tl.debug_barrier()
            prod = tl.zeros((BR, BH), lam.dtype)
            for k0 in tl.static_range(0, BH, BK):
                prod += dot(
                    tile(p_gh, k0, rmask, H - k0, BK), load_wk(w, 0, k0, H, BH, BK, False), PREC
                )
                prod += dot(
                    tile(p_gh, H + k0, rmask, H - k0, BK), load_wk(w, H, k0, H, BH, BK, False), PREC
                )
                prod += dot(
                    tile(p_gh, 2 * H + k0, rmask, H - k0, BK),
                    load_wk(w, 2 * H, k0, H, BH, BK, False),
                    PREC,
                )
        p_f -= s_state  # the forcing d_out[k - 1] (none at k = 0)
        lam = Dg * lam + prod + tile(p_f, 0, rmask & (b * 0 + k >= 1), H, BH)
        p_h -= s_state  # (steps' strides come as arguments: i64 where they need it)
        p_k -= s_kept
        p_dt -= B
        p_gx -= s_gates
        p_gh -= s_gates
    put(lam0 + b * H, 0, lam, rmask, H, BH)


def serial_adjoint(points, kept, d_out, d_last, dt, implicit, w_hh, d_gx, d_gh, lam0):
    """``gru_cpu.cpp``'s ``gru_serial_adjoint``: contiguous tensors."""
    gpu.check("gru_serial_adjoint", points, kept, d_out, d_last, dt, w_hh, d_gx, d_gh, lam0)
    T, B = kept.shape[0], kept.shape[1]
    H = w_hh.shape[1]
    if T == 0:
        lam0.copy_(d_last)
        return
    last = T - 1
    gpu.launch(
        _serial_adjoint_kernel,
        B,
        gpu.at(points, last),
        gpu.at(kept, last),
        gpu.at(d_out, last),
        d_last.contiguous(),
        gpu.at(dt, last) if dt is not None else points,
        w_hh.contiguous(),
        gpu.at(d_gx, last),
        gpu.at(d_gh, last),
        lam0,
        T,
        B,
        H,
        B * H,
        B * 4 * H,
        B * 3 * H,
        HAS_DT=dt is not None,
        IMPLICIT=bool(implicit),
        **gpu.meta(points, H),
    )
