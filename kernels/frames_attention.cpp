// out = softmax(q · kᵀ · scale) · v for many queries at once on a CPU, heads 64 or 128 wide: a Whisper encoder's
// self-attention over its 1 500 frames (every key, no mask), or a prompt's (causal: query t of T sees keys 0 .. S − T
// + t; grouped heads: q's head h reads k, v's head h / (H / Hkv)). The plain reference is frames_attention.py's
// reference().
//
// Per (batch, head): K is widened to fp32 and transposed once by 16 keys ([S/16, D, 16]: 16 keys' d-th values in one
// vector, a block of keys 4 KB in a row), V widened
// ([S, D]); queries go by tiles of 4 rows, each row's scores over its keys kept whole in L1 (a two-pass softmax: the
// row's max, then exp and their sum, no rescaling), then P · V with the tile's 4 × 64 outputs in 16 zmm registers
// (D = 128: two halves, one after the other).
// Every sum is fp32 (fused multiply-adds), exp a degree-7 polynomial after range reduction (within a few ulp), the
// output rounded once to q's dtype. torch's CPU flash attention took 27 ms a layer for Whisper base's 8 heads × 1 500
// frames in bf16 (~170 GFLOP/s, 2 threads of an AMD EPYC Zen 5): the encoder's largest cost.
//
// Paths: AVX-512, AVX2 with FMA (the same steps 8 lanes at a time: the same scores and products, but a softmax's sum
// over 8 lanes, not 16, and exp 0 below −87.3), and portable C++ (the same steps in scalar code: tests on any CPU;
// not the same bits, as exp and the sums' order differ). Callers route to the SIMD ones.
// AVX-512 BF16, for bf16 q, k and v only (others take the AVX-512 path): the products two at a time by vdpbf16ps (q
// and k as they are, exact products, fp32 sums; the scale applied to the fp32 scores), P rounded to bf16 for P · V
// (the weights' sum l from fp32 P): twice the products an instruction of fp32 fma. K is packed [S/16, D/2, 16, 2] (16
// keys' values d = 2p, 2p + 1 side by side), V [S/2, D/16, 16, 2] (two keys' values of 16 d's side by side).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FA_X86 1
#else
#define FA_X86 0
#endif

namespace {

enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512 = 3, AVX512_BF16 = 4 };
constexpr int R = 4;  // query rows a tile

struct Head {
  const float* kt;  // [⌈S/16⌉, D, 16] fp32: each 16 keys' d-th values together (zeros past S)
  const float* v;   // [S, D] fp32
  int64_t S;        // the keys a row may see (the tile's last row's), and the stride of the scores' rows
  int64_t end[R];   // row i sees keys 0 .. end[i] (≤ S)
};

// rows q[0 .. r) (fp32, scaled, [r, D]) → o[r, D] (fp32, normalized)
template <int64_t D>
void rows_portable(const Head& h, const float* q, int r, float* s, float* o) {
  for (int i = 0; i < r; i++) {
    float* si = s + i * h.S;
    float mx = -INFINITY;
    for (int64_t j = 0; j < h.end[i]; j++) {
      float a = 0;
      for (int64_t d = 0; d < D; d++) a = std::fma(q[i * D + d], h.kt[(j / 16 * D + d) * 16 + j % 16], a);
      si[j] = a;
      mx = std::max(mx, a);
    }
    float l = 0;
    for (int64_t j = 0; j < h.end[i]; j++) l += (si[j] = std::exp(si[j] - mx));
    for (int64_t d = 0; d < D; d++) {
      float a = 0;
      for (int64_t j = 0; j < h.end[i]; j++) a = std::fma(si[j], h.v[j * D + d], a);
      o[i * D + d] = a / l;
    }
  }
}

#if FA_X86
#define AVX512_FN __attribute__((target("avx512f,avx512dq,avx2,fma")))

// e^x for x ≤ 0 (a score less its row's max): x = n·ln2 + t, |t| ≤ ln2/2, e^t by its Taylor polynomial to t⁷
AVX512_FN inline __m512 exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's high part: n·it is exact
  t = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), t);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// the scores of RR rows against the NB blocks of 16 keys from j (NB·RR chains of fused multiply-adds: two blocks keep
