// y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias) on a CPU with W in fp32 or bf16 as the model holds it, each row of x computed
// alone. The plain reference is float_rows.py's reference().
//
// The arithmetic, for one output (m, n); it is the same sequence whatever M, the other rows, the thread count or the
// path, so a pass's row has the bits of a one-token step:
//
//   x_k, w_k   widened exactly to fp32 where bf16 (a bf16 is the top half of an fp32): bf16 weights give the bits of
//              their fp32 copy
//   lanes      acc_l = fma(x_k, w_k, acc_l) for k = l, l + 8, l + 16, … < K, in increasing k (8 lanes, one rounding
//              a multiply-add), every acc_l starting at +0
//   y          s_l = acc_l + acc_l+4 (l < 4), t_l = s_l + s_l+2 (l < 2), t_0 + t_1, then + bias_n, rounded once to the
//              output dtype (x's: bf16 as torch's .to rounds)
//
// Each output is computed by one thread (the work split over blocks of 8 rows of W). The AVX2 path holds a tile of
// 3 rows of x × 4 rows of W in 12 ymm accumulators (one per output: its 8 lanes) and sweeps K; the AVX-512 path a
// tile of 4 rows of x × 8 rows of W in 16 zmm, each holding two outputs' 8 lanes (W rows n, n + 1 side by side, x's
// 8 values twice); the portable path runs the same fmas with std::fma (correctly rounded: the same bits, slowly).
// -ffp-contract=off: the tree's adds stay adds.
//
// Cost: the weights are read from memory once per call whatever M (a block of 8 rows stays in L1 while every row of x
// passes over it, the next one fetched meanwhile), so a step of one row reads what a pass of eleven does; torch's fp32
// GEMM (MKL) read Whisper base's 51 865 × 512 output layer at ~5 GB/s for 4 rows (benchmarks/README.md, fifteenth
// session). Many rows are bound by the fp32 multiply-adds (sixteenth session: ~60 % of their peak on a Zen 5).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "bf16_bits.h"  // bf16_c10_8
#define FR_X86 1
#else
#define FR_X86 0
#endif

namespace {

enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512 = 3 };

constexpr int MR = 3, NR = 4;  // the AVX2 tile: rows of x × rows of W
constexpr int BLOCK = 8;       // rows of W a task takes at a time
// A call fetches W's rows AHEAD_TILES tiles on while it reads a tile's (tile_ahead, fetch_ahead). Whisper base's 61
// bf16 layers in model order at 4 rows, AVX-512 path: 3.90 ms with the hardware's prefetch alone, 2.99 one tile ahead,
// 3.14 two, 3.30 four; AVX2 path (forced on the same CPU), fp32 weights as an AVX2 CPU holds them: 4 rows 8.12 -> 4.44
// ms, 8 rows 11.1 -> 6.1 (two or four tiles: 4.52, 4.85). One process, interleaved, AMD EPYC Zen 5, same outputs. With
// it, tiles of 4 rows reading W as it is beat a copy of each block widened to fp32 once for calls of many rows
// (sixteenth session): 8 rows 4.89 -> 3.39 ms, 20 rows 8.75 -> 7.53, 44 rows 15.0 -> 14.3; that copy is gone.
constexpr int AHEAD_TILES = 1;

// an fp32 weight as it is, a bf16 one (its bits) widened exactly
inline float widen(float w) { return w; }
inline float widen(uint16_t w) {
  const uint32_t u = uint32_t(w) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename W>
struct Call {
  int64_t M, N, K;
  const float* x;     // [M, K] fp32
  const W* w;         // [N, K] fp32, or bf16 bits
  const float* bias;  // [N] fp32, or null
  float* y;           // [M, N] fp32, or null: then
  uint16_t* yb;       // [M, N] bf16
};

// the output (m, n): its lanes' sum v, then + bias_n, rounded to y's dtype
template <typename W>
inline void store(const Call<W>& c, int64_t m, int64_t n, float v) {
  if (c.bias) v = v + c.bias[n];
  if (c.yb) c.yb[m * c.N + n] = c10::BFloat16(v).x;
  else c.y[m * c.N + n] = v;
}

// the output (m, n) from its 8 lanes
template <typename W>
inline void finish(const Call<W>& c, int64_t m, int64_t n, const float* a) {
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  const float t0 = s0 + s2, t1 = s1 + s3;
  store(c, m, n, t0 + t1);
}

// lanes k0 … K − 1 of (m, n) onto a
template <typename W>
inline void tail(const Call<W>& c, int64_t m, int64_t n, int64_t k0, float* a) {
  for (int64_t k = k0; k < c.K; k++) a[k % 8] = std::fma(c.x[m * c.K + k], widen(c.w[n * c.K + k]), a[k % 8]);
}

// rows m0 … m0 + mr − 1 of x against rows n0 … n0 + nr − 1 of W
template <typename W>
void tile_portable(const Call<W>& c, int64_t m0, int mr, int64_t n0, int nr) {
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      tail(c, m0 + i, n0 + j, 0, a);
      finish(c, m0 + i, n0 + j, a);
    }
}

