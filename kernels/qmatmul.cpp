// y[M, N] = x[M, K] · W[N, K]ᵀ with W in its GGUF blocks, on a CPU. The torch twin (same values, bit for bit) and
// the plain fp32 reference are in qmatmul.py; the block layouts in gguf_blocks.py.
//
// The arithmetic, for one output (m, n). It is the same sequence whatever M, the thread count or the SIMD path:
//
//   groups      K is cut into groups of G elements: G = 256 for the K-quants (Q4_K, Q5_K, Q6_K), 32 otherwise.
//   x           per group g of row m:  amax = max|x|,  inv = 32767 / amax,  xq_i = rint(x_i · inv) (int16),
//               dx_g = amax / 32767;  and xs_j = Σ xq over each 32 elements j (int32).
//   weights     per group: integer weights w_i and float scales, exactly as the file means them:
//                 Q4_K, Q5_K  value = d·sc_j·q_i − dmin·m_j     w_i = sc_j·q_i      (≤ 63·31, int16)
//                 Q6_K        value = d·sc_j·(q_i − 32)         w_i = sc_j·(q_i − 32) (|w| ≤ 4096)
//                 Q8_0        value = d·q_i                     w_i = q_i
//                 Q4_0, Q5_0  value = d·(q_i − 8 | 16)          w_i = q_i − 8 | 16
//                 Q4_1, Q5_1  value = d·q_i + m                 w_i = q_i
//   one group   isum_l = Σ w_i·xq_i over the i with (i mod 32) / 2 = l        16 int32 lanes: exact, any order
//               acc_l  = acc_l + float(isum_l) · (d · dx_g)                    fp32, a multiply then an add
//   minimums    K-quants: mn_j = mn_j + float(m_j · xs_j) · (dmin · dx_g)      8 lanes, j = sub-block
//               Q4_1, Q5_1: mn_j = mn_j + float(xs_g) · (m · dx_g)             lane j = g mod 8
//   y           (acc_0..15 summed as a tree: l + 8, then + 4, + 2, + 1)  +  (mn_0..7 likewise: + 4, + 2, + 1)
//               (the K-quants subtract their minimums), + bias_n, rounded once to the output dtype.
//
// Integer sums are exact (|x·w| summed over a lane stays below 2³¹ for every type: 16 · 4096 · 32767 for Q6_K),
// so the SIMD paths may add them in any order; every float operation is listed above, in that order, and the
// file is compiled with -ffp-contract=off so that no multiply and add are fused. Each output is computed by one
// thread, the work split over N only. So a row's result does not depend on the other rows, M, the thread count,
// or the path (AVX-512 VNNI, AVX2, portable C++).
//
// Cost: each weight group is unpacked once per call (per 32 rows of a long call) and applied to every row; a row
// then costs one int16 multiply-add per weight pair (vpdpwssd: 32 per instruction).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QMM_X86 1
#else
#define QMM_X86 0
#endif