// both FMA pipes busy through their latency), stored, and the running max over the keys each row sees
template <int64_t D, int RR, int NB>
AVX512_FN inline void scores(const Head& h, const float* q, float* s, int64_t j, __m512 (&mx)[RR]) {
  const int64_t S = h.S;
  __m512 a[RR][NB];
  for (int i = 0; i < RR; i++)
    for (int b = 0; b < NB; b++) a[i][b] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d++)
    for (int b = 0; b < NB; b++) {
      const __m512 k = _mm512_loadu_ps(h.kt + ((j / 16 + b) * D + d) * 16);
      for (int i = 0; i < RR; i++) a[i][b] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * D + d]), k, a[i][b]);
    }
  for (int b = 0; b < NB; b++) {
    const int64_t jb = j + 16 * b;
    for (int i = 0; i < RR; i++) {
      const int64_t e = h.end[i];
      const __mmask16 m = jb + 16 <= e ? (__mmask16)0xFFFF : jb >= e ? (__mmask16)0 : (__mmask16)((1u << (e - jb)) - 1);
      _mm512_mask_storeu_ps(s + i * S + jb, m, a[i][b]);
      mx[i] = _mm512_mask_max_ps(mx[i], m, mx[i], a[i][b]);
    }
  }
}

// a row's scores si[0 .. e) (their max in mx's lanes) → exp(s_j − max) in place; → 1 / their sum
AVX512_FN inline float softmax_row(float* si, int64_t e, __m512 mx) {
  const int64_t S16 = e / 16 * 16;
  const __mmask16 tail = (__mmask16)((1u << (e - S16)) - 1);
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 l = _mm512_setzero_ps();
  for (int64_t j = 0; j < S16; j += 16) {
    const __m512 p = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(si + j), m));
    _mm512_storeu_ps(si + j, p);
    l = _mm512_add_ps(l, p);
  }
  if (tail) {
    const __m512 p = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, si + S16), m));
    _mm512_mask_storeu_ps(si + S16, tail, p);
    l = _mm512_mask_add_ps(l, tail, l, p);
  }
  return 1.0f / _mm512_reduce_add_ps(l);
}

template <int64_t D, int RR>
AVX512_FN void rows_avx512(const Head& h, const float* q, float* s, float* o) {
  const int64_t S = h.S;
  __m512 mx[RR];
  for (int i = 0; i < RR; i++) mx[i] = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 32 <= S; j += 32) scores<D, RR, 2>(h, q, s, j, mx);
  for (; j < S; j += 16) scores<D, RR, 1>(h, q, s, j, mx);
  float inv[RR];
  for (int i = 0; i < RR; i++) {
    inv[i] = softmax_row(s + i * S, h.end[i], mx[i]);
    std::fill(s + i * S + h.end[i], s + (i + 1) * S, 0.f);  // the keys after the row's own (causal): weight 0 in P · V
  }
  // P · V: 64 of each key's values in 4 vectors, against each row's weight for it
  for (int64_t half = 0; half < D; half += 64) {
    __m512 acc[RR][4];
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < S; j++) {
      __m512 vj[4];
      for (int c = 0; c < 4; c++) vj[c] = _mm512_loadu_ps(h.v + j * D + half + 16 * c);
      for (int i = 0; i < RR; i++) {
        const __m512 p = _mm512_set1_ps(s[i * S + j]);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_fmadd_ps(p, vj[c], acc[i][c]);
      }
    }
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 4; c++)
        _mm512_storeu_ps(o + i * D + half + 16 * c, _mm512_mul_ps(acc[i][c], _mm512_set1_ps(inv[i])));
  }
}
// AVX2 with FMA: the same steps 8 lanes at a time (a block of 16 keys two ymm), blends and masked moves where AVX-512
// has mask registers, and 2ⁿ built in the exponent's bits (0 below −87.3, where AVX-512's scalef gives a subnormal)
#define AVX2_FN __attribute__((target("avx2,fma")))

AVX2_FN inline __m256 exp_neg8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 t = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  t = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), t);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GT_OQ);
  return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// lanes l with j + l < e, as a ymm of all-ones / zeros
