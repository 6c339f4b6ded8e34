// The GRU's compiled CPU sweeps: steps j0 .. j0 + S - 1 of every chunk in one call.
// The math is mgrit_gru/gru/cell.py's step and adjoint_step, which stay the reference.
#include "../kernels/common.h"

#include <ATen/Parallel.h>

namespace mgrit {

// Forward: out[s] = step(state_s) (+ g[s]); state_0 = x0[0], state_s = out[s - 1].
// gx (S, n, B, 3H) input gates with the folded bias; keep (S, n, B, 4H) <- [r, z, n, gh_n];
// factor (S, n, B, H) <- 1 - theta; dt (S, n, B, 1) step sizes (absent: 1); rows of chunk
// pad_c at steps lo <= j0 + s < hi are identity steps (factor 1).
template <typename T>
static void gru_forward_impl(const Tensor& x0, Tensor& out, const Tensor& gx, const Tensor& w_hh,
                             const Tensor& b_hn, const Tensor& g, const Tensor& keep, const Tensor& factor,
                             const Tensor& dt, bool implicit, int64_t pad_c, int64_t pad_lo, int64_t pad_hi,
                             int64_t j0, const Tensor& stored, const Tensor& change) {
  const int64_t S = out.size(0), n = out.size(1), B = out.size(2), H = out.size(3), R = n * B;
  const Tensor wt = w_hh.t().contiguous();  // (H, 3H)
  const Panels<T> panels(wt.data_ptr<T>(), H, 3 * H);
  Tensor gh = at::empty({R, 3 * H}, out.options());
  Tensor stage = at::empty({R, H}, out.options());
  std::vector<T*> ptrs(R);
  View<T> vx0(x0), vout(out), vgx(gx), vg(g), vkeep(keep), vfac(factor), vdt(dt);
  const T* bias = b_hn.defined() ? b_hn.data_ptr<T>() : nullptr;
  T* ghp = gh.data_ptr<T>();
  checked_blocks<T>(out, stored, change, R, R * S * H, [&](int64_t r0, int64_t r1) {
    // per row: [r, z, n, gh_n] in a contiguous scratch (the kept gates' layout), then the
    // update; each loop runs over H contiguous values and vectorises
    std::vector<T> scratch(5 * H);
    T* __restrict gates = scratch.data();
    T* __restrict theta = gates + 4 * H;
    for (int64_t s = 0; s < S; ++s) {
      const View<T>& vin = s == 0 ? vx0 : vout;
      const int64_t sin = s == 0 ? 0 : s - 1;
      const int64_t j = j0 + s;
      rows_gemm<T>(vin, sin, r0, r1, H, wt, panels, gh, ptrs.data(), stage);
      for (int64_t r = r0; r < r1; ++r) {
        const T* h = vin.row(sin, r);
        const T* a = vgx.row(s, r);
        const T* q = ghp + r * 3 * H;
        T* o = vout.row(s, r);
        for (int64_t k = 0; k < 2 * H; ++k) gates[k] = a[k] + q[k];
        sigmoid_inplace<T>(gates, 2 * H);
        T* __restrict nn = gates + 2 * H;
        T* __restrict ghn = gates + 3 * H;
        for (int64_t k = 0; k < H; ++k) {
          ghn[k] = bias ? q[2 * H + k] + bias[k] : q[2 * H + k];
          nn[k] = a[2 * H + k] + gates[k] * ghn[k];
        }
        tanh_inplace<T>(nn, H);
        const T step = vdt.defined() ? vdt.row(s, r)[0] : T(1);
        const T* z = gates + H;
        if (implicit) {
          for (int64_t k = 0; k < H; ++k) {
            const T w = (T(1) - z[k]) * step;
            theta[k] = w / (w + T(1));
          }
        } else {
          for (int64_t k = 0; k < H; ++k) theta[k] = (T(1) - z[k]) * step;
        }
        const bool identity = (r / B) == pad_c && j >= pad_lo && j < pad_hi;
        if (identity) {
          for (int64_t k = 0; k < H; ++k) theta[k] = T(0);
        }
        for (int64_t k = 0; k < H; ++k) o[k] = h[k] + theta[k] * (nn[k] - h[k]);
        if (vg.defined()) {
          const T* gp = vg.row(s, r);
          for (int64_t k = 0; k < H; ++k) o[k] += gp[k];
        }
        if (vkeep.defined()) std::memcpy(vkeep.row(s, r), gates, sizeof(T) * 4 * H);
        if (vfac.defined()) {
          T* fp = vfac.row(s, r);
          for (int64_t k = 0; k < H; ++k) fp[k] = T(1) - theta[k];
        }
      }
    }
  });
}

// Adjoint: out[s] = D * lam + (C * [lam, lam, lam]) @ W_hh (+ g[s]); lam_0 = x0[0].
template <typename T>
static void gru_adjoint_impl(const Tensor& x0, Tensor& out, const Tensor& D, const Tensor& C, const Tensor& w_hh,
                             const Tensor& g, const Tensor& stored, const Tensor& change) {
  const int64_t S = out.size(0), n = out.size(1), B = out.size(2), H = out.size(3), R = n * B;
  const Tensor w = w_hh.contiguous();  // (3H, H)
  const Panels<T> panels(w.data_ptr<T>(), 3 * H, H);
  Tensor weighted = at::empty({R, 3 * H}, out.options());
  Tensor prod = at::empty({R, H}, out.options());
  std::vector<T*> ptrs(R);
  View<T> vx0(x0), vout(out), vD(D), vC(C), vg(g);
  T* wp = weighted.data_ptr<T>();
  T* pp = prod.data_ptr<T>();
  for (int64_t r = 0; r < R; ++r) ptrs[r] = wp + r * 3 * H;
  checked_blocks<T>(out, stored, change, R, R * S * H, [&](int64_t r0, int64_t r1) {
    for (int64_t s = 0; s < S; ++s) {
      const View<T>& vin = s == 0 ? vx0 : vout;
      const int64_t sin = s == 0 ? 0 : s - 1;
      for (int64_t r = r0; r < r1; ++r) {
        const T* lam = vin.row(sin, r);
        const T* c = vC.row(s, r);
        T* wr = wp + r * 3 * H;
        for (int64_t k = 0; k < H; ++k) {
          const T l = lam[k];
          wr[k] = c[k] * l;
          wr[H + k] = c[H + k] * l;
          wr[2 * H + k] = c[2 * H + k] * l;
        }
      }
      prepared_gemm<T>(r0, r1, ptrs.data(), panels, weighted, 0, w, prod);
      for (int64_t r = r0; r < r1; ++r) {
        const T* lam = vin.row(sin, r);
        const T* d = vD.row(s, r);
        const T* gp = vg.defined() ? vg.row(s, r) : nullptr;
        const T* p = pp + r * H;
        T* o = vout.row(s, r);
        for (int64_t k = 0; k < H; ++k) {
          T v = d[k] * lam[k] + p[k];
          if (gp) v += gp[k];
          o[k] = v;
        }
      }
    }
  });
}

static Tensor opt(const c10::optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); }

