// The LSTM's compiled CPU sweeps on the stacked state [h, c]: steps j0 .. j0 + S - 1 of every
// chunk in one call. The math is mgrit_gru/lstm/cell.py's step and adjoint_step, which stay
// the reference.
#include "../kernels/common.h"

#include <ATen/Parallel.h>

namespace mgrit {

// Forward: out[s] = step(state_s) (+ g[s]); state_0 = x0[0], state_s = out[s - 1]; states
// (.., 2H) = [h, c]. gx (S, n, B, 4H) input gates with both biases; keep <- [i, f, g, o];
// factor <- [0, f]; dt (S, n, B, 1): a step with dt <= 0 is the identity (factor 1), as are
// the rows of chunk pad_c at steps pad_lo <= j0 + s < pad_hi.
template <typename T>
static void lstm_forward_impl(const Tensor& x0, Tensor& out, const Tensor& gx, const Tensor& w_hh,
                              const Tensor& g, const Tensor& keep, const Tensor& factor, const Tensor& dt,
                              int64_t pad_c, int64_t pad_lo, int64_t pad_hi, int64_t j0, const Tensor& stored,
                              const Tensor& change) {
  const int64_t S = out.size(0), n = out.size(1), B = out.size(2), H = out.size(3) / 2, R = n * B;
  const Tensor wt = w_hh.t().contiguous();  // (H, 4H)
  const Panels<T> panels(wt.data_ptr<T>(), H, 4 * H);
  Tensor pre = at::empty({R, 4 * H}, out.options());
  Tensor stage = at::empty({R, H}, out.options());
  std::vector<T*> ptrs(R);
  View<T> vx0(x0), vout(out), vgx(gx), vg(g), vkeep(keep), vfac(factor), vdt(dt);
  T* pp = pre.data_ptr<T>();
  checked_blocks<T>(out, stored, change, R, R * S * H, [&](int64_t r0, int64_t r1) {
    // per row: the activated gates [i, f, g, o] in a contiguous scratch (the kept gates'
    // layout), then the update; each loop runs over contiguous values and vectorises
    std::vector<T> scratch(5 * H);
    T* __restrict gates = scratch.data();
    T* __restrict tc = gates + 4 * H;
    for (int64_t s = 0; s < S; ++s) {
      const View<T>& vin = s == 0 ? vx0 : vout;
      const int64_t sin = s == 0 ? 0 : s - 1;
      const int64_t j = j0 + s;
      rows_gemm<T>(vin, sin, r0, r1, H, wt, panels, pre, ptrs.data(), stage);  // reads h: a row's first H
      for (int64_t r = r0; r < r1; ++r) {
        const T* u = vin.row(sin, r);
        const T* a = vgx.row(s, r);
        const T* q = pp + r * 4 * H;
        T* o = vout.row(s, r);
        for (int64_t k = 0; k < 4 * H; ++k) gates[k] = a[k] + q[k];
        sigmoid_inplace<T>(gates, 2 * H);
        tanh_inplace<T>(gates + 2 * H, H);
        sigmoid_inplace<T>(gates + 3 * H, H);
        const T *ig = gates, *fg = gates + H, *gg = gates + 2 * H, *og = gates + 3 * H;
        const bool identity = (vdt.defined() && !(vdt.row(s, r)[0] > T(0))) ||
                              ((r / B) == pad_c && j >= pad_lo && j < pad_hi);
        T* fp = vfac.defined() ? vfac.row(s, r) : nullptr;
        if (identity) {
          std::memmove(o, u, sizeof(T) * 2 * H);
          if (fp)
            for (int64_t k = 0; k < 2 * H; ++k) fp[k] = T(1);
        } else {
          for (int64_t k = 0; k < H; ++k) tc[k] = fg[k] * u[H + k] + ig[k] * gg[k];
          for (int64_t k = 0; k < H; ++k) o[H + k] = tc[k];
          tanh_inplace<T>(tc, H);
          for (int64_t k = 0; k < H; ++k) o[k] = og[k] * tc[k];
          if (fp) {
            for (int64_t k = 0; k < H; ++k) fp[k] = T(0);
            for (int64_t k = 0; k < H; ++k) fp[H + k] = fg[k];
          }
        }
        if (vg.defined()) {
          const T* gp = vg.row(s, r);
          for (int64_t k = 0; k < 2 * H; ++k) o[k] += gp[k];
        }
        if (vkeep.defined()) std::memcpy(vkeep.row(s, r), gates, sizeof(T) * 4 * H);
      }
    }
  });
}

// Adjoint: with lam = [lam_h, lam_c], C = [A, C_i, C_f, C_g, C_o], D = [D_h, D_c]:
// s = lam_c + A lam_h, d = [C_i s, C_f s, C_g s, C_o lam_h],
// out = [d @ W_hh + D_h lam_h, D_c s] (+ g[s]).
template <typename T>
static void lstm_adjoint_impl(const Tensor& x0, Tensor& out, const Tensor& D, const Tensor& C, const Tensor& w_hh,
                              const Tensor& g, const Tensor& stored, const Tensor& change) {
  const int64_t S = out.size(0), n = out.size(1), B = out.size(2), H = out.size(3) / 2, R = n * B;
  const Tensor w = w_hh.contiguous();  // (4H, H)
  const Panels<T> panels(w.data_ptr<T>(), 4 * H, H);
  Tensor d = at::empty({R, 4 * H}, out.options());
  Tensor prod = at::empty({R, H}, out.options());
  std::vector<T*> ptrs(R);
  View<T> vx0(x0), vout(out), vD(D), vC(C), vg(g);
  T* dp = d.data_ptr<T>();
  T* pp = prod.data_ptr<T>();
  for (int64_t r = 0; r < R; ++r) ptrs[r] = dp + r * 4 * H;
  checked_blocks<T>(out, stored, change, R, R * S * H, [&](int64_t r0, int64_t r1) {
    for (int64_t s = 0; s < S; ++s) {
      const View<T>& vin = s == 0 ? vx0 : vout;
      const int64_t sin = s == 0 ? 0 : s - 1;
      for (int64_t r = r0; r < r1; ++r) {
        const T* lam = vin.row(sin, r);
        const T* c = vC.row(s, r);
        T* dr = dp + r * 4 * H;
        for (int64_t k = 0; k < H; ++k) {
          const T lh = lam[k];
          const T sv = lam[H + k] + c[k] * lh;
          dr[k] = c[H + k] * sv;
          dr[H + k] = c[2 * H + k] * sv;
          dr[2 * H + k] = c[3 * H + k] * sv;
          dr[3 * H + k] = c[4 * H + k] * lh;
        }
      }
      prepared_gemm<T>(r0, r1, ptrs.data(), panels, d, 0, w, prod);
      for (int64_t r = r0; r < r1; ++r) {
        const T* lam = vin.row(sin, r);
        const T* c = vC.row(s, r);
        const T* dd = vD.row(s, r);
        const T* gp = vg.defined() ? vg.row(s, r) : nullptr;
        const T* p = pp + r * H;
        T* o = vout.row(s, r);
        for (int64_t k = 0; k < H; ++k) {
          const T lh = lam[k];
          const T sv = lam[H + k] + c[k] * lh;
          T vh = p[k] + dd[k] * lh;
          T vc = dd[H + k] * sv;
          if (gp) {
            vh += gp[k];
            vc += gp[H + k];
          }
          o[k] = vh;
          o[H + k] = vc;
        }
      }
    }
  });
}

static Tensor opt_(const c10::optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); }