#if FR_X86
#define AVX2_FN __attribute__((target("avx2,fma")))
#define AVX512_FN __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))

// The tile of `rows` rows of W AHEAD_TILES tiles on from row n0, fetched once a call (by its first rows of x, m0 = 0),
// or null past W. These two helpers carry the SIMD paths' target and are always inlined: without, GCC called them
// from the loops and the calls of 4–20 rows ran 1.2–1.7× slower.
template <typename W>
[[gnu::always_inline]] AVX2_FN inline const char* tile_ahead(const Call<W>& c, int64_t m0, int64_t n0, int64_t rows) {
  const bool fetch = m0 == 0 && n0 + (AHEAD_TILES + 1) * rows <= c.N;
  return fetch ? (const char*)(c.w + (n0 + AHEAD_TILES * rows) * c.K) : nullptr;
}

// The part of that tile a step k … k + 7 of a tile's sweep reads, in order (STEP bytes a step: the tile swept as the
// one being read)
template <int64_t STEP>
[[gnu::always_inline]] AVX2_FN inline void fetch_ahead(const char* ahead, int64_t k) {
  if (ahead)
    for (int64_t l = 0; l < STEP; l += 64) _mm_prefetch(ahead + k / 8 * STEP + l, _MM_HINT_T0);
}

// 8 weights from k on, as fp32
AVX2_FN inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
AVX2_FN inline __m256 load8(const uint16_t* w) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

// finish's tree on the 8 lanes of a, in vector lanes (the same adds of the same pairs, so the same bits): lane 0
// ends as t0 + t1
AVX2_FN inline __m256 tree8(__m256 a) {
  const __m256 s = _mm256_add_ps(a, _mm256_permute2f128_ps(a, a, 1));  // lanes 0–3: s_l = a_l + a_l+4
  const __m256 t = _mm256_add_ps(s, _mm256_permute_ps(s, 0x4E));      // lanes 0–1: t_l = s_l + s_l+2
  return _mm256_add_ps(t, _mm256_permute_ps(t, 0xB1));                // lane 0: t_0 + t_1
}

template <int R, int S, typename W>
AVX2_FN void tile_avx2(const Call<W>& c, int64_t m0, int64_t n0) {
  __m256 acc[R][S];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < S; j++) acc[i][j] = _mm256_setzero_ps();
  const int64_t K = c.K, K8 = K / 8 * 8;
  const char* ahead = tile_ahead(c, m0, n0, S);
  for (int64_t k = 0; k < K8; k += 8) {
    fetch_ahead<S * 8 * sizeof(W)>(ahead, k);
    __m256 xv[R];
    for (int i = 0; i < R; i++) xv[i] = _mm256_loadu_ps(c.x + (m0 + i) * K + k);
    for (int j = 0; j < S; j++) {
      const __m256 wv = load8(c.w + (n0 + j) * K + k);
      for (int i = 0; i < R; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; i++)
    for (int j = 0; j < S; j++) {
      if (K8 == K) {
        store(c, m0 + i, n0 + j, _mm256_cvtss_f32(tree8(acc[i][j])));
        continue;
      }
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[i][j]);
      tail(c, m0 + i, n0 + j, K8, a);
      finish(c, m0 + i, n0 + j, a);
    }
}

template <int S, typename W>
AVX2_FN void rows_avx2(const Call<W>& c, int64_t n0) {
  int64_t m = 0;
  for (; m + MR <= c.M; m += MR) tile_avx2<MR, S>(c, m, n0);
  if (c.M - m == 2) tile_avx2<2, S>(c, m, n0);
  else if (c.M - m == 1) tile_avx2<1, S>(c, m, n0);
}

