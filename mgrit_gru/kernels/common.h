// Shared pieces of the compiled CPU sweeps (mgrit_gru/gru/cpu.cpp, mgrit_gru/lstm/cpu.cpp).
//
// A sweep runs steps j0 .. j0 + S - 1 of every chunk in one call, over blocks of rows (a row
// is one chunk's sequence) that each go through all S steps (over_blocks: one parallel region
// per sweep, no barrier between steps): per step and block one GEMM (our own loop for a few
// rows, where ATen's call costs more than its arithmetic; ATen's GEMM for many), then one loop
// over the block's rows that does the whole step's gate math. Tensors arrive as
// (S, n, B, W) views with any strides but a contiguous last axis; a row is (chunk, batch).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

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

// W (K, N) repacked once per call into panels of PW columns, [N / PW][K][PW], zero past N:
// the GEMM below then reads each panel front to back while four rows' accumulators of PW
// columns stay in registers.
constexpr int64_t PW = 16;

template <typename T>
struct Panels {
  std::vector<T> data;
  int64_t K = 0, N = 0, nb = 0;
  Panels(const T* w, int64_t K_, int64_t N_) : K(K_), N(N_), nb((N_ + PW - 1) / PW) {
    data.assign(nb * K * PW, T(0));
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < PW && b * PW + c < N; ++c) data[(b * K + k) * PW + c] = w[k * N + b * PW + c];
  }
};

// Four rows of out = a @ W (the first `store` of them written): per panel, four accumulators
// of PW columns held in registers; four independent chains keep the FMA units busy, so a
// block of fewer rows repeats one (computed, not stored).
template <typename T>
static inline void panel_rows(const T* const* a, const Panels<T>& P, T* out, int store) {
  const int64_t K = P.K, N = P.N;
  for (int64_t b = 0; b < P.nb; ++b) {
    const T* p = P.data.data() + b * K * PW;
    T acc[4][PW] = {};
    for (int64_t k = 0; k < K; ++k) {
      const T* pk = p + k * PW;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const T x = a[i][k];
#pragma omp simd
        for (int64_t c = 0; c < PW; ++c) acc[i][c] += x * pk[c];
      }
    }
    const int64_t j0 = b * PW, w = std::min<int64_t>(PW, N - j0);
    for (int i = 0; i < store; ++i) std::memcpy(out + i * N + j0, acc[i], sizeof(T) * w);
  }
}

// out[r, :] = sum_k a[r][k] * W[k, :] for R rows given as pointers; out (R, N) contiguous.
template <typename T>
static void panel_gemm(T* const* a, int64_t R, const Panels<T>& P, T* out) {
  for (int64_t r = 0; r < R; r += 4) {
    const int store = static_cast<int>(std::min<int64_t>(4, R - r));
    const T* rows[4] = {a[r], a[r + (store > 1)], a[r + 2 * (store > 2)], a[r + 3 * (store > 3)]};
    panel_rows<T>(rows, P, out + r * P.N, store);
  }
}

// Rows [r0, r1) of out (R, N) = rows (R, K) @ w (K, N), the rows read from step s of `v`
// (`ptrs`, indexed by row, gets their addresses): the panel GEMM for few rows (packed in
// `panels`), else ATen's GEMM on a matrix of the rows (a copy into the same rows of `stage`
// where they are not one strided matrix). Inside a sweep's parallel region ATen's GEMM runs on
// the calling thread alone.
template <typename T>
static void rows_gemm(const View<T>& v, int64_t s, int64_t r0, int64_t r1, int64_t K, const Tensor& w,
                      const Panels<T>& panels, Tensor& out, T** ptrs, Tensor& stage) {
  const int64_t Rb = r1 - r0;
  for (int64_t r = r0; r < r1; ++r) ptrs[r] = v.row(s, r);
  if (Rb <= SMALL_ROWS) {
    panel_gemm<T>(ptrs + r0, Rb, panels, out.data_ptr<T>() + r0 * panels.N);
    return;
  }
  // one matrix when row r sits at r * stride (chunks of B rows laid out evenly)
  bool even = (v.B == 1) || (v.sc == v.B * v.sb);
  int64_t stride = v.B == 1 ? v.sc : v.sb;
  Tensor mat;
  if (even) {
    mat = at::from_blob(ptrs[r0], {Rb, K}, {stride, 1}, out.options());
  } else {
    T* dst = stage.data_ptr<T>();
    for (int64_t r = r0; r < r1; ++r) std::memcpy(dst + r * K, ptrs[r], sizeof(T) * K);
    mat = stage.narrow(0, r0, Rb);
  }
  Tensor part = out.narrow(0, r0, Rb);
  at::mm_out(part, mat, w);
}