namespace {

// GGML type ids (gguf.GGMLQuantizationType)
enum QType { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512VNNI = 3 };

constexpr int ROW_TILE = 32;  // rows applied to one unpacked group before the next rows are taken
constexpr int NB = 64;        // weight rows per tile (their blocks stay in L2 across row tiles)

struct Format {
  int G;            // elements per group (= per x scale)
  int block_bytes;  // bytes per group in the file
  bool kmin;        // K-quant minimums (dmin · m_j)
  bool lmin;        // legacy minimum (+ m)
};

Format format_of(int64_t qtype) {
  switch (qtype) {
    case Q4_0: return {32, 18, false, false};
    case Q4_1: return {32, 20, false, true};
    case Q5_0: return {32, 22, false, false};
    case Q5_1: return {32, 24, false, true};
    case Q8_0: return {32, 34, false, false};
    case Q4_K: return {256, 144, true, false};
    case Q5_K: return {256, 176, true, false};
    case Q6_K: return {256, 210, false, false};
  }
  TORCH_CHECK(false, "qmatmul: unsupported GGML type ", qtype);
}

float fp16_to_fp32(uint16_t h) {  // exact
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; e++; } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t rd16(const uint8_t* p) { return (uint16_t)(p[0] | p[1] << 8); }

// One group's scales (what the integer weights leave out).
struct Scales {
  float d = 0.f, dmin = 0.f, m = 0.f;
  int32_t mins[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // K-quants: m_j
  int16_t sc[16];                              // K-quants: sc_j (Q6_K: 16 of them, signed)
};

// Q4_K / Q5_K: 8 six-bit scales and mins packed in 12 bytes.
void kquant_scales(const uint8_t* s, int16_t* sc, int32_t* mn) {
  for (int j = 0; j < 4; j++) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Unpacking one group: integer weights w[G] (int16) and its scales. Portable; the SIMD paths have their own
// unpackers for the common types (equal integers: unpacking is exact).

void unpack_portable(int qtype, const uint8_t* b, int16_t* w, Scales& s) {
  switch (qtype) {
    case Q8_0: {
      s.d = fp16_to_fp32(rd16(b));
      for (int i = 0; i < 32; i++) w[i] = (int8_t)b[2 + i];
      break;
    }
    case Q4_0:
    case Q4_1: {
      bool one = qtype == Q4_1;
      s.d = fp16_to_fp32(rd16(b));
      if (one) s.m = fp16_to_fp32(rd16(b + 2));
      const uint8_t* qs = b + (one ? 4 : 2);
      for (int i = 0; i < 16; i++) {
        w[i] = (int16_t)(qs[i] & 15) - (one ? 0 : 8);
        w[i + 16] = (int16_t)(qs[i] >> 4) - (one ? 0 : 8);
      }
      break;
    }
    case Q5_0:
    case Q5_1: {
      bool one = qtype == Q5_1;
      s.d = fp16_to_fp32(rd16(b));
      if (one) s.m = fp16_to_fp32(rd16(b + 2));
      const uint8_t* h = b + (one ? 4 : 2);
      uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
      const uint8_t* qs = h + 4;
      for (int i = 0; i < 16; i++) {
        w[i] = (int16_t)((qs[i] & 15) | ((qh >> i) & 1) << 4) - (one ? 0 : 16);
        w[i + 16] = (int16_t)((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - (one ? 0 : 16);
      }
      break;
    }
    case Q4_K:
    case Q5_K: {
      bool five = qtype == Q5_K;
      s.d = fp16_to_fp32(rd16(b));
      s.dmin = fp16_to_fp32(rd16(b + 2));
      kquant_scales(b + 4, s.sc, s.mins);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int c = 0; c < 4; c++)  // 32 bytes → sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles)
        for (int l = 0; l < 32; l++) {
          int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
          if (five) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          w[64 * c + l] = (int16_t)(s.sc[2 * c] * lo);
          w[64 * c + 32 + l] = (int16_t)(s.sc[2 * c + 1] * hi);
        }
      break;
    }
    case Q6_K: {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t* sc = (const int8_t*)(b + 192);
      s.d = fp16_to_fp32(rd16(b + 208));
      for (int h = 0; h < 2; h++)
        for (int t = 0; t < 128; t++) {
          int sh = t / 32, l = t % 32;
          int q = (ql[64 * h + (sh & 1) * 32 + l] >> (4 * (sh >> 1))) & 15;
          q |= ((qh[32 * h + l] >> (2 * sh)) & 3) << 4;
          int e = 128 * h + t;
          w[e] = (int16_t)(sc[e / 16] * (q - 32));
        }
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The activations: xq [M, K] int16, dx [M, K / G], xs [M, K / 32] (see the top).

template <typename T>
float load_f(const T* p, int64_t i) { return static_cast<float>(p[i]); }

template <typename T>
void quantize_row_portable(const T* x, int64_t K, int G, int16_t* xq, float* dx, int32_t* xs) {
  for (int64_t g = 0; g < K / G; g++) {
    float amax = 0.f;
    for (int i = 0; i < G; i++) amax = std::max(amax, std::fabs(load_f(x, g * G + i)));
    float inv = amax > 0.f ? 32767.f / amax : 0.f;
    dx[g] = amax / 32767.f;
    for (int i = 0; i < G; i++) {
      float v = std::nearbyint(load_f(x, g * G + i) * inv);
      v = std::min(32767.f, std::max(-32767.f, v));
      xq[g * G + i] = (int16_t)v;
    }
  }
  for (int64_t j = 0; j < K / 32; j++) {
    int32_t t = 0;
    for (int i = 0; i < 32; i++) t += xq[j * 32 + i];
    xs[j] = t;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The per-row float steps, shared by every path (scalar: a few per group).

inline float tree16(const float* a) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; l++) t8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) t4[l] = t8[l] + t8[l + 4];
  float t2a = t4[0] + t4[2], t2b = t4[1] + t4[3];
  return t2a + t2b;
}

inline float tree8(const float* a) {
  float t4[4];
  for (int l = 0; l < 4; l++) t4[l] = a[l] + a[l + 4];
  float t2a = t4[0] + t4[2], t2b = t4[1] + t4[3];
  return t2a + t2b;
}

struct Call {
  const uint8_t* w;
  int64_t N, K, M, row_bytes;
  int qtype;
  Format f;
  const int16_t* xq;
  const float* dx;
  const int32_t* xs;
  const float* bias;  // [N] or null
  float* y;           // [M, N] fp32
};

// The minimum lanes' step for one group of one row (every path: scalar, 8 lanes at most).
inline void min_step(const Call& c, const Scales& s, int64_t m, int64_t g, float* mn) {
  float dxg = c.dx[m * (c.K / c.f.G) + g];
  if (c.f.kmin) {
    float t = s.dmin * dxg;
    const int32_t* xs = c.xs + m * (c.K / 32) + g * 8;
    for (int j = 0; j < 8; j++) mn[j] = mn[j] + (float)(s.mins[j] * xs[j]) * t;
  } else if (c.f.lmin) {
    float t = s.m * dxg;
    int j = (int)(g % 8);
    mn[j] = mn[j] + (float)c.xs[m * (c.K / 32) + g] * t;
  }
}

inline float finish(const Call& c, const float* acc, const float* mn, int64_t n) {
  float y = tree16(acc);
  if (c.f.kmin) y = y - tree8(mn);
  else if (c.f.lmin) y = y + tree8(mn);
  if (c.bias) y = y + c.bias[n];
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// Portable path

void isum_portable(const int16_t* w, const int16_t* x, int G, int32_t* lanes) {
  for (int l = 0; l < 16; l++) lanes[l] = 0;
  for (int i = 0; i < G; i++) lanes[(i % 32) / 2] += (int32_t)w[i] * (int32_t)x[i];
}

void tile_portable(const Call& c, int64_t n0, int64_t n1) {
  const int G = c.f.G;
  const int64_t groups = c.K / G;
  alignas(64) int16_t w[256];
  std::vector<float> acc(ROW_TILE * 16), mn(ROW_TILE * 8);
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t mt = std::min<int64_t>(ROW_TILE, c.M - m0);
    for (int64_t n = n0; n < n1; n++) {
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(mn.begin(), mn.end(), 0.f);
      const uint8_t* row = c.w + n * c.row_bytes;
      for (int64_t g = 0; g < groups; g++) {
        Scales s;
        unpack_portable(c.qtype, row + g * c.f.block_bytes, w, s);
        for (int64_t r = 0; r < mt; r++) {
          const int64_t m = m0 + r;
          int32_t lanes[16];
          isum_portable(w, c.xq + m * c.K + g * G, G, lanes);
          float sc = s.d * c.dx[m * groups + g];
          for (int l = 0; l < 16; l++) acc[r * 16 + l] = acc[r * 16 + l] + (float)lanes[l] * sc;
          min_step(c, s, m, g, &mn[r * 8]);
        }
      }
      for (int64_t r = 0; r < mt; r++) c.y[(m0 + r) * c.N + n] = finish(c, &acc[r * 16], &mn[r * 8], n);
    }
  }
}

#if QMM_X86
// ---------------------------------------------------------------------------------------------------------------
// AVX2 path: lanes 0–7 and 8–15 of the 16 are two ymm registers (the two 16-element halves of each 32).

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

AVX2_FN void unpack_avx2(int qtype, const uint8_t* b, int16_t* w, Scales& s) {
  const __m256i lo4 = _mm256_set1_epi8(15);
  if (qtype == Q4_K) {
    s.d = fp16_to_fp32(rd16(b));
    s.dmin = fp16_to_fp32(rd16(b + 2));
    kquant_scales(b + 4, s.sc, s.mins);
    const uint8_t* qs = b + 16;
    for (int c = 0; c < 4; c++) {
      __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
      __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      __m256i sl = _mm256_set1_epi16(s.sc[2 * c]), sh = _mm256_set1_epi16(s.sc[2 * c + 1]);
      __m256i* o = (__m256i*)(w + 64 * c);
      _mm256_store_si256(o + 0, _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(lo)), sl));
      _mm256_store_si256(o + 1, _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(lo, 1)), sl));
      _mm256_store_si256(o + 2, _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(hi)), sh));
      _mm256_store_si256(o + 3, _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(hi, 1)), sh));
    }
  } else if (qtype == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    s.d = fp16_to_fp32(rd16(b + 208));
    const __m256i three = _mm256_set1_epi8(3), k32 = _mm256_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
      __m256i vh = _mm256_loadu_si256((const __m256i*)(qh + 32 * h));
      for (int sh = 0; sh < 4; sh++) {
        __m256i vl = _mm256_loadu_si256((const __m256i*)(ql + 64 * h + (sh & 1) * 32));
        __m256i q = (sh >> 1) ? _mm256_and_si256(_mm256_srli_epi16(vl, 4), lo4) : _mm256_and_si256(vl, lo4);
        __m256i hb = _mm256_and_si256(_mm256_srl_epi16(vh, _mm_cvtsi32_si128(2 * sh)), three);
        q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
        int e = 128 * h + 32 * sh;
        __m256i a = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), k32);
        __m256i bq = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)), k32);
        _mm256_store_si256((__m256i*)(w + e), _mm256_mullo_epi16(a, _mm256_set1_epi16(sc[e / 16])));
        _mm256_store_si256((__m256i*)(w + e + 16), _mm256_mullo_epi16(bq, _mm256_set1_epi16(sc[e / 16 + 1])));
      }
    }
  } else if (qtype == Q8_0) {
    s.d = fp16_to_fp32(rd16(b));
    __m256i v = _mm256_loadu_si256((const __m256i*)(b + 2));
    _mm256_store_si256((__m256i*)w, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
    _mm256_store_si256((__m256i*)(w + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
  } else {
    unpack_portable(qtype, b, w, s);
  }
}

AVX2_FN inline __m256i madd2(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

AVX2_FN void tile_avx2(const Call& c, int64_t n0, int64_t n1) {
  const int G = c.f.G, chunks = G / 32;
  const int64_t groups = c.K / G;
  alignas(64) int16_t w[256];
  alignas(64) float acc[ROW_TILE * 16], mn[ROW_TILE * 8];
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t mt = std::min<int64_t>(ROW_TILE, c.M - m0);
    for (int64_t n = n0; n < n1; n++) {
      std::memset(acc, 0, sizeof(acc));
      std::memset(mn, 0, sizeof(mn));
      const uint8_t* row = c.w + n * c.row_bytes;
      for (int64_t g = 0; g < groups; g++) {
        Scales s;
        unpack_avx2(c.qtype, row + g * c.f.block_bytes, w, s);
        for (int64_t r = 0; r < mt; r++) {
          const int64_t m = m0 + r;
          const int16_t* x = c.xq + m * c.K + g * G;
          __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
          for (int k = 0; k < chunks; k++) {
            a0 = madd2(a0, _mm256_load_si256((const __m256i*)(w + 32 * k)), _mm256_loadu_si256((const __m256i*)(x + 32 * k)));
            a1 = madd2(a1, _mm256_load_si256((const __m256i*)(w + 32 * k + 16)), _mm256_loadu_si256((const __m256i*)(x + 32 * k + 16)));
          }
          __m256 sc = _mm256_set1_ps(s.d * c.dx[m * groups + g]);
          float* ar = acc + r * 16;
          _mm256_store_ps(ar, _mm256_add_ps(_mm256_load_ps(ar), _mm256_mul_ps(_mm256_cvtepi32_ps(a0), sc)));
          _mm256_store_ps(ar + 8, _mm256_add_ps(_mm256_load_ps(ar + 8), _mm256_mul_ps(_mm256_cvtepi32_ps(a1), sc)));
          min_step(c, s, m, g, mn + r * 8);
        }
      }
      for (int64_t r = 0; r < mt; r++) c.y[(m0 + r) * c.N + n] = finish(c, acc + r * 16, mn + r * 8, n);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// AVX-512 path (F, BW, VL, DQ and VNNI): one zmm holds a 32-element chunk and the 16 lanes.

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

VNNI_FN void unpack_avx512(int qtype, const uint8_t* b, int16_t* w, Scales& s) {
  const __m256i lo4 = _mm256_set1_epi8(15);
  if (qtype == Q4_K || qtype == Q5_K) {
    bool five = qtype == Q5_K;
    s.d = fp16_to_fp32(rd16(b));
    s.dmin = fp16_to_fp32(rd16(b + 2));
    kquant_scales(b + 4, s.sc, s.mins);
    const uint8_t* qs = b + (five ? 48 : 16);
    __m256i vh = five ? _mm256_loadu_si256((const __m256i*)(b + 16)) : _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi8(1);
    for (int c = 0; c < 4; c++) {
      __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
      __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      if (five) {
        __m256i bl = _mm256_and_si256(_mm256_srl_epi16(vh, _mm_cvtsi32_si128(2 * c)), one);
        __m256i bh = _mm256_and_si256(_mm256_srl_epi16(vh, _mm_cvtsi32_si128(2 * c + 1)), one);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(bl, 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(bh, 4));
      }
      _mm512_store_si512(w + 64 * c, _mm512_mullo_epi16(_mm512_cvtepu8_epi16(lo), _mm512_set1_epi16(s.sc[2 * c])));
      _mm512_store_si512(w + 64 * c + 32, _mm512_mullo_epi16(_mm512_cvtepu8_epi16(hi), _mm512_set1_epi16(s.sc[2 * c + 1])));
    }
  } else if (qtype == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    s.d = fp16_to_fp32(rd16(b + 208));
    const __m256i three = _mm256_set1_epi8(3);
    const __m512i k32 = _mm512_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
      __m256i vh = _mm256_loadu_si256((const __m256i*)(qh + 32 * h));
      for (int sh = 0; sh < 4; sh++) {
        __m256i vl = _mm256_loadu_si256((const __m256i*)(ql + 64 * h + (sh & 1) * 32));
        __m256i q = (sh >> 1) ? _mm256_and_si256(_mm256_srli_epi16(vl, 4), lo4) : _mm256_and_si256(vl, lo4);
        __m256i hb = _mm256_and_si256(_mm256_srl_epi16(vh, _mm_cvtsi32_si128(2 * sh)), three);
        q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
        int e = 128 * h + 32 * sh;
        __m512i scv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sc[e / 16])),
                                         _mm256_set1_epi16(sc[e / 16 + 1]), 1);
        _mm512_store_si512(w + e, _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(q), k32), scv));
      }
    }
  } else if (qtype == Q8_0) {
    s.d = fp16_to_fp32(rd16(b));
    _mm512_store_si512(w, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(b + 2))));
  } else if (qtype == Q5_0) {
    s.d = fp16_to_fp32(rd16(b));
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    __m128i qs = _mm_loadu_si128((const __m128i*)(b + 6));
    const __m128i lo4x = _mm_set1_epi8(15);
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(qs, lo4x)),
                                        _mm_and_si128(_mm_srli_epi16(qs, 4), lo4x), 1);
    q = _mm256_mask_add_epi8(q, (__mmask32)qh, q, _mm256_set1_epi8(16));
    _mm512_store_si512(w, _mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16(16)));
  } else {
    unpack_portable(qtype, b, w, s);
  }
}