// rows n0 … n0 + nr − 1 of W (nr ≤ BLOCK) against every row of x
template <typename W>
AVX2_FN void block_avx2(const Call<W>& c, int64_t n0, int nr) {
  int j = 0;
  for (; j + NR <= nr; j += NR) rows_avx2<NR>(c, n0 + j);
  for (; j < nr; j++) rows_avx2<1>(c, n0 + j);  // the last rows of W
}

// W rows n, n + 1 at k … k + 7 side by side: lanes 0–7 and 8–15
AVX512_FN inline __m512 load8x2(const float* w, int64_t K) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w)), _mm256_loadu_ps(w + K), 1);
}
AVX512_FN inline __m512 load8x2(const uint16_t* w, int64_t K) {
  const __m256i two = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)w)),
                                              _mm_loadu_si128((const __m128i*)(w + K)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(two), 16));
}

// tree8 on both 8-lane halves: lanes 0 and 8
AVX512_FN inline __m512 tree8x2(__m512 a) {
  const __m512 s = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0xB1));  // 128-bit blocks 0↔1, 2↔3
  const __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
  return _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
}

// W rows n0 + 2j, n0 + 2j + 1 at k … k + 7 (pair j), read from W itself
template <typename W>
struct Pairs {
  const W* w;  // row n0
  int64_t K;
  AVX512_FN __m512 at(int j, int64_t k) const { return load8x2(w + 2 * j * K + k, K); }
};

// R rows of x × 2P rows of W over k = 0 … K8 − 1, from zero: accumulator (i, j) holds outputs (m0 + i, n0 + 2j) and
// (m0 + i, n0 + 2j + 1)
template <int R, int P, typename W>
AVX512_FN void fmas_avx512(const float* x, int64_t K, const Pairs<W>& src, int64_t K8, __m512 (&a)[R][P],
                           const char* ahead) {
  for (int i = 0; i < R; i++)
    for (int j = 0; j < P; j++) a[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    fetch_ahead<2 * P * 8 * sizeof(W)>(ahead, k);
    __m512 xv[R];
    for (int i = 0; i < R; i++) xv[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i * K + k));
    for (int j = 0; j < P; j++) {
      const __m512 wv = src.at(j, k);
      for (int i = 0; i < R; i++) a[i][j] = _mm512_fmadd_ps(xv[i], wv, a[i][j]);
    }
  }
}

// the outputs of accumulator a (pair j = n of rows n, n + 1; lanes 0 … K8 − 1 summed)
template <typename W>
AVX512_FN inline void finish2(const Call<W>& c, int64_t m, int64_t n, __m512 a, int64_t K8) {
  alignas(64) float v[16];
  if (K8 == c.K) {
    _mm512_store_ps(v, tree8x2(a));
    store(c, m, n, v[0]);
    store(c, m, n + 1, v[8]);
    return;
  }
  _mm512_store_ps(v, a);
  for (int h = 0; h < 2; h++) {
    tail(c, m, n + h, K8, v + 8 * h);
    finish(c, m, n + h, v + 8 * h);
  }
}

// outputs (m, n0 … n0 + 7) from the accumulators of pairs 0–3 when K has no tail: finish2's steps for 8 outputs in
// vector lanes (the tree, + bias, then rounded to bf16 as c10::BFloat16 rounds: to nearest even, NaN as 0x7FC0)
template <typename W>
AVX512_FN inline void finish8(const Call<W>& c, int64_t m, int64_t n0, const __m512* a) {
  const __m512i pick = _mm512_setr_epi32(0, 8, 16, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);  // lanes 0, 8 of two
  const __m512 u01 = _mm512_permutex2var_ps(tree8x2(a[0]), pick, tree8x2(a[1]));
  const __m512 u23 = _mm512_permutex2var_ps(tree8x2(a[2]), pick, tree8x2(a[3]));
  __m256 v = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm512_castps512_ps128(u01)), _mm512_castps512_ps128(u23), 1);
  if (c.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(c.bias + n0));
  if (!c.yb) return _mm256_storeu_ps(c.y + m * c.N + n0, v);
  _mm_storeu_si128((__m128i*)(c.yb + m * c.N + n0), bf16_c10_8(v));
}