void lstm_forward(const Tensor& x0, Tensor out, const Tensor& gx, const Tensor& w_hh,
                  const c10::optional<Tensor>& g, const c10::optional<Tensor>& keep,
                  const c10::optional<Tensor>& factor, const c10::optional<Tensor>& dt, int64_t pad_c,
                  int64_t pad_lo, int64_t pad_hi, int64_t j0, const c10::optional<Tensor>& stored,
                  const c10::optional<Tensor>& change) {
  for (const Tensor& t : {gx, w_hh, opt_(g), opt_(keep), opt_(factor), opt_(dt), x0, opt_(stored), opt_(change)})
    check_same(t, out, "every argument");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "lstm_forward", [&] {
    lstm_forward_impl<scalar_t>(x0, out, gx, w_hh, opt_(g), opt_(keep), opt_(factor), opt_(dt), pad_c, pad_lo,
                                 pad_hi, j0, opt_(stored), opt_(change));
  });
}

void lstm_adjoint(const Tensor& x0, Tensor out, const Tensor& D, const Tensor& C, const Tensor& w_hh,
                  const c10::optional<Tensor>& g, const c10::optional<Tensor>& stored,
                  const c10::optional<Tensor>& change) {
  for (const Tensor& t : {D, C, w_hh, opt_(g), x0, opt_(stored), opt_(change)}) check_same(t, out, "every argument");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "lstm_adjoint", [&] {
    lstm_adjoint_impl<scalar_t>(x0, out, D, C, w_hh, opt_(g), opt_(stored), opt_(change));
  });
}

