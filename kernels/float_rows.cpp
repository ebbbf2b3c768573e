// y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias) on a CPU with W in fp32 as the model holds it, each row of x computed alone.
// The plain reference is float_rows.py's reference().
//
// The arithmetic, for one output (m, n); it is the same sequence whatever M, the other rows, the thread count or the
// path, so a pass's row has the bits of a one-token step:
//
//   x_k        widened exactly to fp32 where x is bf16 (a bf16 is the top half of an fp32)
//   lanes      acc_l = fma(x_k, w_k, acc_l) for k = l, l + 8, l + 16, … < K, in increasing k (8 lanes, one rounding
//              a multiply-add), every acc_l starting at +0
//   y          s_l = acc_l + acc_l+4 (l < 4), t_l = s_l + s_l+2 (l < 2), t_0 + t_1, then + bias_n, rounded once to the
//              output dtype (x's: bf16 as torch's .to rounds)
//
// Each output is computed by one thread (the work split over N only). The AVX2 path holds a tile of 3 rows of x × 4
// rows of W in 12 ymm accumulators (one per output: its 8 lanes) and sweeps K; the portable path runs the same fmas
// with std::fma (correctly rounded: the same bits, slowly). -ffp-contract=off: the tree's adds stay adds.
//
// Cost: the weights are read from memory once per call whatever M (a block of 4 rows stays in L1 while every row of x
// passes over it), so a step of one row reads what a pass of eleven does; torch's fp32 GEMM (MKL) read Whisper base's
// 51 865 × 512 output layer at ~5 GB/s for 4 rows (benchmarks/README.md, fifteenth session).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FR_X86 1
#else
#define FR_X86 0
#endif

namespace {

enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2 };

constexpr int MR = 3, NR = 4;  // a tile: rows of x × rows of W

struct Call {
  int64_t M, N, K;
  const float* x;     // [M, K] fp32
  const float* w;     // [N, K] fp32
  const float* bias;  // [N] fp32, or null
  float* y;           // [M, N] fp32, or null: then
  uint16_t* yb;       // [M, N] bf16
};

// the output (m, n) from its 8 lanes
inline void finish(const Call& c, int64_t m, int64_t n, const float* a) {
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  const float t0 = s0 + s2, t1 = s1 + s3;
  float v = t0 + t1;
  if (c.bias) v = v + c.bias[n];
  if (c.yb) c.yb[m * c.N + n] = c10::BFloat16(v).x;
  else c.y[m * c.N + n] = v;
}

// lanes k0 … K − 1 of (m, n) onto a
inline void tail(const Call& c, int64_t m, int64_t n, int64_t k0, float* a) {
  for (int64_t k = k0; k < c.K; k++) a[k % 8] = std::fma(c.x[m * c.K + k], c.w[n * c.K + k], a[k % 8]);
}

// rows m0 … m0 + mr − 1 of x against rows n0 … n0 + nr − 1 of W
void tile_portable(const Call& c, int64_t m0, int mr, int64_t n0, int nr) {
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      tail(c, m0 + i, n0 + j, 0, a);
      finish(c, m0 + i, n0 + j, a);
    }
}

#if FR_X86
#define AVX2_FN __attribute__((target("avx2,fma")))

template <int R, int S>
AVX2_FN void tile_avx2(const Call& c, int64_t m0, int64_t n0) {
  __m256 acc[R][S];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < S; j++) acc[i][j] = _mm256_setzero_ps();
  const int64_t K = c.K, K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 xv[R];
    for (int i = 0; i < R; i++) xv[i] = _mm256_loadu_ps(c.x + (m0 + i) * K + k);
    for (int j = 0; j < S; j++) {
      const __m256 wv = _mm256_loadu_ps(c.w + (n0 + j) * K + k);
      for (int i = 0; i < R; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; i++)
    for (int j = 0; j < S; j++) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[i][j]);
      tail(c, m0 + i, n0 + j, K8, a);
      finish(c, m0 + i, n0 + j, a);
    }
}

template <int S>
AVX2_FN void rows_avx2(const Call& c, int64_t n0) {
  int64_t m = 0;
  for (; m + MR <= c.M; m += MR) tile_avx2<MR, S>(c, m, n0);
  if (c.M - m == 2) tile_avx2<2, S>(c, m, n0);
  else if (c.M - m == 1) tile_avx2<1, S>(c, m, n0);
}

AVX2_FN void block_avx2(const Call& c, int64_t n0, int nr) {
  if (nr == NR) return rows_avx2<NR>(c, n0);
  for (int j = 0; j < nr; j++) rows_avx2<1>(c, n0 + j);  // the last rows of W
}
#endif  // FR_X86

int detect() {
#if FR_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
#endif
  return PORTABLE;
}

int best_path() {
  static int p = detect();
  return p;
}

std::string backend() { return best_path() == AVX2 ? "AVX2" : "portable C++"; }

// x [..., K] fp32 or bf16; w [N, K] fp32, contiguous; bias [N] or none; path 0 = the best this CPU has
// -> [..., N] in x's dtype
torch::Tensor mm(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t path) {
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "float_rows: path ", path, " does not run on this CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "float_rows: x must be fp32 or bf16");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kFloat,
              "float_rows: w must be a contiguous [N, K] fp32 tensor");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "float_rows: CPU tensors only");
  const int64_t K = x.size(-1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "float_rows: x has ", K, " columns, the weights ", w.size(1));
  auto x2 = x.reshape({-1, K}).to(at::kFloat).contiguous();  // bf16 widened exactly
  const int64_t M = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  auto y = torch::empty(shape, x.options());
  torch::Tensor b;
  if (bias && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == N, "float_rows: bias must have N elements");
  }
  if (M == 0 || N == 0) return y;
  Call c{M, N, K, x2.data_ptr<float>(), w.data_ptr<float>(),
         b.defined() ? b.data_ptr<float>() : nullptr, nullptr, nullptr};
  if (x.scalar_type() == at::kFloat) c.y = y.data_ptr<float>();
  else c.yb = (uint16_t*)y.data_ptr<c10::BFloat16>();
  // blocks of NR rows of W over threads, ≥ ~64 K multiply-adds a task
  const int64_t blocks = (N + NR - 1) / NR;
  const int64_t grain = std::max<int64_t>(1, 65536 / (NR * K * M));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; blk++) {
      const int64_t n0 = blk * NR;
      const int nr = (int)std::min<int64_t>(NR, N - n0);
#if FR_X86
      if (path == AVX2) {
        block_avx2(c, n0, nr);
        continue;
      }
#endif
      for (int64_t m0 = 0; m0 < M; m0 += MR) tile_portable(c, m0, (int)std::min<int64_t>(MR, M - m0), n0, nr);
    }
  });
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "y = x · Wᵀ (+ bias), W fp32, each row of x computed alone");
  m.def("backend", &backend, "the SIMD path this CPU runs");
  m.def("best_path", &best_path, "its number (1 portable, 2 AVX2)");
}
