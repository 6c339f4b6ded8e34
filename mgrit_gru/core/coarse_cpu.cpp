// The coarse levels' chunk maps (mgrit_gru/core/coarse.py) as one compiled sweep.
//
// A frozen or secant coarse level steps v_{k+1} = a_k * v_k + W_k^T (P_k v_k) + g_k: a diagonal
// factor, an optional rank-q coupling (W_k, P_k: q x H per row) and the FAS right-hand side.
// Stepped in PyTorch that is four to six operators of a few rows each per step, thousands of
// microseconds a coarse solve that does some microseconds of arithmetic; and it is the one
// sequential part of a cycle. Here every row (chunk x sequence) runs all the sweep's steps
// in one call, the rows in blocks over the threads (over_blocks), with no barrier between
// steps. It knows nothing of the cells: only states of width H.
#include "../kernels/common.h"

namespace mgrit {

namespace {

// A (S, n, R, q, H) view with a contiguous last axis: the coupling's q vectors of row (c, r).
template <typename T>
struct Coupling {
  T* p = nullptr;
  int64_t ss = 0, sc = 0, sr = 0, sq = 0, R = 1, q = 0;
  Coupling() = default;
  explicit Coupling(const Tensor& t) {
    if (!t.defined()) return;
    TORCH_CHECK(t.dim() == 5 && (t.stride(4) == 1 || t.size(4) == 1),
                "map_sweep: expected the coupling as (S, n, R, q, H) with a contiguous last axis");
    p = t.data_ptr<T>();
    ss = t.stride(0);
    sc = t.stride(1);
    sr = t.stride(2);
    sq = t.stride(3);
    R = t.size(2);
    q = t.size(3);
  }
  const T* at(int64_t s, int64_t row, int64_t i) const { return p + s * ss + (row / R) * sc + (row % R) * sr + i * sq; }
};

template <typename T>
void map_sweep_impl(const Tensor& x0, Tensor& out, const Tensor& a, const Tensor& g, const Tensor& W,
                    const Tensor& P) {
  const int64_t S = out.size(0), rows = out.size(1) * out.size(2), H = out.size(3);
  const View<T> vx(x0), vo(out), va(a), vg(g);
  const Coupling<T> cw(W), cp(P);
  const int64_t q = cw.q;
  over_blocks(rows, rows * S * H, [&](int64_t r0, int64_t r1) {
    std::vector<T> acc(H), coef(std::max<int64_t>(q, 1));
    for (int64_t r = r0; r < r1; ++r) {
      const T* prev = vx.row(0, r);
      for (int64_t s = 0; s < S; ++s) {
        T* o = vo.row(s, r);
        const T* f = va.row(s, r);
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t i = 0; i < q; ++i) {  // coefficient i: P_i . v, then its W_i
          const T* pi = cp.at(s, r, i);
          T c = 0;
          for (int64_t h = 0; h < H; ++h) c += pi[h] * prev[h];
          const T* wi = cw.at(s, r, i);
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) acc[h] += c * wi[h];
        }
        if (vg.defined()) {
          const T* gs = vg.row(s, r);
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) o[h] = f[h] * prev[h] + acc[h] + gs[h];
        } else {
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) o[h] = f[h] * prev[h] + acc[h];
        }
        prev = o;
      }
    }
  });
}

// The product along each row's m steps, s outer so that a block's rows of one step are read
// together; a running product below the dtype's smallest normal number is flushed to zero
// (subnormal arithmetic costs x86 cores ~100 cycles an operation, and a product of hundreds
// of gate factors in (0, 1) passes through that range on its way to zero). With factors of
// magnitude at most 1 (the gates' z, 1 - theta at step sizes <= 1, an LSTM's f) that is the
// product's own limit; a later factor above 1 cannot raise a flushed product again (and a
// flushed product times an infinite factor is NaN where torch's gives inf: non-finite alike).
template <typename T>
void chunk_product_impl(const Tensor& f, Tensor& out) {
  const int64_t m = f.size(0), rows = f.size(1) * f.size(2), H = f.size(3);
  const View<T> vf(f), vo(out.unsqueeze(0));
  const T tiny = std::numeric_limits<T>::min();
  over_blocks(rows, rows * m * H, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::fill(vo.row(0, r), vo.row(0, r) + H, T(1));
    for (int64_t s = 0; s < m; ++s)  // 1 * x is x: the first step is flushed like the rest
      for (int64_t r = r0; r < r1; ++r) {
        T* o = vo.row(0, r);
        const T* x = vf.row(s, r);
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) {
          const T v = o[h] * x[h];
          o[h] = std::abs(v) < tiny ? T(0) : v;
        }
      }
  });
}

}  // namespace

// Steps j0 .. j0 + S - 1 of every row: out[s] = a[s] * v + W[s]^T (P[s] v) + g[s], v = x0[0]
// for s = 0 and out[s - 1] after. x0 (1, n, R, H), out, a, g (S, n, R, H), W and P (S, n, R, q,
// H) or both absent (the frozen map); views with any strides but a contiguous last axis.
void map_sweep(const Tensor& x0, Tensor out, const Tensor& a, const c10::optional<Tensor>& g,
               const c10::optional<Tensor>& W, const c10::optional<Tensor>& P) {
  const Tensor gt = g.has_value() ? *g : Tensor(), wt = W.has_value() ? *W : Tensor(),
               pt = P.has_value() ? *P : Tensor();
  TORCH_CHECK(wt.defined() == pt.defined(), "map_sweep: the coupling needs both W and P");
  for (const Tensor& t : {x0, a, gt, wt, pt}) check_same(t, out, "every argument");
  TORCH_CHECK(out.dim() == 4 && x0.dim() == 4 && x0.size(0) == 1, "map_sweep: x0 (1, n, R, H), out (S, n, R, H)");
  TORCH_CHECK(a.sizes() == out.sizes() && (!gt.defined() || gt.sizes() == out.sizes()),
              "map_sweep: a and g must have out's shape");
  TORCH_CHECK(x0.size(1) == out.size(1) && x0.size(2) == out.size(2) && x0.size(3) == out.size(3),
              "map_sweep: x0 must be one step of out's rows");
  if (wt.defined())
    TORCH_CHECK(wt.dim() == 5 && wt.sizes() == pt.sizes() && wt.size(0) == out.size(0) && wt.size(1) == out.size(1) &&
                    wt.size(2) == out.size(2) && wt.size(4) == out.size(3),
                "map_sweep: W and P must be (S, n, R, q, H) of out's steps and rows");
  if (out.size(0) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "map_sweep", [&] { map_sweep_impl<scalar_t>(x0, out, a, gt, wt, pt); });
}

// Per row of factors (m, n, R, H) (any strides, a contiguous last axis): the product of its m
// steps into out (n, R, H) contiguous, subnormal running products flushed to zero; the
// frozen coarse maps' chunk factors (mgrit_gru/core/coarse.py's chunk_product).
void chunk_product(const Tensor& factors, Tensor out) {
  check_same(factors, out, "chunk_product's out and factors");
  TORCH_CHECK(factors.dim() == 4 && factors.size(0) >= 1 && out.is_contiguous() &&
                  out.sizes() == factors.sizes().slice(1),
              "chunk_product: expected factors (m, n, R, H) with m >= 1 and out (n, R, H) contiguous; got factors ",
              factors.sizes(), " and out ", out.sizes(), out.is_contiguous() ? "" : " (not contiguous)");
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "chunk_product", [&] { chunk_product_impl<scalar_t>(factors, out); });
}

}  // namespace mgrit