void gru_forward(const Tensor& x0, Tensor out, const Tensor& gx, const Tensor& w_hh,
                 const c10::optional<Tensor>& b_hn, const c10::optional<Tensor>& g,
                 const c10::optional<Tensor>& keep, const c10::optional<Tensor>& factor,
                 const c10::optional<Tensor>& dt, bool implicit, int64_t pad_c, int64_t pad_lo, int64_t pad_hi,
                 int64_t j0, const c10::optional<Tensor>& stored, const c10::optional<Tensor>& change) {
  for (const Tensor& t : {gx, w_hh, opt(b_hn), opt(g), opt(keep), opt(factor), opt(dt), x0, opt(stored), opt(change)})
    check_same(t, out, "every argument");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_forward", [&] {
    gru_forward_impl<scalar_t>(x0, out, gx, w_hh, opt(b_hn), opt(g), opt(keep), opt(factor), opt(dt), implicit,
                               pad_c, pad_lo, pad_hi, j0, opt(stored), opt(change));
  });
}

void gru_adjoint(const Tensor& x0, Tensor out, const Tensor& D, const Tensor& C, const Tensor& w_hh,
                 const c10::optional<Tensor>& g, const c10::optional<Tensor>& stored,
                 const c10::optional<Tensor>& change) {
  for (const Tensor& t : {D, C, w_hh, opt(g), x0, opt(stored), opt(change)}) check_same(t, out, "every argument");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_adjoint", [&] {
    gru_adjoint_impl<scalar_t>(x0, out, D, C, w_hh, opt(g), opt(stored), opt(change));
  });
}

