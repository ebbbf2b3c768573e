// Weight-only int8 linear with each activation row quantized alone, on a CPU: y[M, N] = x[M, K] · Wᵀ (+ bias), W held
// as int8 with one scale per output row. The torch twin is int8_rows.py's twin().
//
// The arithmetic, for one output (m, n); it is the same sequence whatever M, the other rows, the thread count or the
// path, so a pass's row has the bits of a one-token step:
//
//   a_m    max_k |x_mk|                             x widened exactly to fp32
//   q_mk   clamp(rint(x_mk · (127 / a_m)), ±127)     0 where a_m = 0;  s_m = a_m / 127
//   dot    Σ_k q_mk · w_nk                          int32, exact (|dot| ≤ 127² · K < 2³¹ for K ≤ 131 072)
//   y_mn   float(dot) · (s_m · s_n) + bias_n         fp32, then x's dtype (bf16 rounded as torch's .to rounds)
//
// The integer sum is exact, so each path adds it in its own order: AVX-512 VNNI (vpdpbusd on q + 128, less
// 128 · Σ_k w_nk), AVX2 (vpmaddubsw on |q| and w carrying q's sign, then vpmaddwd; no pair exceeds 2 · 127²), portable
// loops. -ffp-contract=off: the epilogue's multiply and add stay two roundings.
//
// W is packed [N128 / 16, K / 4, 16, 4]: 16 output rows' 4 consecutive weights side by side (N128: N rounded up to
// 128, zero rows past N; K a multiple of 8), so one 64-byte load feeds 16 outputs and a broadcast of 4 activations serves them all; the rows
// of a call sweep each block while it is in cache.
//
// Int4 weights (w_nk in [−7, 7], a draft's: half the bytes) are packed [N128 / 16, K / 8, 16, 4] uint8, byte (k8, r, j)
// holding w + 8 of k = 8·k8 + j in its low nibble and of k = 8·k8 + 4 + j in its high one: the int8 layout's two
// k-steps in one 64-byte load. The dot is the same exact integer, summed as Σ_k (w_nk + 8) · q_mk − 8 · Σ_k q_mk on the
// SIMD paths (the nibble the unsigned operand, q the signed one: no pair exceeds 2 · 15 · 127, so the AVX2 path adds
// SUM16 = 8 k-steps' pairs in int16 before widening them: one vpmaddwd for eight vpmaddubsw).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "bf16_bits.h"  // bf16_c10
#define I8_X86 1
#else
#define I8_X86 0
#endif

namespace {

// How far ahead of the weights being multiplied they are fetched: Whisper base's 61 int8 layers in model order at 4
// rows (a step over four windows) took 1.78 ms with the hardware's prefetch alone on the AVX-512 path, 1.23 at 4 or
// 16 KB ahead (20 rows 2.92 -> 2.51); on the AVX2 path (forced on the same CPU) 2.15 -> 1.91 at 4 KB, 1.98 at 16
// (8 rows 3.82 -> 3.26, 20 rows 9.03 -> 7.76). One process, interleaved, AMD EPYC Zen 5, same outputs.
constexpr int64_t AHEAD_BYTES = 4096;

enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512VNNI = 3 };  // as qmatmul's

struct Call {
  int64_t M, N, K, NB;   // NB = N128 / 16 weight blocks
  const int8_t* w;       // [NB, K / 4, 16, 4], or int4: [NB, K / 8, 16, 4] nibbles
  const int32_t* wsum;   // [N128]: Σ_k w_nk
  const float* ws;       // [N]: s_n
  const float* bias;     // [N] fp32, or null
  const int8_t* xq;      // [M, K]: q (the portable and AVX2 paths'), or null
  const uint8_t* xu;     // [M, K]: q + 128 (the VNNI path's), or null
  const float* xs;       // [M]: s_m
  const int32_t* xsum;   // [M]: Σ_k q_mk (int4 weights' SIMD paths), or null
  float* y;              // [M, N] fp32, or null: then
  uint16_t* yb;          // [M, N] bf16
};

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }  // exact

// rint(v) for |v| < 2²²: adding 1.5 · 2²³ leaves no fraction bits, so the sum rounds v to the nearest integer, ties to
// even (what nearbyint does, without a call into libm on a baseline x86-64 build)
inline float rint_small(float v) { return (v + 12582912.f) - 12582912.f; }