// Rows [r0, r1) of prod (R, N) = rows (R, K) @ w, the rows already written (`ptrs` point at
// them for the panel GEMM; `rows` holds them as one matrix for ATen's, from its row `first`).
template <typename T>
static void prepared_gemm(int64_t r0, int64_t r1, T* const* ptrs, const Panels<T>& panels, const Tensor& rows,
                          int64_t first, const Tensor& w, Tensor& prod) {
  const int64_t Rb = r1 - r0;
  if (Rb <= SMALL_ROWS) {
    panel_gemm<T>(ptrs + r0, Rb, panels, prod.data_ptr<T>() + r0 * panels.N);
    return;
  }
  Tensor part = prod.narrow(0, r0, Rb);
  at::mm_out(part, rows.narrow(0, first + r0, Rb), w);
}

// A sweep's rows in blocks of about R / BLOCKS rows (whole groups of four, the panel GEMM's;
// at most BLOCK_ROWS). A block runs all of the sweep's steps before the next block starts: its
// states and gates stay in the core's cache from step to step. The blocks depend on R alone,
// not on the thread count, so that every thread count rounds alike (results are bit for bit
// the same at 1, 2 or 16 threads).
constexpr int64_t BLOCKS = 16;
constexpr int64_t BLOCK_ROWS = 256;
// Work (rows x steps x hidden) below which a sweep stays on one thread: a parallel region costs
// some microseconds to open, a step of a few rows less than that.
constexpr int64_t PARALLEL_WORK = 1 << 12;
// A region ends when its last thread arrives. Where another process keeps one of the cores
// busy, a thread the OS has descheduled arrives a time slice (milliseconds) late, after the
// others did every block: a short sweep then takes longer on two threads than on one. So a
// sweep below STEADY_WORK (about a millisecond or more on one core) runs on one thread while
// the regions find a thread late (one that did no block of its region), probing every
// PROBE_EVERY-th such sweep; LATE_MEMORY regions in a row with every thread on time open them
// again. Larger sweeps always open their region (their blocks absorb the delay).
constexpr int64_t STEADY_WORK = 1 << 18;
constexpr int PROBE_EVERY = 8;
constexpr int LATE_MEMORY = 3;

struct Lateness {
  std::atomic<int> late{0};    // > 0: a recent region found a thread late
  std::atomic<int64_t> small{0};  // short sweeps seen while late (for the probes)
};
inline Lateness& lateness() {
  static Lateness state;
  return state;
}

// block(r0, r1) over the R rows of a sweep whose `work` is rows x steps x hidden. Rows of a
// sweep need nothing of each other (every chunk and sequence advances on its own), so with
// several threads the sweep opens ONE parallel region: each thread takes blocks one after
// another from a shared counter and runs every step of each; no thread waits for another
// between steps, and a thread the OS deschedules holds up only the block it has, not every
// step: the others take over the blocks it has not started.
template <typename F>
inline void over_blocks(int64_t R, int64_t work, F&& block) {
  int64_t per = std::min<int64_t>(BLOCK_ROWS, (R + BLOCKS - 1) / BLOCKS);
  per = std::max<int64_t>(4, (per + 3) / 4 * 4);
  const int64_t blocks = (R + per - 1) / per;
  int64_t threads = work >= PARALLEL_WORK ? std::min<int64_t>(at::get_num_threads(), blocks) : 1;
  Lateness& state = lateness();
  const bool short_sweep = work < STEADY_WORK;
  if (threads > 1 && short_sweep && state.late.load(std::memory_order_relaxed) > 0 &&
      state.small.fetch_add(1, std::memory_order_relaxed) % PROBE_EVERY != 0)
    threads = 1;
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t b = 0; b < blocks; ++b) block(b * per, std::min(R, (b + 1) * per));
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<int> idle{0};
  // OpenMP's threads start from default thread-local state (grad mode on, ...): they take the
  // caller's, and record no graph (the blocks' ATen GEMMs write into buffers that views of
  // weights needing grad feed)
  const at::ThreadLocalState caller;
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    at::ThreadLocalStateGuard tls(caller);
    c10::AutoGradMode no_grad(false);
    int64_t mine = 0;
    for (int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1), ++mine)
      block(b * per, std::min(R, (b + 1) * per));
    if (mine == 0) idle.fetch_add(1);
  });
  if (!short_sweep) return;
  if (idle.load() > 0) {
    state.late.store(LATE_MEMORY, std::memory_order_relaxed);
  } else {
    int late = state.late.load(std::memory_order_relaxed);
    if (late > 0) state.late.compare_exchange_strong(late, late - 1, std::memory_order_relaxed);
  }
}