// The adjoint coefficients of H units of one GRU step from its kept gates (cell.py's
// _coefficients): D (the direct factor), A_n, C_r, C_z; vectorised loops, one per variant.
template <typename T>
static inline void coefficients(const T* __restrict h, const T* __restrict r, const T* __restrict z,
                                const T* __restrict n, const T* __restrict ghn, T step, bool implicit,
                                int64_t H, T* __restrict D, T* __restrict An, T* __restrict Cr,
                                T* __restrict Cz) {
  if (implicit) {
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T oz = T(1) - z[j];
      const T w = oz * step;
      const T d = T(1) / (w + T(1));
      Cz[j] = (h[j] - n[j]) * z[j] * oz * step * d * d;
      D[j] = d;
      An[j] = w * d * (T(1) - n[j] * n[j]);
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T oz = T(1) - z[j];
      const T w = oz * step;
      Cz[j] = (h[j] - n[j]) * z[j] * oz * step;
      D[j] = T(1) - w;
      An[j] = w * (T(1) - n[j] * n[j]);
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) Cr[j] = An[j] * ghn[j] * r[j] * (T(1) - r[j]);
}

// The biases' gradients are the sums of d_gx and d_gh over their rows; d_gh's first 2H columns
// are d_gx's. add_bias_row adds one row into acc (4H doubles: d_gx's 3H, then d_gh's last H);
// store_bias writes such sums as db_ih and db_hh (3H each).
template <typename T>
static inline void add_bias_row(double* __restrict acc, const T* __restrict gx, const T* __restrict gh, int64_t H) {
#pragma omp simd
  for (int64_t j = 0; j < 3 * H; ++j) acc[j] += gx[j];
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) acc[3 * H + j] += gh[2 * H + j];
}

template <typename T>
static void store_bias(const std::vector<double>& total, const Tensor& db_ih, const Tensor& db_hh, int64_t H) {
  T* bx = db_ih.data_ptr<T>();
  T* bh = db_hh.data_ptr<T>();
  for (int64_t j = 0; j < 3 * H; ++j) bx[j] = static_cast<T>(total[j]);
  for (int64_t j = 0; j < 2 * H; ++j) bh[j] = static_cast<T>(total[j]);
  for (int64_t j = 0; j < H; ++j) bh[2 * H + j] = static_cast<T>(total[3 * H + j]);
}