// q_k from x_k (|x_k · inv| ≤ 127 up to a rounding), k0 … K − 1, into q, or as q_k + 128 into u where q is null
template <typename T>
void quantize_tail(const T* x, int64_t k0, int64_t K, float inv, int8_t* q, uint8_t* u) {
  for (int64_t k = k0; k < K; k++) {
    const int8_t v = (int8_t)std::min(127.f, std::max(-127.f, rint_small(widen(x[k]) * inv)));
    if (q) q[k] = v;
    else u[k] = (uint8_t)(v + 128);
  }
}

template <typename T>
void quantize_row(const T* x, int64_t K, int8_t* q, float* s) {
  float a = 0.f;
  for (int64_t k = 0; k < K; k++) a = std::max(a, std::fabs(widen(x[k])));
  *s = a / 127.f;
  quantize_tail(x, 0, K, a > 0.f ? 127.f / a : 0.f, q, nullptr);
}

// the 16 outputs of block nb for rows m0 … m0 + mt − 1 from their exact dots
void finish(const Call& c, int64_t nb, int64_t m0, int mt, const int32_t* dots /* [mt, 16] */) {
  for (int i = 0; i < mt; i++)
    for (int r = 0; r < 16; r++) {
      const int64_t n = nb * 16 + r, m = m0 + i;
      if (n >= c.N) break;
      float v = (float)dots[i * 16 + r] * (c.xs[m] * c.ws[n]);
      if (c.bias) v = v + c.bias[n];
      if (c.yb) c.yb[m * c.N + n] = c10::BFloat16(v).x;
      else c.y[m * c.N + n] = v;
    }
}

constexpr int MT = 8;  // activation rows per sweep of a block (the AVX2 path: 4, its registers)

// w_nk of block wb (its 16 rows' bytes) at k-step kk, row r, lane j
template <bool NIB>
inline int32_t weight_at(const int8_t* wb, int64_t kk, int r, int j) {
  if constexpr (NIB) return (int32_t)(((uint8_t)wb[((kk / 2) * 16 + r) * 4 + j] >> (4 * (kk % 2))) & 15) - 8;
  return wb[(kk * 16 + r) * 4 + j];
}

template <bool NIB>
void block_portable(const Call& c, int64_t nb, int64_t m0, int mt) {
  int32_t acc[MT * 16] = {0};
  const int8_t* wb = c.w + nb * c.K * (NIB ? 8 : 16);
  for (int64_t kk = 0; kk < c.K / 4; kk++)
    for (int r = 0; r < 16; r++)
      for (int j = 0; j < 4; j++) {
        const int32_t w = weight_at<NIB>(wb, kk, r, j);
        for (int i = 0; i < mt; i++) acc[i * 16 + r] += (int32_t)c.xq[(m0 + i) * c.K + kk * 4 + j] * w;
      }
  finish(c, nb, m0, mt, acc);
}

#if I8_X86
inline int32_t load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#define AVX2_FN __attribute__((target("avx2,fma")))