VNNI_FN inline __attribute__((always_inline)) __m512i dot32(__m512i acc, __m512i a, __m512i b) {
  return _mm512_dpwssd_epi32(acc, a, b);  // 16 lanes += pairs of int16 products
}

// One group (G = 256: 8 chunks held in registers) applied to rows m0 .. m0+mt of the tile.
VNNI_FN inline __attribute__((always_inline)) void rows_group256(const Call& c, const int16_t* w, const Scales& s,
                                                                 int64_t g, int64_t m0, int64_t mt, float* acc, float* mn) {
  const int64_t groups = c.K / 256;
  __m512i wv[8];
  for (int k = 0; k < 8; k++) wv[k] = _mm512_load_si512(w + 32 * k);
  int64_t r = 0;
  for (; r + 2 <= mt; r += 2) {  // two rows at a time: four independent chains
    const int16_t* x0 = c.xq + (m0 + r) * c.K + g * 256;
    const int16_t* x1 = x0 + c.K;
    __m512i a0 = _mm512_setzero_si512(), b0 = _mm512_setzero_si512();
    __m512i a1 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      a0 = dot32(a0, wv[k], _mm512_loadu_si512(x0 + 32 * k));
      b0 = dot32(b0, wv[k + 1], _mm512_loadu_si512(x0 + 32 * k + 32));
      a1 = dot32(a1, wv[k], _mm512_loadu_si512(x1 + 32 * k));
      b1 = dot32(b1, wv[k + 1], _mm512_loadu_si512(x1 + 32 * k + 32));
    }
    for (int j = 0; j < 2; j++) {
      const int64_t m = m0 + r + j;
      __m512i isum = _mm512_add_epi32(j ? a1 : a0, j ? b1 : b0);
      __m512 sc = _mm512_set1_ps(s.d * c.dx[m * groups + g]);
      float* ar = acc + (r + j) * 16;
      _mm512_store_ps(ar, _mm512_add_ps(_mm512_load_ps(ar), _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sc)));
    }
  }
  for (; r < mt; r++) {
    const int16_t* x0 = c.xq + (m0 + r) * c.K + g * 256;
    __m512i a0 = _mm512_setzero_si512(), b0 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      a0 = dot32(a0, wv[k], _mm512_loadu_si512(x0 + 32 * k));
      b0 = dot32(b0, wv[k + 1], _mm512_loadu_si512(x0 + 32 * k + 32));
    }
    __m512 sc = _mm512_set1_ps(s.d * c.dx[(m0 + r) * groups + g]);
    float* ar = acc + r * 16;
    _mm512_store_ps(ar, _mm512_add_ps(_mm512_load_ps(ar), _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, b0)), sc)));
  }
  if (c.f.kmin) {  // mn_j += float(m_j · xs_j) · (dmin · dx): 8 lanes
    __m256i mv = _mm256_loadu_si256((const __m256i*)s.mins);
    for (r = 0; r < mt; r++) {
      const int64_t m = m0 + r;
      __m256i xs = _mm256_loadu_si256((const __m256i*)(c.xs + m * (c.K / 32) + g * 8));
      __m256 t = _mm256_set1_ps(s.dmin * c.dx[m * groups + g]);
      float* mr = mn + r * 8;
      _mm256_store_ps(mr, _mm256_add_ps(_mm256_load_ps(mr), _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(mv, xs)), t)));
    }
  }
}