// The serial adjoint in one call, with the gate gradients: from lam_T = d_out[T - 1] + d_last
// back to lam_0 on states [h, c], step k linearised from the kept gates [i, f, g, o] and the
// cell states c_k = points[k], c_{k+1} = points[k + 1] (mgrit_gru/lstm/cell.py's
// _coefficients and gate_grads, fused): s = lam_c + A lam_h, d[k] = [C_i s, C_f s, C_g s,
// C_o lam_h], lam_k = [d[k] @ W_hh, f s] + d_out[k - 1] (k >= 1). dt (T, B): 0 is an identity
// step (lam passes, d = 0). Returns lam_0 (B, 2H).
template <typename T>
static void lstm_serial_adjoint_impl(const Tensor& points, const Tensor& kept, const Tensor& d_out,
                                     const Tensor& d_last, const Tensor& dt, const Tensor& w_hh, Tensor& d,
                                     Tensor& lam0) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = w_hh.size(1), W = 2 * H;
  const Tensor w = w_hh.contiguous();  // (4H, H)
  const Panels<T> panels(w.data_ptr<T>(), 4 * H, H);
  SerialLam<T> state(d_out, d_last, B, W, H);
  T *L = state.L, *N = state.N, *PR = state.PR;
  const T* P = points.data_ptr<T>();
  const T* K = kept.data_ptr<T>();
  const T* F = d_out.data_ptr<T>();
  const T* dtp = dt.defined() ? dt.data_ptr<T>() : nullptr;
  T* G = d.data_ptr<T>();
  std::vector<T*> ptrs(B);
  const Tensor rows = d.view({Tn * B, 4 * H});
  over_blocks(B, B * Tn * H, [&](int64_t b0, int64_t b1) {
    std::vector<T> scratch(H);
    for (int64_t k = Tn - 1; k >= 0; --k) {
      // rows [b0, b1): the gate gradients d and the direct part of the new lam
      for (int64_t b = b0; b < b1; ++b) {
        const T* c = P + (k * B + b) * W + H;
        const T* cn = P + ((k + 1) * B + b) * W + H;
        const T* kr = K + (k * B + b) * 4 * H;
        const T *ig = kr, *fg = kr + H, *gg = kr + 2 * H, *og = kr + 3 * H;
        const T* l = L + b * W;
        T* dr = G + (k * B + b) * 4 * H;
        T* nb = N + b * W;
        ptrs[b] = dr;
        if (dtp && !(dtp[k * B + b] > T(0))) {  // identity step
          for (int64_t j = 0; j < 4 * H; ++j) dr[j] = T(0);
          for (int64_t j = 0; j < W; ++j) nb[j] = l[j];
          continue;
        }
        T* __restrict tc = scratch.data();
        for (int64_t j = 0; j < H; ++j) tc[j] = cn[j];
        tanh_inplace<T>(tc, H);
        for (int64_t j = 0; j < H; ++j) {
          const T lh = l[j];
          const T A = og[j] * (T(1) - tc[j] * tc[j]);
          const T sv = l[H + j] + A * lh;
          dr[j] = gg[j] * ig[j] * (T(1) - ig[j]) * sv;
          dr[H + j] = c[j] * fg[j] * (T(1) - fg[j]) * sv;
          dr[2 * H + j] = ig[j] * (T(1) - gg[j] * gg[j]) * sv;
          dr[3 * H + j] = tc[j] * og[j] * (T(1) - og[j]) * lh;
          nb[j] = T(0);
          nb[H + j] = fg[j] * sv;
        }
      }
      prepared_gemm<T>(b0, b1, ptrs.data(), panels, rows, k * B, w, state.prod);
      const T* f = k >= 1 ? F + (k - 1) * B * W : nullptr;
      for (int64_t b = b0; b < b1; ++b) {
        T* lb = L + b * W;
        const T* nb = N + b * W;
        const T* pb = PR + b * H;
        const T* fb = f ? f + b * W : nullptr;
        const bool identity = dtp && !(dtp[k * B + b] > T(0));
        for (int64_t j = 0; j < H; ++j) lb[j] = nb[j] + (identity ? T(0) : pb[j]) + (fb ? fb[j] : T(0));
        for (int64_t j = H; j < W; ++j) lb[j] = nb[j] + (fb ? fb[j] : T(0));
      }
    }
  });
  lam0.copy_(state.lam);
}