// int4: the nibbles (w + 8, 0 … 15) of k-step kk from the 32 bytes at p
AVX2_FN inline __m256i nibbles(const int8_t* p, int64_t kk) {
  const __m256i v = _mm256_loadu_si256((const __m256i*)p);
  return _mm256_and_si256(kk % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
}

// int4: the k-steps whose vpmaddubsw pairs are added in int16 before one vpmaddwd (8 · 2 · 15 · 127 = 30 480 < 2¹⁵)
constexpr int64_t SUM16 = 8;

template <int R, bool NIB>
AVX2_FN void block_avx2_r(const Call& c, int64_t nb, int64_t m0) {
  __m256i acc[R][2];
  for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  const int64_t step = c.K * (NIB ? 8 : 16);  // a block's bytes
  const int8_t *wb = c.w + nb * step, *end = c.w + c.NB * step;
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t steps = c.K / 4;
  for (int64_t k0 = 0; k0 < steps; k0 += NIB ? SUM16 : steps) {
    __m256i sum[R][2];  // int4: the int16 pair sums of k-steps k0 … k0 + SUM16 − 1
    for (int i = 0; i < R; i++) sum[i][0] = sum[i][1] = _mm256_setzero_si256();
    for (int64_t kk = k0; kk < std::min(steps, k0 + (NIB ? SUM16 : steps)); kk++) {
      const int64_t at = NIB ? kk / 2 * 64 : kk * 64;  // the k-step's 64 bytes (int4: shared by kk and kk + 1)
      if (m0 == 0 && (!NIB || kk % 2 == 0) && wb + at + AHEAD_BYTES < end)  // once a call
        _mm_prefetch((const char*)(wb + at + AHEAD_BYTES), _MM_HINT_T0);
      // the step's weights for 16 outputs, two halves: int4 the nibbles (w + 8), int8 w itself
      const __m256i w0 = NIB ? nibbles(wb + at, kk) : _mm256_loadu_si256((const __m256i*)(wb + at));
      const __m256i w1 = NIB ? nibbles(wb + at + 32, kk) : _mm256_loadu_si256((const __m256i*)(wb + at + 32));
      for (int i = 0; i < R; i++) {
        const __m256i a = _mm256_set1_epi32(load4(c.xq + (m0 + i) * c.K + kk * 4));
        if constexpr (NIB) {  // (w + 8) unsigned · q signed
          sum[i][0] = _mm256_add_epi16(sum[i][0], _mm256_maddubs_epi16(w0, a));
          sum[i][1] = _mm256_add_epi16(sum[i][1], _mm256_maddubs_epi16(w1, a));
        } else {  // |q| unsigned · w with q's sign
          const __m256i au = _mm256_abs_epi8(a);
          acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(au, _mm256_sign_epi8(w0, a)), ones));
          acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(au, _mm256_sign_epi8(w1, a)), ones));
        }
      }
    }
    if constexpr (NIB)
      for (int i = 0; i < R; i++) {
        acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(sum[i][0], ones));
        acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(sum[i][1], ones));
      }
  }
  for (int i = 0; i < R; i++)
    if constexpr (NIB) {  // less 8 · Σ_k q_mk
      const __m256i less = _mm256_set1_epi32(8 * c.xsum[m0 + i]);
      acc[i][0] = _mm256_sub_epi32(acc[i][0], less);
      acc[i][1] = _mm256_sub_epi32(acc[i][1], less);
    }
  if (c.yb || nb * 16 + 16 > c.N) {  // bf16 outputs, or a block past N
    alignas(64) int32_t dots[R * 16];
    for (int i = 0; i < R; i++) {
      _mm256_store_si256((__m256i*)(dots + i * 16), acc[i][0]);
      _mm256_store_si256((__m256i*)(dots + i * 16 + 8), acc[i][1]);
    }
    return finish(c, nb, m0, R, dots);
  }
  for (int i = 0; i < R; i++)  // finish()'s operations on 8 lanes at a time (the same roundings)
    for (int h = 0; h < 2; h++) {
      const int64_t m = m0 + i, n = nb * 16 + 8 * h;
      const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(c.xs[m]), _mm256_loadu_ps(c.ws + n));
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), scale);
      if (c.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(c.bias + n));
      _mm256_storeu_ps(c.y + m * c.N + n, v);
    }
}

template <bool NIB>
AVX2_FN void block_avx2(const Call& c, int64_t nb, int64_t m0, int mt) {
  for (; mt >= 4; mt -= 4, m0 += 4) block_avx2_r<4, NIB>(c, nb, m0);
  switch (mt) {
    case 3: return block_avx2_r<3, NIB>(c, nb, m0);
    case 2: return block_avx2_r<2, NIB>(c, nb, m0);
    case 1: return block_avx2_r<1, NIB>(c, nb, m0);
  }
}

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))