// The serial adjoint in one call, with the gate gradients: from lam_T = d_out[T - 1] + d_last
// back to lam_0, step k linearised from the forward's kept gates [r, z, n, gh_n] and its
// state points[k] (mgrit_gru/gru/cell.py's _coefficients and gate_grads, fused):
//   d_gh[k] = [C_r, C_z, C_n] lam_{k+1},  d_gx[k] = [C_r, C_z, A_n] lam_{k+1},
//   lam_k = D lam_{k+1} + d_gh[k] @ W_hh + d_out[k - 1]   (k >= 1; no forcing at k = 0).
// dt (T, B) per step and sequence (0: identity), or absent. Returns lam_0 (B, H); with db_ih
// and db_hh (3H each), also the biases' gradients, the sums of d_gx and d_gh over all T x B
// rows, taken while the rows are in cache (a pass over 2 x T x B x 3H numbers less
// afterwards): in double per sequence, then over the sequences in order (the same at any
// thread count).
template <typename T>
static void gru_serial_adjoint_impl(const Tensor& points, const Tensor& kept, const Tensor& d_out,
                                    const Tensor& d_last, const Tensor& dt, bool implicit, const Tensor& w_hh,
                                    Tensor& d_gx, Tensor& d_gh, Tensor& lam0, const Tensor& db_ih,
                                    const Tensor& db_hh) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = w_hh.size(1);
  const Tensor w = w_hh.contiguous();  // (3H, H)
  const Panels<T> panels(w.data_ptr<T>(), 3 * H, H);
  SerialLam<T> state(d_out, d_last, B, H, H);
  T *L = state.L, *N = state.N, *PR = state.PR;
  const T* P = points.data_ptr<T>();
  const T* K = kept.data_ptr<T>();
  const T* F = d_out.data_ptr<T>();
  const T* dtp = dt.defined() ? dt.data_ptr<T>() : nullptr;
  T* GX = d_gx.data_ptr<T>();
  T* GH = d_gh.data_ptr<T>();
  std::vector<T*> ptrs(B);
  const Tensor rows = d_gh.view({Tn * B, 3 * H});
  const bool sums = db_ih.defined();
  // per sequence: the sums of d_gx's 3H columns, then of d_gh's last H (its first 2H are d_gx's)
  std::vector<double> acc(sums ? B * 4 * H : 0, 0.0);
  over_blocks(B, B * Tn * H, [&](int64_t b0, int64_t b1) {
    std::vector<T> scratch(4 * H);
    for (int64_t k = Tn - 1; k >= 0; --k) {
      // rows [b0, b1): the coefficients, the gate gradients and D lam
      for (int64_t b = b0; b < b1; ++b) {
        const T* h = P + (k * B + b) * H;
        const T* kr = K + (k * B + b) * 4 * H;
        const T *r = kr, *z = kr + H, *n = kr + 2 * H, *ghn = kr + 3 * H;
        const T step = dtp ? dtp[k * B + b] : T(1);
        const T* l = L + b * H;
        T* gx = GX + (k * B + b) * 3 * H;
        T* gh = GH + (k * B + b) * 3 * H;
        T* __restrict D = scratch.data();
        T* __restrict An = D + H;
        T* __restrict Cr = D + 2 * H;
        T* __restrict Cz = D + 3 * H;
        coefficients<T>(h, r, z, n, ghn, step, implicit, H, D, An, Cr, Cz);
        for (int64_t j = 0; j < H; ++j) {
          const T lj = l[j];
          gh[j] = gx[j] = Cr[j] * lj;
          gh[H + j] = gx[H + j] = Cz[j] * lj;
          gh[2 * H + j] = An[j] * r[j] * lj;
          gx[2 * H + j] = An[j] * lj;
        }
        if (sums) add_bias_row<T>(acc.data() + b * 4 * H, gx, gh, H);
        T* nb = N + b * H;
        for (int64_t j = 0; j < H; ++j) nb[j] = D[j] * l[j];
        ptrs[b] = gh;
      }
      prepared_gemm<T>(b0, b1, ptrs.data(), panels, rows, k * B, w, state.prod);
      const T* f = k >= 1 ? F + (k - 1) * B * H : nullptr;
      for (int64_t i = b0 * H; i < b1 * H; ++i) L[i] = N[i] + PR[i] + (f ? f[i] : T(0));
    }
  });
  lam0.copy_(state.lam);
  if (sums) {
    std::vector<double> total(4 * H, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < 4 * H; ++j) total[j] += acc[b * 4 * H + j];
    store_bias<T>(total, db_ih, db_hh, H);
  }
}

void gru_serial_adjoint(const Tensor& points, const Tensor& kept, const Tensor& d_out, const Tensor& d_last,
                        const c10::optional<Tensor>& dt, bool implicit, const Tensor& w_hh, Tensor d_gx, Tensor d_gh,
                        Tensor lam0, const c10::optional<Tensor>& db_ih, const c10::optional<Tensor>& db_hh) {
  check_contiguous({points, kept, d_out, d_last, opt(dt), w_hh, d_gx, d_gh, lam0, opt(db_ih), opt(db_hh)}, points,
                   "gru_serial_adjoint");
  TORCH_CHECK(db_ih.has_value() == db_hh.has_value(), "gru_serial_adjoint: db_ih and db_hh come together");
  TORCH_CHECK(!db_ih.has_value() || (db_ih->numel() == 3 * w_hh.size(1) && db_hh->numel() == 3 * w_hh.size(1)),
              "gru_serial_adjoint: db_ih and db_hh (3H)");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "gru_serial_adjoint", [&] {
    gru_serial_adjoint_impl<scalar_t>(points, kept, d_out, d_last, opt(dt), implicit, w_hh, d_gx, d_gh, lam0,
                                      opt(db_ih), opt(db_hh));
  });
}