void lstm_serial_adjoint(const Tensor& points, const Tensor& kept, const Tensor& d_out, const Tensor& d_last,
                         const c10::optional<Tensor>& dt, const Tensor& w_hh, Tensor d, Tensor lam0) {
  check_contiguous({points, kept, d_out, d_last, opt_(dt), w_hh, d, lam0}, points, "lstm_serial_adjoint");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "lstm_serial_adjoint", [&] {
    lstm_serial_adjoint_impl<scalar_t>(points, kept, d_out, d_last, opt_(dt), w_hh, d, lam0);
  });
}


// The whole-sequence passes around MGRIT's adjoint sweeps (as the GRU's, gru_cpu.cpp), one
// parallel region each over blocks of time steps; cell.py's _coefficients and _gate_grads
// stay the reference.

// Coefficients of steps k = 0 .. T - 1 from the states points[k] = [h, c] (first 2H of each
// row) and the kept gates [i, f, g, o] (T, B, 4H), dt (T, B) or absent (0: an identity step,
// D = 1, C = 0), written in reversed time: D_rev[T - 1 - k] = [0, f] (B, 2H), C_rev[T - 1 - k]
// = [A, C_i, C_f, C_g, C_o] (B, 5H).
template <typename T>
static void lstm_coefficients_impl(const Tensor& points, const Tensor& kept, const Tensor& dt, Tensor& D_rev,
                                   Tensor& C_rev) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = kept.size(2) / 4;
  const View<T> vp(points.unsqueeze(1));
  const T* K = kept.data_ptr<T>();
  const T* dtp = dt.defined() ? dt.data_ptr<T>() : nullptr;
  T* Dp = D_rev.data_ptr<T>();
  T* Cp = C_rev.data_ptr<T>();
  over_steps<T>(Tn, B, H, [&](int64_t k, int64_t back, int64_t b, T* scratch) {
    T* __restrict D = Dp + (back * B + b) * 2 * H;
    T* __restrict C = Cp + (back * B + b) * 5 * H;
    if (dtp && !(dtp[k * B + b] > T(0))) {  // identity step
      for (int64_t j = 0; j < 2 * H; ++j) D[j] = T(1);
      for (int64_t j = 0; j < 5 * H; ++j) C[j] = T(0);
      return;
    }
    const T* __restrict c = vp.row(k, b) + H;
    const T* kr = K + (k * B + b) * 4 * H;
    const T *__restrict ig = kr, *__restrict fg = kr + H, *__restrict gg = kr + 2 * H, *__restrict og = kr + 3 * H;
    T* __restrict tc = scratch;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) tc[j] = fg[j] * c[j] + ig[j] * gg[j];
    tanh_inplace<T>(tc, H);
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      D[j] = T(0);
      D[H + j] = fg[j];
      C[j] = og[j] - og[j] * tc[j] * tc[j];
      C[H + j] = gg[j] * ig[j] * (T(1) - ig[j]);
      C[2 * H + j] = c[j] * fg[j] * (T(1) - fg[j]);
      C[3 * H + j] = ig[j] - ig[j] * gg[j] * gg[j];
      C[4 * H + j] = tc[j] * og[j] * (T(1) - og[j]);
    }
  });
}