VNNI_FN void tile_avx512(const Call& c, int64_t n0, int64_t n1) {
  const int G = c.f.G;
  const int64_t groups = c.K / G;
  alignas(64) int16_t w[256];
  alignas(64) float acc[ROW_TILE * 16], mn[ROW_TILE * 8];
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t mt = std::min<int64_t>(ROW_TILE, c.M - m0);
    for (int64_t n = n0; n < n1; n++) {
      std::memset(acc, 0, mt * 16 * sizeof(float));
      std::memset(mn, 0, mt * 8 * sizeof(float));
      const uint8_t* row = c.w + n * c.row_bytes;
      if (n + 1 < n1) _mm_prefetch((const char*)(row + c.row_bytes), _MM_HINT_T0);
      for (int64_t g = 0; g < groups; g++) {
        Scales s;
        unpack_avx512(c.qtype, row + g * c.f.block_bytes, w, s);
        if (G == 256) {
          rows_group256(c, w, s, g, m0, mt, acc, mn);
          continue;
        }
        __m512i wv = _mm512_load_si512(w);
        for (int64_t r = 0; r < mt; r++) {
          const int64_t m = m0 + r;
          __m512i isum = dot32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(c.xq + m * c.K + g * 32));
          __m512 sc = _mm512_set1_ps(s.d * c.dx[m * groups + g]);
          float* ar = acc + r * 16;
          _mm512_store_ps(ar, _mm512_add_ps(_mm512_load_ps(ar), _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sc)));
          min_step(c, s, m, g, mn + r * 8);
        }
      }
      for (int64_t r = 0; r < mt; r++) c.y[(m0 + r) * c.N + n] = finish(c, acc + r * 16, mn + r * 8, n);
    }
  }
}