VNNI_FN inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
VNNI_FN inline __m512 load16(const c10::BFloat16* p) {  // exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// quantize_row's values into q, or + 128 into u where q is null, 16 at a time (max is exact in any order; roundscale
// rounds to nearest even as rint_small)
template <typename T>
VNNI_FN void quantize_row_avx512(const T* x, int64_t K, int8_t* q, uint8_t* u, float* s) {
  const int64_t K16 = K / 16 * 16;
  __m512 m = _mm512_setzero_ps();
  for (int64_t k = 0; k < K16; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(load16(x + k)));
  float a = _mm512_reduce_max_ps(m);
  for (int64_t k = K16; k < K; k++) a = std::max(a, std::fabs(widen(x[k])));
  *s = a / 127.f;
  const float inv = a > 0.f ? 127.f / a : 0.f;
  const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  for (int64_t k = 0; k < K16; k += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(load16(x + k), vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i b = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, v))));
    if (q) _mm_storeu_si128((__m128i*)(q + k), b);
    else _mm_storeu_si128((__m128i*)(u + k), _mm_xor_si128(b, _mm_set1_epi8((char)0x80)));  // q + 128
  }
  quantize_tail(x, K16, K, inv, q, u);
}

// finish()'s operations on 16 lanes at once (the same roundings)
VNNI_FN inline void finish16(const Call& c, int64_t n0, int64_t m, __m512i dot) {
  const int64_t left = c.N - n0;
  if (left <= 0) return;
  const __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(c.xs[m]), _mm512_maskz_loadu_ps(k, c.ws + n0));
  __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), scale);
  if (c.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, c.bias + n0));
  if (c.yb) _mm256_mask_storeu_epi16(c.yb + m * c.N + n0, k, bf16_c10(v));
  else _mm512_mask_storeu_ps(c.y + m * c.N + n0, k, v);
}

// R rows × NBW blocks from block nb on; two chains per output (even and odd steps of k: integers, any order). int8:
// dpbusd(q + 128, w), less 128 · Σ_k w_nk; int4 (NIB): dpbusd(w + 8, q), less 8 · Σ_k q_mk
template <int R, int NBW, bool NIB>
VNNI_FN void block_avx512_r(const Call& c, int64_t nb, int64_t m0) {
  __m512i acc[2][NBW][R];
  for (int h = 0; h < 2; h++)
    for (int b = 0; b < NBW; b++)
      for (int i = 0; i < R; i++) acc[h][b][i] = _mm512_setzero_si512();
  const int64_t K4 = c.K / 4, step = c.K * (NIB ? 8 : 16);  // a block's bytes
  const int8_t *wb = c.w + nb * step, *end = c.w + c.NB * step;
  for (int64_t kk = 0; kk < K4; kk += 2)
    for (int h = 0; h < 2; h++) {
      __m512i a[R];
      for (int i = 0; i < R; i++) {
        const int64_t at = (m0 + i) * c.K + (kk + h) * 4;
        a[i] = _mm512_set1_epi32(NIB ? load4(c.xq + at) : load4(c.xu + at));
      }
      const int64_t at = NIB ? kk * 32 : (kk + h) * 64;  // the k-step's 64 bytes (int4: both steps' nibbles)
      for (int b = 0; b < NBW; b++) {
        const int64_t ahead = at + AHEAD_BYTES;  // past the block: the same block of the next NBW
        const int8_t* p = wb + (ahead < step ? b * step + ahead : (NBW + b) * step + ahead - step);
        if ((!NIB || h == 0) && p < end) _mm_prefetch((const char*)p, _MM_HINT_T0);
        __m512i w = _mm512_loadu_si512(wb + b * step + at);
        if constexpr (NIB) {
          w = _mm512_and_si512(h ? _mm512_srli_epi16(w, 4) : w, _mm512_set1_epi8(15));
          for (int i = 0; i < R; i++) acc[h][b][i] = _mm512_dpbusd_epi32(acc[h][b][i], w, a[i]);
        } else {
          for (int i = 0; i < R; i++) acc[h][b][i] = _mm512_dpbusd_epi32(acc[h][b][i], a[i], w);
        }
      }
    }
  for (int b = 0; b < NBW; b++) {
    const __m512i less = _mm512_slli_epi32(_mm512_loadu_si512(c.wsum + (nb + b) * 16), 7);  // 128 · Σ_k w_nk
    for (int i = 0; i < R; i++) {
      const __m512i sub = NIB ? _mm512_set1_epi32(8 * c.xsum[m0 + i]) : less;
      finish16(c, (nb + b) * 16, m0 + i, _mm512_sub_epi32(_mm512_add_epi32(acc[0][b][i], acc[1][b][i]), sub));
    }
  }
}