// The gate pre-activations' gradients d (T, B, 4H) of steps k = 0 .. T - 1 from the adjoint in
// reversed time (lam_{k+1} = [lam_h, lam_c] = lam_rev[T - 1 - k]) and the coefficients as
// lstm_coefficients wrote them: s = lam_c + A lam_h, d[k] = [C_i s, C_f s, C_g s, C_o lam_h].
template <typename T>
static void lstm_gate_grads_impl(const Tensor& lam_rev, const Tensor& C_rev, Tensor& d) {
  const int64_t Tn = d.size(0), B = d.size(1), H = d.size(2) / 4;
  const View<T> vl(lam_rev.unsqueeze(1));
  const T* Cp = C_rev.data_ptr<T>();
  T* G = d.data_ptr<T>();
  over_steps<T>(Tn, B, H, [&](int64_t k, int64_t back, int64_t b, T*) {
    const T* __restrict lh = vl.row(back, b);
    const T* __restrict lc = lh + H;
    const T* __restrict C = Cp + (back * B + b) * 5 * H;
    T* __restrict g = G + (k * B + b) * 4 * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T sj = lc[j] + C[j] * lh[j];
      g[j] = C[H + j] * sj;
      g[H + j] = C[2 * H + j] * sj;
      g[2 * H + j] = C[3 * H + j] * sj;
      g[3 * H + j] = C[4 * H + j] * lh[j];
    }
  });
}

void lstm_coefficients(const Tensor& points, const Tensor& kept, const c10::optional<Tensor>& dt, Tensor D_rev,
                       Tensor C_rev) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = kept.size(2) / 4;
  TORCH_CHECK(points.dim() == 3 && points.size(0) >= Tn && points.size(1) == B && points.size(2) >= 2 * H,
              "lstm_coefficients: points (T, B, >= 2H)");
  check_contiguous({kept, D_rev, C_rev, opt_(dt)}, points, "lstm_coefficients");
  TORCH_CHECK(D_rev.numel() == Tn * B * 2 * H && C_rev.numel() == Tn * B * 5 * H &&
                  (!dt.has_value() || dt->numel() == Tn * B),
              "lstm_coefficients: D (T, B, 2H), C (T, B, 5H), dt (T, B)");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "lstm_coefficients", [&] {
    lstm_coefficients_impl<scalar_t>(points, kept, opt_(dt), D_rev, C_rev);
  });
}

void lstm_gate_grads(const Tensor& lam_rev, const Tensor& C_rev, Tensor d) {
  const int64_t Tn = d.size(0), B = d.size(1), H = d.size(2) / 4;
  TORCH_CHECK(lam_rev.dim() == 3 && lam_rev.size(0) >= Tn && lam_rev.size(1) == B && lam_rev.size(2) == 2 * H,
              "lstm_gate_grads: lam_rev (>= T, B, 2H)");
  check_contiguous({C_rev, d}, lam_rev, "lstm_gate_grads");
  TORCH_CHECK(C_rev.numel() == Tn * B * 5 * H, "lstm_gate_grads: C (T, B, 5H), d (T, B, 4H)");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(lam_rev.scalar_type(), "lstm_gate_grads", [&] {
    lstm_gate_grads_impl<scalar_t>(lam_rev, C_rev, d);
  });
}

}  // namespace mgrit