// over_blocks for a sweep whose last step may end an early-exiting F-relaxation
// (mgrit_gru/core/cycle.py's f_relax): that step overwrites states a previous sweep left in
// out's last step. With `stored` ((n * B, W) contiguous) and `change` (one value of the
// states' dtype) given, each block first sets its rows of those states aside in `stored`, runs
// its steps, then takes the largest |new - stored| over its rows while they are in its cache;
// `change` gets the largest over the blocks (NaN where any difference is NaN, as torch's max
// of a tensor). The same numbers as (out[S - 1] - stored).abs().max() after the sweep, without
// that copy and those passes on the calling thread. Undefined tensors: over_blocks alone.
template <typename T, typename F>
inline void checked_blocks(const Tensor& out, const Tensor& stored, const Tensor& change, int64_t R, int64_t work,
                           F&& block) {
  if (!stored.defined()) {
    over_blocks(R, work, block);
    return;
  }
  const int64_t S = out.size(0), W = out.size(3);
  TORCH_CHECK(stored.is_contiguous() && stored.dim() == 3 && stored.size(0) == out.size(1) &&
                  stored.size(1) == out.size(2) && stored.size(2) == W && change.numel() == 1,
              "mgrit kernels: an exit check needs stored (n, B, W) contiguous and change of one value");
  const View<T> last(out.narrow(0, S - 1, 1));
  T* kept = stored.data_ptr<T>();
  std::mutex lock;
  T worst = T(0);
  bool nan = false;
  over_blocks(R, work, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(kept + r * W, last.row(0, r), sizeof(T) * W);
    block(r0, r1);
    T mine = T(0);
    bool mine_nan = false;
    for (int64_t r = r0; r < r1; ++r) {
      const T* now = last.row(0, r);
      const T* before = kept + r * W;
      for (int64_t k = 0; k < W; ++k) {
        const T d = std::abs(now[k] - before[k]);
        mine_nan |= d != d;
        mine = d > mine ? d : mine;
      }
    }
    const std::lock_guard<std::mutex> hold(lock);
    nan |= mine_nan;
    worst = mine > worst ? mine : worst;
  });
  change.fill_(nan ? std::numeric_limits<T>::quiet_NaN() : worst);
}

// fn(k, back, b, scratch) for every row b of every step k = 0 .. Tn - 1 of a pass over the
// whole sequence (back = Tn - 1 - k: the step's index in reversed time), the steps in blocks
// shared among the threads (over_blocks, rows = steps); scratch: H values of the block's own.
template <typename T, typename F>
inline void over_steps(int64_t Tn, int64_t B, int64_t H, F&& fn) {
  over_blocks(Tn, Tn * B * H, [&](int64_t k0, int64_t k1) {
    std::vector<T> scratch(H);
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t b = 0; b < B; ++b) fn(k, Tn - 1 - k, b, scratch.data());
  });
}

// What a serial adjoint in one call carries from step to step: lam (B, W), the direct part of
// the next lam (B, W) and the recurrent GEMM's product (B, H); lam starts at
// d_out[T - 1] + d_last (the gradient of the last state, from the output and from h_n).
template <typename T>
struct SerialLam {
  Tensor lam, next, prod;
  T *L, *N, *PR;
  SerialLam(const Tensor& d_out, const Tensor& d_last, int64_t B, int64_t W, int64_t H)
      : lam(at::empty({B, W}, d_out.options())),
        next(at::empty({B, W}, d_out.options())),
        prod(at::empty({B, H}, d_out.options())),
        L(lam.data_ptr<T>()),
        N(next.data_ptr<T>()),
        PR(prod.data_ptr<T>()) {
    const T* f = d_out.data_ptr<T>() + (d_out.size(0) - 1) * B * W;
    const T* dl = d_last.data_ptr<T>();
    for (int64_t i = 0; i < B * W; ++i) L[i] = f[i] + dl[i];
  }
};

inline void check_same(const Tensor& t, const Tensor& like, const char* name) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == like.scalar_type(),
              "mgrit kernels: ", name, " must be a CPU tensor of the states' dtype");
}

// check_same for every tensor given (undefined ones pass), each contiguous too (`kernel`: the
// function's name, in the error).
inline void check_contiguous(std::initializer_list<Tensor> tensors, const Tensor& like, const char* kernel) {
  for (const Tensor& t : tensors) {
    check_same(t, like, "every argument");
    TORCH_CHECK(!t.defined() || t.is_contiguous(), kernel, ": contiguous tensors only");
  }
}

}  // namespace mgrit