// blocks nb … nb + NBW − 1 for rows m0 … m0 + mt − 1 (mm chooses NBW from the rows of a sweep: 1 → 8, 2 → 4,
// 3–4 → 2, more → 1)
template <int NBW, bool NIB>
VNNI_FN void blocks_avx512(const Call& c, int64_t nb, int64_t m0, int mt) {
  switch (mt) {
    case 8: if constexpr (NBW == 1) return block_avx512_r<8, 1, NIB>(c, nb, m0); break;
    case 7: if constexpr (NBW == 1) return block_avx512_r<7, 1, NIB>(c, nb, m0); break;
    case 6: if constexpr (NBW == 1) return block_avx512_r<6, 1, NIB>(c, nb, m0); break;
    case 5: if constexpr (NBW == 1) return block_avx512_r<5, 1, NIB>(c, nb, m0); break;
    case 4: if constexpr (NBW <= 2) return block_avx512_r<4, NBW, NIB>(c, nb, m0); break;
    case 3: if constexpr (NBW <= 2) return block_avx512_r<3, NBW, NIB>(c, nb, m0); break;
    case 2: if constexpr (NBW <= 4) return block_avx512_r<2, NBW, NIB>(c, nb, m0); break;
    case 1: return block_avx512_r<1, NBW, NIB>(c, nb, m0);
  }
  for (int b = 0; b < NBW; b++) blocks_avx512<1, NIB>(c, nb + b, m0, mt);  // more rows than NBW blocks take together
}

#endif  // I8_X86

// the rows m0 … m0 + mt − 1 of NBW blocks from g · nbw on, on `path`
template <bool NIB>
void sweep(const Call& c, int path, int nbw, int64_t g, int64_t m0, int mt) {
#if I8_X86
  if (path == AVX512VNNI) {
    switch (nbw) {
      case 8: return blocks_avx512<8, NIB>(c, g * 8, m0, mt);
      case 4: return blocks_avx512<4, NIB>(c, g * 4, m0, mt);
      case 2: return blocks_avx512<2, NIB>(c, g * 2, m0, mt);
      default: return blocks_avx512<1, NIB>(c, g, m0, mt);
    }
  }
  if (path == AVX2) return block_avx2<NIB>(c, g, m0, mt);
#endif
  block_portable<NIB>(c, g, m0, mt);
}

int detect() {
#if I8_X86
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) return AVX512VNNI;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
#endif
  return PORTABLE;
}

int best_path() {
  static int p = detect();
  return p;
}

std::string backend() {
  switch (best_path()) {
    case AVX512VNNI: return "AVX-512 VNNI";
    case AVX2: return "AVX2";
  }
  return "portable C++";
}

// every row of x [M, K]: q into xq, or q + 128 into xu where xq is null; s into xs; Σ_k q into xsum where not null
template <typename T>
void quantize_rows(const T* x, int64_t M, int64_t K, int path, int8_t* xq, uint8_t* xu, float* xs, int32_t* xsum) {
  at::parallel_for(0, M, 64, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
#if I8_X86
      if (path == AVX512VNNI) quantize_row_avx512<T>(x + m * K, K, xq ? xq + m * K : nullptr, xu ? xu + m * K : nullptr, xs + m);
      else
#endif
        quantize_row<T>(x + m * K, K, xq + m * K, xs + m);
      if (xsum) {
        int32_t sum = 0;
        for (int64_t k = 0; k < K; k++) sum += xq[m * K + k];
        xsum[m] = sum;
      }
    }
  });
}