AVX2_FN inline __m256i below8(int64_t j, int64_t e) {
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(8, e - j));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2_FN inline float hsum8(__m256 v) {
  __m128 c = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  c = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

AVX2_FN inline float hmax8(__m256 v) {
  __m128 c = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  c = _mm_max_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

template <int64_t D, int RR>
AVX2_FN void rows_avx2(const Head& h, const float* q, float* s, float* o) {
  const int64_t S = h.S;
  __m256 mx[RR];
  for (int i = 0; i < RR; i++) mx[i] = _mm256_set1_ps(-INFINITY);
  // scores: a block of 16 keys against RR rows, 2·RR chains of fused multiply-adds
  for (int64_t j = 0; j < S; j += 16) {
    __m256 a[RR][2];
    for (int i = 0; i < RR; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    const float* kb = h.kt + j / 16 * D * 16;
    for (int64_t d = 0; d < D; d++) {
      const __m256 k0 = _mm256_loadu_ps(kb + d * 16), k1 = _mm256_loadu_ps(kb + d * 16 + 8);
      for (int i = 0; i < RR; i++) {
        const __m256 qd = _mm256_broadcast_ss(q + i * D + d);
        a[i][0] = _mm256_fmadd_ps(qd, k0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(qd, k1, a[i][1]);
      }
    }
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 2; c++) {
        const int64_t jc = j + 8 * c, e = h.end[i];
        float* dst = s + i * S + jc;
        if (jc + 8 <= e) {
          _mm256_storeu_ps(dst, a[i][c]);
          mx[i] = _mm256_max_ps(mx[i], a[i][c]);
        } else if (jc < e) {
          const __m256i m = below8(jc, e);
          _mm256_maskstore_ps(dst, m, a[i][c]);
          mx[i] = _mm256_max_ps(mx[i], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), a[i][c], _mm256_castsi256_ps(m)));
        }
      }
  }
  float inv[RR];
  for (int i = 0; i < RR; i++) {
    const int64_t e = h.end[i], S8 = e / 8 * 8;
    const __m256 m = _mm256_set1_ps(hmax8(mx[i]));
    __m256 l = _mm256_setzero_ps();
    float* si = s + i * S;
    for (int64_t j = 0; j < S8; j += 8) {
      const __m256 p = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(si + j), m));
      _mm256_storeu_ps(si + j, p);
      l = _mm256_add_ps(l, p);
    }
    if (S8 < e) {
      const __m256i tail = below8(S8, e);
      const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(tail), exp_neg8(_mm256_sub_ps(_mm256_maskload_ps(si + S8, tail), m)));
      _mm256_maskstore_ps(si + S8, tail, p);
      l = _mm256_add_ps(l, p);
    }
    inv[i] = 1.0f / hsum8(l);
    std::fill(si + e, si + S, 0.f);  // the keys after the row's own (causal): weight 0 in P · V
  }
  // P · V: 16 of each key's values in 2 vectors, against each row's weight for it
  for (int64_t c0 = 0; c0 < D; c0 += 16) {
    __m256 acc[RR][2];
    for (int i = 0; i < RR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; j++) {
      const __m256 v0 = _mm256_loadu_ps(h.v + j * D + c0), v1 = _mm256_loadu_ps(h.v + j * D + c0 + 8);
      for (int i = 0; i < RR; i++) {
        const __m256 p = _mm256_broadcast_ss(s + i * S + j);
        acc[i][0] = _mm256_fmadd_ps(p, v0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(p, v1, acc[i][1]);
      }
    }
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 2; c++)
        _mm256_storeu_ps(o + i * D + c0 + 8 * c, _mm256_mul_ps(acc[i][c], _mm256_set1_ps(inv[i])));
  }
}

#define BF16_FN __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma")))