// The whole-sequence passes around MGRIT's adjoint sweeps, one parallel region each over
// blocks of time steps (over_blocks: rows = steps here), every step's B rows in one fused
// loop; the same math as cell.py's _coefficients and gate_grads, which stay the reference.

// Adjoint coefficients of steps k = 0 .. T - 1 from the forward's states points[k] (first H
// of each row) and kept gates [r, z, n, gh_n] (T, B, 4H), dt (T, B) or absent, written in
// reversed time: D_rev[T - 1 - k] (B, H), C_rev[T - 1 - k] (B, 3H) = [C_r, C_z, C_n], and
// A_n[k] (B, H) in forward order (absent: not written).
template <typename T>
static void gru_coefficients_impl(const Tensor& points, const Tensor& kept, const Tensor& dt, bool implicit,
                                  Tensor& D_rev, Tensor& C_rev, const Tensor& A_n) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = kept.size(2) / 4;
  const View<T> vp(points.unsqueeze(1));
  const T* K = kept.data_ptr<T>();
  const T* dtp = dt.defined() ? dt.data_ptr<T>() : nullptr;
  T* Dp = D_rev.data_ptr<T>();
  T* Cp = C_rev.data_ptr<T>();
  T* Ap = A_n.defined() ? A_n.data_ptr<T>() : nullptr;
  over_steps<T>(Tn, B, H, [&](int64_t k, int64_t back, int64_t b, T* scratch) {
    const T* kr = K + (k * B + b) * 4 * H;
    const T *r = kr, *z = kr + H, *n = kr + 2 * H, *ghn = kr + 3 * H;
    const T step = dtp ? dtp[k * B + b] : T(1);
    T* D = Dp + (back * B + b) * H;
    T* C = Cp + (back * B + b) * 3 * H;
    T* An = Ap ? Ap + (k * B + b) * H : scratch;
    coefficients<T>(vp.row(k, b), r, z, n, ghn, step, implicit, H, D, An, C, C + H);
    T* __restrict Cn = C + 2 * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) Cn[j] = An[j] * r[j];
  });
}

// The gate pre-activations' gradients of steps k = 0 .. T - 1 from the adjoint in reversed
// time (lam_{k+1} = lam_rev[T - 1 - k], (T, B, H) or longer) and the coefficients as
// gru_coefficients wrote them: d_gh[k] = [C_r, C_z, C_n] lam_{k+1}, d_gx[k] = [C_r, C_z, A_n]
// lam_{k+1}, both (T, B, 3H) in forward order. With db_ih and db_hh (3H each): the biases'
// gradients of these steps, d_gx's and d_gh's sums over their T x B rows, taken as the rows are
// written: in double per block of steps, then over the blocks in order (the blocks depend on T
// alone: the same at any thread count).
template <typename T>
static void gru_gate_grads_impl(const Tensor& lam_rev, const Tensor& C_rev, const Tensor& A_n, Tensor& d_gx,
                                Tensor& d_gh, const Tensor& db_ih, const Tensor& db_hh) {
  const int64_t Tn = d_gx.size(0), B = d_gx.size(1), H = d_gx.size(2) / 3;
  const View<T> vl(lam_rev.unsqueeze(1));
  const T* Cp = C_rev.data_ptr<T>();
  const T* Ap = A_n.data_ptr<T>();
  T* GX = d_gx.data_ptr<T>();
  T* GH = d_gh.data_ptr<T>();
  const bool sums = db_ih.defined();
  // by a block's first step: the sums of its d_gx's 3H columns, then of d_gh's last H
  std::vector<std::vector<double>> partial(sums ? Tn : 0);
  over_blocks(Tn, Tn * B * H, [&](int64_t k0, int64_t k1) {
    std::vector<double> acc(sums ? 4 * H : 0, 0.0);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t back = Tn - 1 - k;
      for (int64_t b = 0; b < B; ++b) {
        const T* __restrict l = vl.row(back, b);
        const T* __restrict c = Cp + (back * B + b) * 3 * H;
        const T* __restrict a = Ap + (k * B + b) * H;
        T* __restrict gx = GX + (k * B + b) * 3 * H;
        T* __restrict gh = GH + (k * B + b) * 3 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) {
          gh[j] = gx[j] = c[j] * l[j];
          gh[H + j] = gx[H + j] = c[H + j] * l[j];
          gh[2 * H + j] = c[2 * H + j] * l[j];
          gx[2 * H + j] = a[j] * l[j];
        }
        if (sums) add_bias_row<T>(acc.data(), gx, gh, H);
      }
    }
    if (sums) partial[k0] = std::move(acc);
  });
  if (!sums) return;
  std::vector<double> total(4 * H, 0.0);
  for (const auto& block : partial)
    for (size_t j = 0; j < block.size(); ++j) total[j] += block[j];
  store_bias<T>(total, db_ih, db_hh, H);
}

