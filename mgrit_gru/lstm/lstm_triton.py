"""The LSTM's Triton sweeps on the stacked state ``[h, c]``: one launch runs steps j0 .. j0 +
S - 1 of every chunk, or the whole serial adjoint. :class:`mgrit_gru.lstm.cell.LSTMCell`'s
``kernel_forward``, ``kernel_adjoint`` and ``kernel_vjp`` call :func:`forward`,
:func:`adjoint` and :func:`serial_adjoint` when the layer hands them the Triton token
(:func:`mgrit_gru.kernels.gpu.kernels`); the shared helpers and the launch are
:mod:`mgrit_gru.kernels.gpu`'s, which names no cell. The math is :mod:`mgrit_gru.lstm.cell`'s
``step``, ``adjoint_step`` and ``_coefficients``, which stay the reference (and
``lstm_cpu.cpp`` its compiled CPU twin, with the same arguments)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import gpu
from ..kernels.gpu import dot, load_w, load_wk, put, rows_of, sigmoid, tanh, tile


@triton.jit
def _gate(
    h,
    p_prev,
    w,
    g: tl.constexpr,
    rmask,
    W_G,
    H,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    """Gate g's ``h @ W_hh[g]^T``: held, or in BK-column blocks of the stored state."""
    if BK == BH:
        return dot(h, W_G, PREC)
    acc = tl.zeros((BR, BH), h.dtype)
    for k0 in tl.static_range(0, BH, BK):
        acc += dot(
            tile(p_prev, k0, rmask, H - k0, BK), load_wk(w, g * H, k0, H, BH, BK, True), PREC
        )
    return acc