struct HeadBF {
  const uint16_t* kt;  // [⌈S/16⌉, D/2, 16, 2] bf16 (zeros past S)
  const uint16_t* v;   // [⌈S/2⌉, D/16, 16, 2] bf16 (zeros past S)
  int64_t S;           // the keys a row may see (the tile's last row's)
  int64_t end[R];      // row i sees keys 0 .. end[i] (≤ S)
};

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// the scores of RR rows (q: D/2 pairs of bf16 a row) against the NB blocks of 16 keys from j, times scale, stored (rows
// of stride SS), and the running max over the keys each row sees
template <int64_t D, int RR, int NB>
BF16_FN inline void scores_bf16(const HeadBF& h, const uint32_t* q, float scale, float* s, int64_t SS, int64_t j,
                                __m512 (&mx)[RR]) {
  __m512 a[RR][NB];
  for (int i = 0; i < RR; i++)
    for (int b = 0; b < NB; b++) a[i][b] = _mm512_setzero_ps();
  for (int64_t p = 0; p < D / 2; p++)
    for (int b = 0; b < NB; b++) {
      const __m512i k = _mm512_loadu_si512(h.kt + ((j / 16 + b) * (D / 2) + p) * 32);
      for (int i = 0; i < RR; i++)
        a[i][b] = _mm512_dpbf16_ps(a[i][b], as_bh(_mm512_set1_epi32((int)q[i * (D / 2) + p])), as_bh(k));
    }
  for (int b = 0; b < NB; b++) {
    const int64_t jb = j + 16 * b;
    for (int i = 0; i < RR; i++) {
      const int64_t e = h.end[i];
      const __mmask16 m = jb + 16 <= e ? (__mmask16)0xFFFF : jb >= e ? (__mmask16)0 : (__mmask16)((1u << (e - jb)) - 1);
      const __m512 x = _mm512_mul_ps(a[i][b], _mm512_set1_ps(scale));
      _mm512_mask_storeu_ps(s + i * SS + jb, m, x);
      mx[i] = _mm512_mask_max_ps(mx[i], m, mx[i], x);
    }
  }
}

// rows q[0 .. RR) (bf16 pairs, unscaled) → o[RR, D] (fp32, normalized); s: RR rows of SS floats, pb: RR rows of SS
// bf16 (SS: h.S rounded up to 32)
template <int64_t D, int RR>
BF16_FN void rows_bf16(const HeadBF& h, const uint32_t* q, float scale, float* s, uint16_t* pb, float* o) {
  const int64_t S = h.S, SS = (S + 31) / 32 * 32;
  __m512 mx[RR];
  for (int i = 0; i < RR; i++) mx[i] = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  // four blocks: 16 chains through vdpbf16ps's latency (a Whisper base layer, three windows: 7.2 ms against 7.9 with two)
  for (; j + 64 <= S; j += 64) scores_bf16<D, RR, 4>(h, q, scale, s, SS, j, mx);
  for (; j + 32 <= S; j += 32) scores_bf16<D, RR, 2>(h, q, scale, s, SS, j, mx);
  for (; j < S; j += 16) scores_bf16<D, RR, 1>(h, q, scale, s, SS, j, mx);
  float inv[RR];
  for (int i = 0; i < RR; i++) {  // the AVX-512 path's softmax, then P in bf16
    float* si = s + i * SS;
    inv[i] = softmax_row(si, h.end[i], mx[i]);
    std::fill(si + h.end[i], si + SS, 0.f);  // the keys after the row's own (causal) and the padding: weight 0
    for (int64_t j = 0; j < SS; j += 32)
      _mm512_storeu_si512(pb + i * SS + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(si + j + 16), _mm512_loadu_ps(si + j)));
  }
  // P · V: two keys at a time, 64 of their values in 4 vectors, against each row's two weights
  for (int64_t half = 0; half < D; half += 64) {
    __m512 acc[RR][4];
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
    for (int64_t jp = 0; jp < (S + 1) / 2; jp++) {
      __m512i vj[4];
      for (int c = 0; c < 4; c++) vj[c] = _mm512_loadu_si512(h.v + (jp * (D / 16) + half / 16 + c) * 32);
      for (int i = 0; i < RR; i++) {
        const __m512i p = _mm512_set1_epi32(((const int32_t*)(pb + i * SS))[jp]);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], as_bh(p), as_bh(vj[c]));
      }
    }
    for (int i = 0; i < RR; i++)
      for (int c = 0; c < 4; c++)
        _mm512_storeu_ps(o + i * D + half + 16 * c, _mm512_mul_ps(acc[i][c], _mm512_set1_ps(inv[i])));
  }
}
#endif  // FA_X86

int detect() {
#if FA_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma"))
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512bf16") ? AVX512_BF16 : AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
#endif
  return PORTABLE;
}

int best_path() {
  static int p = detect();
  return p;
}