// R rows of x × 2P rows of W read as they are (a call of few rows: the weights' read is the cost)
template <int R, int P, typename W>
AVX512_FN void tile_avx512(const Call<W>& c, int64_t m0, int64_t n0) {
  __m512 a[R][P];
  const int64_t K8 = c.K / 8 * 8;
  fmas_avx512<R, P>(c.x + m0 * c.K, c.K, Pairs<W>{c.w + n0 * c.K, c.K}, K8, a, tile_ahead(c, m0, n0, 2 * P));
  for (int i = 0; i < R; i++) {
    if constexpr (P == 4)
      if (K8 == c.K) {
        finish8(c, m0 + i, n0, a[i]);
        continue;
      }
    for (int j = 0; j < P; j++) finish2(c, m0 + i, n0 + 2 * j, a[i][j], K8);
  }
}

template <int P, typename W>
AVX512_FN void rows_avx512(const Call<W>& c, int64_t n0) {
  int64_t m = 0;
  for (; m + 4 <= c.M; m += 4) tile_avx512<4, P>(c, m, n0);
  if (c.M - m == 3) tile_avx512<3, P>(c, m, n0);
  else if (c.M - m == 2) tile_avx512<2, P>(c, m, n0);
  else if (c.M - m == 1) tile_avx512<1, P>(c, m, n0);
}

template <typename W>
AVX512_FN void block_avx512(const Call<W>& c, int64_t n0, int nr) {
  if (nr == BLOCK) return rows_avx512<BLOCK / 2>(c, n0);
  int j = 0;
  for (; j + 2 <= nr; j += 2) rows_avx512<1>(c, n0 + j);
  if (j < nr) rows_avx2<1>(c, n0 + j);  // an odd last row of W
}
#endif  // FR_X86

int detect() {
#if FR_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    return AVX512;
  if (avx2) return AVX2;
#endif
  return PORTABLE;
}

int best_path() {
  static int p = detect();
  return p;
}

std::string backend() {
  const int p = best_path();
  return p == AVX512 ? "AVX-512" : p == AVX2 ? "AVX2" : "portable C++";
}

template <typename W>
void run(const Call<W>& c, int64_t path) {
  // blocks of BLOCK rows of W over threads, ≥ ~64 K multiply-adds a task
  const int64_t blocks = (c.N + BLOCK - 1) / BLOCK;
  const int64_t grain = std::max<int64_t>(1, 65536 / (BLOCK * c.K * c.M));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; blk++) {
      const int64_t n0 = blk * BLOCK;
      const int nr = (int)std::min<int64_t>(BLOCK, c.N - n0);
#if FR_X86
      if (path == AVX512) {
        block_avx512(c, n0, nr);
        continue;
      }
      if (path == AVX2) {
        block_avx2(c, n0, nr);
        continue;
      }
#endif
      for (int64_t m0 = 0; m0 < c.M; m0 += MR) tile_portable(c, m0, (int)std::min<int64_t>(MR, c.M - m0), n0, nr);
    }
  });
}

// x [..., K] fp32 or bf16; w [N, K] fp32 or bf16, contiguous; bias [N] or none; path 0 = the best this CPU has
// -> [..., N] in x's dtype
torch::Tensor mm(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t path) {
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "float_rows: path ", path, " does not run on this CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "float_rows: x must be fp32 or bf16");
  const bool wb = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && (wb || w.scalar_type() == at::kFloat),
              "float_rows: w must be a contiguous [N, K] fp32 or bf16 tensor");
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
  float* yf = x.scalar_type() == at::kFloat ? y.data_ptr<float>() : nullptr;
  uint16_t* yb = yf ? nullptr : (uint16_t*)y.data_ptr<c10::BFloat16>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  if (wb) run(Call<uint16_t>{M, N, K, x2.data_ptr<float>(), (const uint16_t*)w.data_ptr<c10::BFloat16>(), bp, yf, yb}, path);
  else run(Call<float>{M, N, K, x2.data_ptr<float>(), w.data_ptr<float>(), bp, yf, yb}, path);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "y = x · Wᵀ (+ bias), W fp32 or bf16, each row of x computed alone");
  m.def("backend", &backend, "the SIMD path this CPU runs");
  m.def("best_path", &best_path, "its number (1 portable, 2 AVX2, 3 AVX-512)");
}