// The activations' quantisation with AVX-512 (same values as the portable one: max, one fp32 multiply, rint).
template <typename T>
VNNI_FN void quantize_row_avx512(const T* x, int64_t K, int G, int16_t* xq, float* dx, int32_t* xs) {
  alignas(64) float buf[256];
  for (int64_t g = 0; g < K / G; g++) {
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < G; i += 16) {
      __m512 v;
      if constexpr (std::is_same_v<T, float>) {
        v = _mm512_loadu_ps(x + g * G + i);
      } else {  // bf16: the upper half of an fp32
        v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + g * G + i))), 16));
      }
      _mm512_store_ps(buf + i, v);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    float amax = _mm512_reduce_max_ps(mx);
    float inv = amax > 0.f ? 32767.f / amax : 0.f;
    dx[g] = amax / 32767.f;
    __m512 iv = _mm512_set1_ps(inv);
    for (int i = 0; i < G; i += 32) {  // rint under the default rounding (to nearest, ties to even); ±32767 at most
      __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(buf + i), iv));
      __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(buf + i + 16), iv));
      __m512i lim = _mm512_set1_epi32(32767), nlim = _mm512_set1_epi32(-32767);
      a = _mm512_max_epi32(_mm512_min_epi32(a, lim), nlim);
      b = _mm512_max_epi32(_mm512_min_epi32(b, lim), nlim);
      __m256i a16 = _mm512_cvtepi32_epi16(a), b16 = _mm512_cvtepi32_epi16(b);
      _mm256_storeu_si256((__m256i*)(xq + g * G + i), a16);
      _mm256_storeu_si256((__m256i*)(xq + g * G + i + 16), b16);
      xs[(g * G + i) / 32] = _mm512_reduce_add_epi32(_mm512_add_epi32(a, b));
    }
  }
}
#endif  // QMM_X86