// f(std::integral_constant<int, RR>{}) for a tile of r = RR rows (1 .. R)
template <typename F>
void with_rows(int r, F&& f) {
  switch (r) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

// every tile of R query rows of every (batch, head), over threads: f(u, r, kv, end, out_row) with u = (b·H + h)·tiles
// + tile (its rows' offset in q: u's (b, h) row block, m0 = tile·R), r ≤ R rows, kv = b·Hkv + h / (H / Hkv), end[i]
// the keys row i sees (end[r − 1] the tile's), out_row(i) the row's place in out [B, T, H, D]
template <typename F>
void for_tiles(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, bool causal, int64_t D, F&& f) {
  const int64_t group = H / Hkv, tiles = (T + R - 1) / R;
  at::parallel_for(0, B * H * tiles, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; u++) {
      const int64_t bh = u / tiles, m0 = (u % tiles) * R, b = bh / H, hh = bh % H;
      const int r = (int)std::min<int64_t>(R, T - m0);
      int64_t end[R];
      for (int i = 0; i < R; i++) end[i] = causal ? std::min(S - T + m0 + r, S - T + m0 + i + 1) : S;
      f(bh * T + m0, r, b * Hkv + hh / group, end, [&](int i) { return ((b * T + m0 + i) * H + hh) * D; });
    }
  });
}

template <int64_t D>
void attend_d(const torch::Tensor& qf, const torch::Tensor& kt, const torch::Tensor& vf, torch::Tensor& out, bool causal,
              int64_t path) {
  const int64_t B = qf.size(0), H = qf.size(1), T = qf.size(2), Hkv = vf.size(1), S = vf.size(2);
  const int64_t S16 = (S + 15) / 16 * 16;
  const float *qp = qf.data_ptr<float>(), *kp = kt.data_ptr<float>(), *vp = vf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_tiles(B, H, Hkv, T, S, causal, D, [&](int64_t row, int r, int64_t kv, const int64_t* end, auto out_row) {
    thread_local std::vector<float> s, o;
    s.resize(R * S), o.resize(R * D);
    Head h{kp + kv * D * S16, vp + kv * S * D, end[r - 1], {}};
    std::copy(end, end + R, h.end);
    const float* qr = qp + row * D;
#if FA_X86
    if (path == AVX512) with_rows(r, [&](auto rr) { rows_avx512<D, decltype(rr)::value>(h, qr, s.data(), o.data()); });
    else if (path == AVX2) with_rows(r, [&](auto rr) { rows_avx2<D, decltype(rr)::value>(h, qr, s.data(), o.data()); });
    else
#endif
      rows_portable<D>(h, qr, r, s.data(), o.data());
    for (int i = 0; i < r; i++) std::copy(o.data() + i * D, o.data() + (i + 1) * D, op + out_row(i));
  });
}

#if FA_X86
// attend_d's tiles on the AVX-512 BF16 path, S keys: qb [B, H, T, D], kb [B, Hkv, S16/16, D/2, 16, 2], vb [B, Hkv,
// S2/2, D/16, 16, 2] bf16 → out [B, T, H, D] fp32
template <int64_t D>
void attend_bf16(const torch::Tensor& qb, const torch::Tensor& kb, const torch::Tensor& vb, int64_t S, float scale,
                 torch::Tensor& out, bool causal) {
  const int64_t B = qb.size(0), H = qb.size(1), T = qb.size(2), Hkv = kb.size(1), S16 = kb.size(2) * 16;
  const int64_t S2 = vb.size(2) * 2;
  const uint16_t *qp = (const uint16_t*)qb.data_ptr(), *kp = (const uint16_t*)kb.data_ptr(),
                 *vp = (const uint16_t*)vb.data_ptr();
  float* op = out.data_ptr<float>();
  for_tiles(B, H, Hkv, T, S, causal, D, [&](int64_t row, int r, int64_t kv, const int64_t* end, auto out_row) {
    HeadBF h{kp + kv * D * S16, vp + kv * D * S2, end[r - 1], {}};
    std::copy(end, end + R, h.end);
    const int64_t SS = (h.S + 31) / 32 * 32;
    thread_local std::vector<float> s, o;
    thread_local std::vector<uint16_t> pb;
    s.resize(R * SS), pb.resize(R * SS), o.resize(R * D);
    const uint32_t* qr = (const uint32_t*)(qp + row * D);
    with_rows(r, [&](auto rr) { rows_bf16<D, decltype(rr)::value>(h, qr, scale, s.data(), pb.data(), o.data()); });
    for (int i = 0; i < r; i++) std::copy(o.data() + i * D, o.data() + (i + 1) * D, op + out_row(i));
  });
}
#endif