void gru_coefficients(const Tensor& points, const Tensor& kept, const c10::optional<Tensor>& dt, bool implicit,
                      Tensor D_rev, Tensor C_rev, const c10::optional<Tensor>& A_n) {
  const int64_t Tn = kept.size(0), B = kept.size(1), H = kept.size(2) / 4;
  TORCH_CHECK(points.dim() == 3 && points.size(0) >= Tn && points.size(1) == B && points.size(2) >= H,
              "gru_coefficients: points (T, B, >= H)");
  check_contiguous({kept, D_rev, C_rev, opt(A_n), opt(dt)}, points, "gru_coefficients");
  TORCH_CHECK(D_rev.numel() == Tn * B * H && C_rev.numel() == Tn * B * 3 * H &&
                  (!A_n.has_value() || A_n->numel() == Tn * B * H) && (!dt.has_value() || dt->numel() == Tn * B),
              "gru_coefficients: D (T, B, H), C (T, B, 3H), A_n (T, B, H), dt (T, B)");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "gru_coefficients", [&] {
    gru_coefficients_impl<scalar_t>(points, kept, opt(dt), implicit, D_rev, C_rev, opt(A_n));
  });
}

void gru_gate_grads(const Tensor& lam_rev, const Tensor& C_rev, const Tensor& A_n, Tensor d_gx, Tensor d_gh,
                    const c10::optional<Tensor>& db_ih, const c10::optional<Tensor>& db_hh) {
  const int64_t Tn = d_gx.size(0), B = d_gx.size(1), H = d_gx.size(2) / 3;
  TORCH_CHECK(lam_rev.dim() == 3 && lam_rev.size(0) >= Tn && lam_rev.size(1) == B && lam_rev.size(2) == H,
              "gru_gate_grads: lam_rev (>= T, B, H)");
  check_contiguous({C_rev, A_n, d_gx, d_gh, opt(db_ih), opt(db_hh)}, lam_rev, "gru_gate_grads");
  TORCH_CHECK(db_ih.has_value() == db_hh.has_value() &&
                  (!db_ih.has_value() || (db_ih->numel() == 3 * H && db_hh->numel() == 3 * H)),
              "gru_gate_grads: db_ih and db_hh (3H) come together");
  TORCH_CHECK(C_rev.numel() == Tn * B * 3 * H && A_n.numel() == Tn * B * H && d_gh.numel() == Tn * B * 3 * H,
              "gru_gate_grads: C (T, B, 3H), A_n (T, B, H), d_gx and d_gh (T, B, 3H)");
  at::NoGradGuard guard;
  AT_DISPATCH_FLOATING_TYPES(lam_rev.scalar_type(), "gru_gate_grads", [&] {
    gru_gate_grads_impl<scalar_t>(lam_rev, C_rev, A_n, d_gx, d_gh, opt(db_ih), opt(db_hh));
  });
}

}  // namespace mgrit