// ---------------------------------------------------------------------------------------------------------------
// Dispatch

int detect() {
#if QMM_X86
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) return AVX512VNNI;  // AVX-512 without VNNI: the AVX2 path
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
#endif
  return PORTABLE;
}

const char* path_name(int p) {
  switch (p) {
    case PORTABLE: return "portable C++";
    case AVX2: return "AVX2";
    case AVX512VNNI: return "AVX-512 VNNI";
  }
  return "?";
}

int best_path() {
  static int p = detect();
  return p;
}

template <typename T>
void quantize_rows(const T* x, int64_t M, int64_t K, int G, int path, int16_t* xq, float* dx, int32_t* xs) {
  at::parallel_for(0, M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
#if QMM_X86
      if (path == AVX512VNNI) {
        quantize_row_avx512<T>(x + m * K, K, G, xq + m * K, dx + m * (K / G), xs + m * (K / 32));
        continue;
      }
#endif
      quantize_row_portable<T>(x + m * K, K, G, xq + m * K, dx + m * (K / G), xs + m * (K / 32));
    }
  });
}

// y = x · Wᵀ (+ bias). x [M, K] fp32 or bf16; w [N, row_bytes] uint8 (the file's blocks, row after row);
// bias [N] fp32 or undefined; path 0 = the best this CPU has. -> [M, N] in x's dtype.
torch::Tensor mm(torch::Tensor x, torch::Tensor w, int64_t qtype, int64_t N, int64_t K,
                 c10::optional<torch::Tensor> bias, int64_t path) {
  const Format f = format_of(qtype);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "qmatmul: x must be [M, K]");
  TORCH_CHECK(K % f.G == 0, "qmatmul: K = ", K, " is not a multiple of ", f.G);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "qmatmul: x must be fp32 or bf16");
  const int64_t row_bytes = K / f.G * f.block_bytes;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() == N * row_bytes,
              "qmatmul: w must hold N · ", row_bytes, " contiguous bytes");
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "qmatmul: path ", path, " does not run on this CPU");
  x = x.contiguous();
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return out.to(x.scalar_type());
  std::vector<int16_t> xq(M * K);
  std::vector<float> dx(M * (K / f.G));
  std::vector<int32_t> xs(M * (K / 32));
  if (x.scalar_type() == at::kFloat)
    quantize_rows<float>(x.data_ptr<float>(), M, K, f.G, (int)path, xq.data(), dx.data(), xs.data());
  else
    quantize_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), M, K, f.G, (int)path, xq.data(), dx.data(), xs.data());
  torch::Tensor b;
  if (bias && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == N, "qmatmul: bias must be [N]");
  }
  Call c{w.data_ptr<uint8_t>(), N, K, M, row_bytes, (int)qtype, f, xq.data(), dx.data(), xs.data(),
         b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>()};
  const int64_t grain = std::min<int64_t>(NB, std::max<int64_t>(1, N / (4 * at::get_num_threads())));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t a = n0; a < n1; a += NB) {
      const int64_t e = std::min(n1, a + NB);
#if QMM_X86
      if (path == AVX512VNNI) { tile_avx512(c, a, e); continue; }
      if (path == AVX2) { tile_avx2(c, a, e); continue; }
#endif
      tile_portable(c, a, e);
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

std::string backend() { return path_name(best_path()); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "y = x · Wᵀ (+ bias), W in GGUF blocks");
  m.def("backend", &backend, "the SIMD path this CPU runs");
  m.def("best_path", &best_path, "its number (1 portable, 2 AVX2, 3 AVX-512 VNNI)");
}