@triton.jit
def _forward_kernel(
    x0,
    out,
    gx,
    w,
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
    HAS_G: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_FAC: tl.constexpr,
    HAS_DT: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    c, b, rmask = rows_of(tl.program_id(0), R, B, BR)
    p_prev = x0 + c * x0_s1 + b * x0_s2
    p_out = out + c * o_s1 + b * o_s2
    p_gx = gx + c * gx_s1 + b * gx_s2
    p_g = g + c * g_s1 + b * g_s2
    p_k = keep + c * k_s1 + b * k_s2
    p_f = fac + c * f_s1 + b * f_s2
    p_dt = dt + c * dt_s1 + b * dt_s2
    W_I = 0.0
    W_F = 0.0
    W_G = 0.0
    W_O = 0.0
    if BK == BH:  # held for every step
        W_I = load_w(w, 0, H, BH, True)
        W_F = load_w(w, H, H, BH, True)
        W_G = load_w(w, 2 * H, H, BH, True)
        W_O = load_w(w, 3 * H, H, BH, True)
    h = tile(p_prev, 0, rmask, H, BH)
    cs = tile(p_prev, H, rmask, H, BH)
    for s in range(S):
        i = sigmoid(
            tile(p_gx, 0, rmask, H, BH) + _gate(h, p_prev, w, 0, rmask, W_I, H, BR, BH, BK, PREC)
        )
        f = sigmoid(
            tile(p_gx, H, rmask, H, BH) + _gate(h, p_prev, w, 1, rmask, W_F, H, BR, BH, BK, PREC)
        )
        gg = tanh(
            tile(p_gx, 2 * H, rmask, H, BH)
            + _gate(h, p_prev, w, 2, rmask, W_G, H, BR, BH, BK, PREC)
        )
        o = sigmoid(
            tile(p_gx, 3 * H, rmask, H, BH)
            + _gate(h, p_prev, w, 3, rmask, W_O, H, BR, BH, BK, PREC)
        )
        j = j0 + s
        identity = (c == pad_c) & (j >= pad_lo) & (j < pad_hi)
        if HAS_DT:
            identity = identity | (tl.load(p_dt, mask=rmask, other=1.0) <= 0.0)
        c_new = f * cs + i * gg
        h_new = o * tanh(c_new)
        h_new = tl.where(identity[:, None], h, h_new)
        c_new = tl.where(identity[:, None], cs, c_new)
        if HAS_G:
            h_new += tile(p_g, 0, rmask, H, BH)
            c_new += tile(p_g, H, rmask, H, BH)
        put(p_out, 0, h_new, rmask, H, BH)
        put(p_out, H, c_new, rmask, H, BH)
        if HAS_KEEP:
            put(p_k, 0, i, rmask, H, BH)
            put(p_k, H, f, rmask, H, BH)
            put(p_k, 2 * H, gg, rmask, H, BH)
            put(p_k, 3 * H, o, rmask, H, BH)
        if HAS_FAC:
            put(p_f, 0, tl.where(identity[:, None], 1.0, 0.0 * f), rmask, H, BH)
            put(p_f, H, tl.where(identity[:, None], 1.0, f), rmask, H, BH)
        if BK != BH:  # the next step reads this state back in blocks
            tl.debug_barrier()
        # the state as stored (rounded to a half type's precision)
        h = h_new.to(out.dtype.element_ty).to(h.dtype)
        cs = c_new.to(out.dtype.element_ty).to(cs.dtype)
        p_prev = p_out
        p_out += o_s0
        p_gx += gx_s0
        p_g += g_s0
        p_k += k_s0
        p_f += f_s0
        p_dt += dt_s0


def forward(x0, out, gx, w_hh, g, keep, factor, dt, pad_c, pad_lo, pad_hi, j0):
    """``lstm_cpu.cpp``'s ``lstm_forward`` (same arguments)."""
    gpu.check("lstm_forward", out, x0, gx, w_hh, g, keep, factor, dt)
    S, n, B, W = out.shape
    H = W // 2
    ptrs, st = gpu.layout(x0, out, gx, g, keep, factor, dt)
    gpu.launch(
        _forward_kernel,
        n * B,
        ptrs[0],
        ptrs[1],
        ptrs[2],
        w_hh.contiguous(),
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
        HAS_G=g is not None,
        HAS_KEEP=keep is not None,
        HAS_FAC=factor is not None,
        HAS_DT=dt is not None,
        **gpu.meta(out, H),
    )


@triton.jit
def _product(
    lam_h,
    lam_c,
    p_lam,
    p_C,
    rmask,
    w,
    W_I,
    W_F,
    W_G,
    W_O,
    H,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    """``d @ W_hh`` with ``d = [C_i s, C_f s, C_g s, C_o lam_h]``, ``s = lam_c + A lam_h``
    (C = [A, C_i, C_f, C_g, C_o] at p_C): held, or in BK blocks of lam and C from memory."""
    if BK == BH:
        sv = lam_c + tile(p_C, 0, rmask, H, BH) * lam_h
        acc = dot(tile(p_C, H, rmask, H, BH) * sv, W_I, PREC)
        acc += dot(tile(p_C, 2 * H, rmask, H, BH) * sv, W_F, PREC)
        acc += dot(tile(p_C, 3 * H, rmask, H, BH) * sv, W_G, PREC)
        acc += dot(tile(p_C, 4 * H, rmask, H, BH) * lam_h, W_O, PREC)
        return acc
    acc = tl.zeros((BR, BH), lam_h.dtype)
    for k0 in tl.static_range(0, BH, BK):
        m = H - k0
        lh = tile(p_lam, k0, rmask, m, BK)
        sv = tile(p_lam, H + k0, rmask, m, BK) + tile(p_C, k0, rmask, m, BK) * lh
        acc += dot(tile(p_C, H + k0, rmask, m, BK) * sv, load_wk(w, 0, k0, H, BH, BK, False), PREC)
        acc += dot(
            tile(p_C, 2 * H + k0, rmask, m, BK) * sv, load_wk(w, H, k0, H, BH, BK, False), PREC
        )
        acc += dot(
            tile(p_C, 3 * H + k0, rmask, m, BK) * sv, load_wk(w, 2 * H, k0, H, BH, BK, False), PREC
        )
        acc += dot(
            tile(p_C, 4 * H + k0, rmask, m, BK) * lh, load_wk(w, 3 * H, k0, H, BH, BK, False), PREC
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
    W_I = 0.0
    W_F = 0.0
    W_G = 0.0
    W_O = 0.0
    if BK == BH:
        W_I = load_w(w, 0, H, BH, False)
        W_F = load_w(w, H, H, BH, False)
        W_G = load_w(w, 2 * H, H, BH, False)
        W_O = load_w(w, 3 * H, H, BH, False)
    lam_h = tile(p_prev, 0, rmask, H, BH)
    lam_c = tile(p_prev, H, rmask, H, BH)
    for _ in range(S):
        sv = lam_c + tile(p_C, 0, rmask, H, BH) * lam_h
        new_h = tile(p_D, 0, rmask, H, BH) * lam_h
        new_h += _product(
            lam_h, lam_c, p_prev, p_C, rmask, w, W_I, W_F, W_G, W_O, H, BR, BH, BK, PREC
        )
        new_c = tile(p_D, H, rmask, H, BH) * sv
        if HAS_G:
            new_h += tile(p_g, 0, rmask, H, BH)
            new_c += tile(p_g, H, rmask, H, BH)
        put(p_out, 0, new_h, rmask, H, BH)
        put(p_out, H, new_c, rmask, H, BH)
        if BK != BH:
            tl.debug_barrier()
        lam_h = new_h.to(out.dtype.element_ty).to(lam_h.dtype)
        lam_c = new_c.to(out.dtype.element_ty).to(lam_c.dtype)
        p_prev = p_out
        p_out += o_s0
        p_D += d_s0
        p_C += c_s0
        p_g += g_s0


def adjoint(x0, out, D, C, w_hh, g):
    """``lstm_cpu.cpp``'s ``lstm_adjoint``."""
    gpu.check("lstm_adjoint", out, x0, D, C, w_hh, g)
    S, n, B, W = out.shape
    H = W // 2
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
    d,
    lam0,
    T,
    B,
    H,
    s_state,
    s_kept,
    HAS_DT: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    # every tensor contiguous; the pointers given are those of the last step, walked back
    zero, b, rmask = rows_of(tl.program_id(0), B, B, BR)
    W2 = 2 * H
    W_I = 0.0
    W_F = 0.0
    W_G = 0.0
    W_O = 0.0
    if BK == BH:
        W_I = load_w(w, 0, H, BH, False)
        W_F = load_w(w, H, H, BH, False)
        W_G = load_w(w, 2 * H, H, BH, False)
        W_O = load_w(w, 3 * H, H, BH, False)
    p_u = points + b * W2  # the state before step k (the one after it: + s_state)
    p_k = kept + b * 4 * H
    p_f = d_out + b * W2
    p_dt = dt + b
    p_d = d + b * 4 * H
    lam_h = tile(p_f, 0, rmask, H, BH) + tile(d_last + b * W2, 0, rmask, H, BH)
    lam_c = tile(p_f, H, rmask, H, BH) + tile(d_last + b * W2, H, rmask, H, BH)
    for it in range(T):
        k = T - 1 - it
        i = tile(p_k, 0, rmask, H, BH)
        f = tile(p_k, H, rmask, H, BH)
        gg = tile(p_k, 2 * H, rmask, H, BH)
        o = tile(p_k, 3 * H, rmask, H, BH)
        tc = tanh(tile(p_u + s_state, H, rmask, H, BH))
        sv = lam_c + o * (1.0 - tc * tc) * lam_h
        real = rmask == rmask  # every row steps, but for dt <= 0 (identity)
        if HAS_DT:
            real = tl.load(p_dt, mask=rmask, other=1.0) > 0.0
        real2 = real[:, None]
        d_i = tl.where(real2, gg * i * (1.0 - i) * sv, 0.0)
        d_f = tl.where(real2, tile(p_u, H, rmask, H, BH) * f * (1.0 - f) * sv, 0.0)
        d_g = tl.where(real2, i * (1.0 - gg * gg) * sv, 0.0)
        d_o = tl.where(real2, tc * o * (1.0 - o) * lam_h, 0.0)
        put(p_d, 0, d_i, rmask, H, BH)
        put(p_d, H, d_f, rmask, H, BH)
        put(p_d, 2 * H, d_g, rmask, H, BH)
        put(p_d, 3 * H, d_o, rmask, H, BH)
        if BK == BH:
            prod = (
                dot(d_i, W_I, PREC)
                + dot(d_f, W_F, PREC)
                + dot(d_g, W_G, PREC)
                + dot(d_o, W_O, PREC)
            )
        else:
            tl.debug_barrier()
            prod = tl.zeros((BR, BH), lam_h.dtype)
            for k0 in tl.static_range(0, BH, BK):
                for q in tl.static_range(4):
                    prod += dot(
                        tile(p_d, q * H + k0, rmask, H - k0, BK),
                        load_wk(w, q * H, k0, H, BH, BK, False),
                        PREC,
                    )
        p_f -= s_state  # the forcing d_out[k - 1] (none at k = 0)
        fmask = rmask & (b * 0 + k >= 1)
        lam_h = tl.where(real2, prod, lam_h) + tile(p_f, 0, fmask, H, BH)
        lam_c = tl.where(real2, f * sv, lam_c) + tile(p_f, H, fmask, H, BH)
        p_u -= s_state  # (steps' strides come as arguments: i64 where they need it)
        p_k -= s_kept
        p_dt -= B
        p_d -= s_kept
    put(lam0 + b * W2, 0, lam_h, rmask, H, BH)
    put(lam0 + b * W2, H, lam_c, rmask, H, BH)


def serial_adjoint(points, kept, d_out, d_last, dt, w_hh, d, lam0):
    """``lstm_cpu.cpp``'s ``lstm_serial_adjoint``: contiguous tensors."""
    gpu.check("lstm_serial_adjoint", points, kept, d_out, d_last, dt, w_hh, d, lam0)
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
        gpu.at(d, last),
        lam0,
        T,
        B,
        H,
        B * 2 * H,
        B * 4 * H,
        HAS_DT=dt is not None,
        **gpu.meta(points, H),
    )
