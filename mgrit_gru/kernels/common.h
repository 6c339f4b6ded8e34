// Shared pieces of the compiled CPU sweeps (mgrit_gru/gru/cpu.cpp, mgrit_gru/lstm/cpu.cpp).
//
// A sweep runs steps j0 .. j0 + S - 1 of every chunk in one call: per step one GEMM (our own
// loop for a few rows, where ATen's call costs more than its arithmetic; ATen's GEMM for
// many), then one loop over the rows that does the whole step's gate math. Tensors arrive as
// (S, n, B, W) views with any strides but a contiguous last axis; a row is (chunk, batch).
#pragma once

#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mgrit {

using at::Tensor;

// Rows at or below this use the own GEMM loop; above it ATen's (measured: kernels/README).
constexpr int64_t SMALL_ROWS = 64;

// exp for float32, vectorisable: 2^n * p(r) with r = x - n ln2 in [-ln2/2, ln2/2] (Cephes's
// polynomial, about 1 ulp). NaN stays NaN (the comparisons are false for it); the clamp keeps
// 2^n normal, where exp over/underflows anyway for a sigmoid or tanh.
static inline float fexp(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

template <typename T>
static inline T sigm(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <>
inline float sigm<float>(float x) {
  return 1.0f / (1.0f + fexp(-x));
}

template <typename T>
static inline T tanh_(T x) {
  return std::tanh(x);
}
template <>
inline float tanh_<float>(float x) {
  // 1 - 2 / (e^{2x} + 1): absolute error at float32's rounding near 0, exact limits
  return 1.0f - 2.0f / (fexp(2.0f * x) + 1.0f);
}

// In-place activations over n contiguous values: loops the compiler vectorises.
template <typename T>
static inline void sigmoid_inplace(T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) x[k] = sigm<T>(x[k]);
}
template <typename T>
static inline void tanh_inplace(T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) x[k] = tanh_<T>(x[k]);
}

// A (S, n, B, W) view: row (c, b) of step s.
template <typename T>
struct View {
  T* p = nullptr;
  int64_t ss = 0, sc = 0, sb = 0;
  int64_t B = 1;
  View() = default;
  explicit View(const Tensor& t) {
    if (!t.defined()) return;
    TORCH_CHECK(t.dim() == 4 && (t.stride(3) == 1 || t.size(3) == 1), "mgrit kernels: expected (S, n, B, W) with a contiguous last axis");
    p = t.data_ptr<T>();
    ss = t.stride(0);
    sc = t.stride(1);
    sb = t.stride(2);
    B = t.size(2);
  }
  bool defined() const { return p != nullptr; }
  T* row(int64_t s, int64_t r) const { return p + s * ss + (r / B) * sc + (r % B) * sb; }
};

// out[r, :] = sum_k a[r][k] * w[k, :] (+ out[r, :] if accumulate) for R rows of a, w (K, N)
// contiguous; rows as pointers. Four rows share each row of w.
template <typename T>
static void small_gemm(T* const* a, int64_t R, int64_t K, const T* w, int64_t N, T* out, bool accumulate) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) {
    T* o0 = out + r * N;
    T* o1 = o0 + N;
    T* o2 = o1 + N;
    T* o3 = o2 + N;
    if (!accumulate) {
      for (int64_t j = 0; j < 4 * N; ++j) o0[j] = T(0);
    }
    const T *a0 = a[r], *a1 = a[r + 1], *a2 = a[r + 2], *a3 = a[r + 3];
    for (int64_t k = 0; k < K; ++k) {
      const T* wk = w + k * N;
      const T x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
#pragma GCC ivdep
      for (int64_t j = 0; j < N; ++j) {
        const T v = wk[j];
        o0[j] += x0 * v;
        o1[j] += x1 * v;
        o2[j] += x2 * v;
        o3[j] += x3 * v;
      }
    }
  }
  for (; r < R; ++r) {
    T* o = out + r * N;
    if (!accumulate) {
      for (int64_t j = 0; j < N; ++j) o[j] = T(0);
    }
    const T* ar = a[r];
    for (int64_t k = 0; k < K; ++k) {
      const T* wk = w + k * N;
      const T x = ar[k];
#pragma GCC ivdep
      for (int64_t j = 0; j < N; ++j) o[j] += x * wk[j];
    }
  }
}

// out (R, N) = rows (R, K) @ w (K, N): the own loop for few rows, else ATen's GEMM on a
// matrix of the rows (a copy where the rows are not one strided matrix).
template <typename T>
static void rows_gemm(const View<T>& v, int64_t s, int64_t R, int64_t K, const Tensor& w, Tensor& out,
                      std::vector<T*>& ptrs, Tensor& stage) {
  ptrs.resize(R);
  for (int64_t r = 0; r < R; ++r) ptrs[r] = v.row(s, r);
  if (R <= SMALL_ROWS) {
    small_gemm<T>(ptrs.data(), R, K, w.data_ptr<T>(), w.size(1), out.data_ptr<T>(), false);
    return;
  }
  // one matrix when row r sits at r * stride (chunks of B rows laid out evenly)
  bool even = (v.B == 1) || (v.sc == v.B * v.sb);
  int64_t stride = v.B == 1 ? v.sc : v.sb;
  Tensor mat;
  if (even) {
    mat = at::from_blob(ptrs[0], {R, K}, {stride, 1}, out.options());
  } else {
    T* dst = stage.data_ptr<T>();
    for (int64_t r = 0; r < R; ++r) std::memcpy(dst + r * K, ptrs[r], sizeof(T) * K);
    mat = stage;
  }
  at::mm_out(out, mat, w);
}

inline void check_same(const Tensor& t, const Tensor& like, const char* name) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == like.scalar_type(),
              "mgrit kernels: ", name, " must be a CPU tensor of the states' dtype");
}

}  // namespace mgrit