// q [B, H, T, D], k, v [B, Hkv, S, D] (H a multiple of Hkv; any strides; fp32 or bf16; D 64 or 128), scale, causal
// (S ≥ T) → [B, T, H, D] in q's dtype
// The path a call takes: `path` (AUTO: this CPU's best); AVX-512 BF16's products are bf16's, so inputs not all bf16
// take the fp32 AVX-512 path there
int64_t path_for(int64_t path, bool bf16) {
  if (path == AUTO) path = best_path();
  return path == AVX512_BF16 && !bf16 ? AVX512 : path;
}

torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, bool causal, int64_t path) {
  const bool bf16 = q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16;
  TORCH_CHECK(path == AUTO || (path >= PORTABLE && path <= best_path()), "frames_attention: path ", path,
              " does not run on this CPU");
  path = path_for(path, bf16);
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.dim() == 4 && q.size(0) == k.size(0) && k.size(1) > 0 &&
              q.size(1) % k.size(1) == 0 && q.size(3) == k.size(3) && (q.size(3) == 64 || q.size(3) == 128) &&
              k.size(2) > 0 && (!causal || k.size(2) >= q.size(2)),
              "frames_attention: q [B, H, T, D], k, v [B, Hkv, S, D] with Hkv dividing H, D 64 or 128 (causal: S ≥ T)");
  TORCH_CHECK(q.device().is_cpu(), "frames_attention: CPU tensors only");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Hkv = k.size(1), S = k.size(2), D = q.size(3);
#if FA_X86
  if (path == AVX512_BF16) {  // bf16 copies in the path's layouts (zeros past S)
    const int64_t S16 = (S + 15) / 16 * 16, S2 = (S + 1) / 2 * 2;
    auto qb = q.contiguous();
    auto kb = at::constant_pad_nd(k, {0, 0, 0, S16 - S}).view({B, Hkv, S16 / 16, 16, D / 2, 2}).permute({0, 1, 2, 4, 3, 5})
                  .contiguous();
    auto vb = at::constant_pad_nd(v, {0, 0, 0, S2 - S}).view({B, Hkv, S2 / 2, 2, D / 16, 16}).permute({0, 1, 2, 4, 5, 3})
                  .contiguous();
    auto out = torch::empty({B, T, H, D}, q.options().dtype(at::kFloat));
    if (D == 64) attend_bf16<64>(qb, kb, vb, S, (float)scale, out, causal);
    else attend_bf16<128>(qb, kb, vb, S, (float)scale, out, causal);
    return out.to(q.scalar_type());
  }
#endif
  // fp32 copies: q scaled [B, H, T, D], k transposed [B, Hkv, S16/16, D, 16], v [B, Hkv, S, D]
  auto qf = (q.to(at::kFloat) * scale).contiguous();
  const int64_t S16 = (S + 15) / 16 * 16;
  auto kt = at::constant_pad_nd(k.to(at::kFloat), {0, 0, 0, S16 - S}).view({B, Hkv, S16 / 16, 16, D}).transpose(3, 4).contiguous();
  auto vf = v.to(at::kFloat).contiguous();
  auto out = torch::empty({B, T, H, D}, q.options().dtype(at::kFloat));
  if (D == 64) attend_d<64>(qf, kt, vf, out, causal, path);
  else attend_d<128>(qf, kt, vf, out, causal, path);
  return out.to(q.scalar_type());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "softmax(q · kᵀ · scale) · v, over every key or causal: [B, T, H, D]");
  m.def("best_path", &best_path, "the SIMD path this CPU runs (1 portable, 2 AVX2, 3 AVX-512, 4 AVX-512 BF16)");
  m.def("path_for", &path_for, "the path a call asking for `path` (0: the best) with inputs all bf16 or not takes");
}