// x [..., K] fp32 or bf16; w [NB, K / 4, 16, 4] int8 or [NB, K / 8, 16, 4] uint8 int4 nibbles (NB a multiple of 8);
// wsum [NB · 16] int32; ws [N] fp32; bias [N] fp32 or none; path 0 = the best this CPU has -> [..., N] in x's dtype
torch::Tensor mm(torch::Tensor x, torch::Tensor w, torch::Tensor wsum, torch::Tensor ws,
                 c10::optional<torch::Tensor> bias, int64_t path) {
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "int8_rows: path ", path, " does not run on this CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "int8_rows: x must be fp32 or bf16");
  const bool nib = w.scalar_type() == at::kByte;  // int4
  TORCH_CHECK(w.dim() == 4 && w.size(2) == 16 && w.size(3) == 4 && (nib || w.scalar_type() == at::kChar) &&
              w.is_contiguous(), "int8_rows: w must be packed [N128 / 16, K / 4, 16, 4] int8 or [N128 / 16, K / 8, 16, 4] uint8");
  const int64_t K = x.size(-1), NB = w.size(0), N = ws.size(0);
  TORCH_CHECK(w.size(1) * (nib ? 8 : 4) == K, "int8_rows: x has ", K, " columns, the weights ", w.size(1) * (nib ? 8 : 4));
  TORCH_CHECK(NB % 8 == 0 && K % 8 == 0 && N <= NB * 16 && N > (NB - 8) * 16 && wsum.numel() == NB * 16,
              "int8_rows: the blocks must be pack()'s");
  TORCH_CHECK(ws.scalar_type() == at::kFloat && wsum.scalar_type() == at::kInt, "int8_rows: ws fp32, wsum int32");
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  auto y = torch::empty(shape, x.options());
  torch::Tensor b;
  if (bias && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == N, "int8_rows: bias must have N elements");
  }
  if (M == 0) return y;
  const bool vnni = path == AVX512VNNI, unsigned_q = vnni && !nib;  // VNNI on int8 reads q + 128, the rest q
  std::vector<int8_t> xq(unsigned_q ? 0 : M * K);
  std::vector<uint8_t> xu(unsigned_q ? M * K : 0);
  std::vector<float> xs(M);
  std::vector<int32_t> xsum(nib ? M : 0);
  int8_t* xqp = unsigned_q ? nullptr : xq.data();
  uint8_t* xup = unsigned_q ? xu.data() : nullptr;
  int32_t* xsump = nib ? xsum.data() : nullptr;
  Call c{M, N, K, NB, (const int8_t*)w.data_ptr(), wsum.data_ptr<int32_t>(), ws.data_ptr<float>(),
         b.defined() ? b.data_ptr<float>() : nullptr, xqp, xup, xs.data(), xsump, nullptr, nullptr};
  if (x.scalar_type() == at::kFloat) {
    quantize_rows<float>(x2.data_ptr<float>(), M, K, (int)path, xqp, xup, xs.data(), xsump);
    c.y = y.data_ptr<float>();
  } else {
    quantize_rows<c10::BFloat16>(x2.data_ptr<c10::BFloat16>(), M, K, (int)path, xqp, xup, xs.data(), xsump);
    c.yb = (uint16_t*)y.data_ptr<c10::BFloat16>();
  }
  // rows in balanced sweeps of ≤ MT (11 rows: 6 + 5); on AVX-512, NBW blocks at a time where a sweep has few rows
  // (more independent chains); groups of NBW blocks over threads, ≥ ~64 K multiply-adds a task
  const int64_t sweeps = (M + MT - 1) / MT, rows = (M + sweeps - 1) / sweeps;
  const int nbw = vnni ? (rows == 1 ? 8 : rows == 2 ? 4 : rows <= 4 ? 2 : 1) : 1;
  const int64_t grain = std::max<int64_t>(1, 65536 / (16 * K * nbw * std::min<int64_t>(M, MT)));
  at::parallel_for(0, NB / nbw, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++)
      for (int64_t m0 = 0; m0 < M; m0 += rows) {
        const int mt = (int)std::min<int64_t>(rows, M - m0);
        if (nib) sweep<true>(c, (int)path, nbw, g, m0, mt);
        else sweep<false>(c, (int)path, nbw, g, m0, mt);
      }
  });
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("entry", [] { return pybind11::capsule((void*)&mm, "specdec.int8_rows.mm"); },
        "mm's address, for another module's C++ (lean_layers)");
  m.def("mm", &mm, "y = x · Wᵀ (+ bias), W int8 per output row, each row of x quantized alone");
  m.def("backend", &backend, "the SIMD path this CPU runs");
  m.def("best_path", &best_path, "its number (1 portable, 2 AVX2, 3 AVX-512 VNNI)");
}
