// y[M, N] = x[M, K] · W[N, K]ᵀ with W in its GGUF blocks, on a CPU. The torch twin (same values, bit for bit) and
// the plain fp32 reference are in qmatmul.py; the block layouts in gguf_blocks.py.
//
// The arithmetic, for one output (m, n). It is the same sequence whatever M, the thread count or the SIMD path:
//
//   groups      K is cut into groups of G elements: G = 256 for the K-quants (Q4_K, Q5_K, Q6_K), 32 otherwise.
//   x           per group g of row m:  amax = max|x|,  inv = Q / amax,  xq_i = rint(x_i · inv),  dx_g = amax / Q,
//               with Q = 127 (int8, as llama.cpp's Q8_K) for the K-quants, Q = 32767 (int16) for the others;
//               and xs_j = Σ xq over each 32 elements j (int32).
//   weights     per group: integer weights w_i and float scales, exactly as the file means them:
//                 Q4_K, Q5_K  value = d·sc_j·q_i − dmin·m_j     w_i = sc_j·q_i
//                 Q6_K        value = d·sc_j·(q_i − 32)         w_i = sc_j·(q_i − 32)
//                 Q8_0        value = d·q_i                     w_i = q_i
//                 Q4_0, Q5_0  value = d·(q_i − 8 | 16)          w_i = q_i − 8 | 16
//                 Q4_1, Q5_1  value = d·q_i + m                 w_i = q_i
//   kernel      the order a group's elements are multiplied in: position p holds element e(p). G = 32: e(p) = p.
//   order       Q6_K: e(p) = p. Q4_K, Q5_K: e(p) = 32·SB[p / 32] + p mod 32 with SB = 0 2 1 3 4 6 5 7 (a 64-byte
//               load of the file's nibbles holds sub-blocks 2c and 2c + 2 in its low nibbles, 2c + 1 and 2c + 3 in
//               its high ones). x is stored in this order when it is quantized.
//   one group   isum_l = Σ w_e(p)·xq_e(p) over the p with (p mod L) / (L / 16) = l     16 int32 lanes: exact, any order
//               (L = 64 for the K-quants, 32 otherwise)
//               acc_l  = acc_l + float(isum_l) · (d · dx_g)                    fp32, a multiply then an add
//   minimums    per 32 elements j of the row: xsd_j = float(xs_j) · dx_g(j) (x's side, once per row) and
//               mm_j = dmin_g · m_j (K-quants) or m_j (Q4_1, Q5_1; exact either way), zero past K / 32;
//               mn_l = mn_l + mm_j · xsd_j for j = 16c + l, c = 0, 1, ...      16 lanes
//   y           tree(acc) − tree(mn) for the K-quants, + tree(mn) for Q4_1 / Q5_1, + bias_n, rounded once to
//               the output dtype; tree(a) sums 16 lanes as (a_l + a_l+8), then + 4, + 2, + 1.
//
// (Layers of every type on AVX-512 VNNI or AVX2 run instead from their weights packed at load, by an arithmetic of
// their own, stated with it below, the same on both: pack, mm_packed. A layer runs one or the other for every call of
// its steps and passes.)
//
// Integer sums are exact (|x·w| summed over a lane stays below 2³¹ for every type), so the SIMD paths may add them
// in any order; every float operation is listed above, in that order, and the file is compiled with
// -ffp-contract=off so that no multiply and add are fused. Each output is computed by one thread, the work split
// over N only. So a row's result does not depend on the other rows, M, the thread count, or the path (AVX-512 VNNI,
// AVX2, portable C++).
//
// Cost: each weight group is unpacked once per call (per 64 rows of a long call) and applied to every row. The
// K-quants stay unsigned bytes (their 4–6 bits): a row costs one vpmaddubsw (u8 × s8 pairs, 64 products) and one
// vpdpwssd (the pairs times their sub-block scale, into int32) per 64 weights, and a float step per group (Q6_K on
// AVX-512: x + 128 as the unsigned side, q − 32 as the signed one, and 128 · Σ sc·(q − 32), the weights' alone, taken
// away once per group and weight row, whatever the rows; the integers are the same). The others are widened to int16 and cost one vpdpwssd per 32 weights (calls of ≤ SMALL_ROWS rows: each group
// unpacked in registers, two weight rows at a time, fused32). The AVX-512 path unpacks 8 groups of 2 weight
// rows at a time (they stay in L1) and holds a 2 × 4 tile of accumulators (weight rows × rows) in registers; its
// K-quant calls of ≤ SMALL_ROWS rows take 16 weight rows at a time and finish their outputs together in vector lanes
// (finish16: at K = 1 536 a weight row's own finish had cost a third of its 6 groups; their minimums' lanes eight
// weight rows side by side, min_lanes16).
// AVX2 (no VNNI): a 32-weight slot one ymm, vpmaddubsw then vpmaddwd by the scale (three instructions a slot and
// row with the add); calls of ≤ SMALL_ROWS rows unpack each group in registers for tiles of ≤ 4 rows (fused_avx2;
// the 32-element types ≤ 4, fused32_avx2), longer ones through an L1 buffer (tile_avx2).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "aligned64.h"  // Aligned64

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "bf16_bits.h"  // bf16_rne, bf16_c10, bf16_rne8
#define QMM_X86 1
#else
#define QMM_X86 0
#endif

namespace {

// GGML type ids (gguf.GGMLQuantizationType)
enum QType { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
enum Path { AUTO = 0, PORTABLE = 1, AVX2 = 2, AVX512VNNI = 3 };

constexpr int ROW_TILE = 64;  // rows applied to one unpacked weight row before the next rows are taken
constexpr int NB = 32;        // weight rows per tile (their blocks stay in L2 across row tiles)
constexpr int64_t PREFETCH_BYTES = 8192;  // how far ahead of the bytes being unpacked the weights are fetched
constexpr int GROUP_CHUNK = 8;    // K-quant groups unpacked at a time (2 rows × 8 × 512 bytes: in L1)
// K-quant calls of at most this many rows unpack each group in registers, in row tiles (fused8, small8); above, the
// unpacked groups go through an L1 buffer (rows_kquant)
constexpr int SMALL_ROWS = 16;
constexpr int MANY_ROWS = 16;     // above: every weight row of a tile unpacked together (tile_kquant_many_avx512)

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

// Q4_K / Q5_K: 8 six-bit scales and mins packed in 12 bytes (bytes 0–3: sc 0–3 and the top bits of sc 4–7,
// 4–7: m 0–3 and the top bits of m 4–7, 8–11: the low four bits of sc 4–7 and m 4–7), four bytes at a time.
void kquant_scales(const uint8_t* s, int16_t* sc, int32_t* mn) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t lo = a & 0x3f3f3f3fu, ml = b & 0x3f3f3f3fu;
  const uint32_t hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u), mh = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
  for (int j = 0; j < 4; j++) {
    sc[j] = (lo >> (8 * j)) & 0xff;
    sc[j + 4] = (hi >> (8 * j)) & 0xff;
    mn[j] = (ml >> (8 * j)) & 0xff;
    mn[j + 4] = (mh >> (8 * j)) & 0xff;
  }
}

// The same, as 8 bytes each in one integer (byte j: sc_j, m_j): for the SIMD unpackers, no array in between.
inline void kquant_scales8(const uint8_t* s, uint64_t& sc, uint64_t& mn) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  sc = (uint64_t)(a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
  mn = (uint64_t)(b & 0x3f3f3f3fu) | (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
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
// The activations: xq [M, K] int16, dx [M, K / G], xsd [M, S16] (see the top; S16 = K / 32 rounded up to 16).

inline int64_t s16(int64_t K) { return (K / 32 + 15) / 16 * 16; }

template <typename T>
float load_f(const T* p, int64_t i) { return static_cast<float>(p[i]); }

template <typename T>
void quantize_row_portable(const T* x, int64_t K, int G, int16_t* xq, float* dx, float* xsd) {
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
  for (int64_t j = 0; j < s16(K); j++) {
    if (j >= K / 32) { xsd[j] = 0.f; continue; }
    int32_t t = 0;
    for (int i = 0; i < 32; i++) t += xq[j * 32 + i];
    xsd[j] = (float)t * dx[j * 32 / G];
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The K-quants (G = 256): int8 activations and weights as unsigned bytes, both in the kernel order (see the top).

constexpr int SB[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // Q4_K/Q5_K: the sub-block at slot p / 32 (its own inverse)

inline int sub_slot(int qtype, int j) { return qtype == Q6_K ? j : SB[j]; }  // where sub-block j's 32 elements sit

// xq [M, K] int8 in the kernel order, dx [M, K / 256], xsd [M, S16] (natural j), and for Q6_K x32 [M, K / 2] int16:
// 32·(xq_2t + xq_2t+1), the pairs vpmaddubsw takes away for Q6_K's offset (q − 32)
template <typename T>
void quantize_row8_portable(const T* x, int64_t K, int qtype, int8_t* xq, float* dx, float* xsd, int16_t* x32) {
  for (int64_t g = 0; g < K / 256; g++) {
    float amax = 0.f;
    for (int i = 0; i < 256; i++) amax = std::max(amax, std::fabs(load_f(x, g * 256 + i)));
    float inv = amax > 0.f ? 127.f / amax : 0.f;
    dx[g] = amax / 127.f;
    for (int j = 0; j < 8; j++) {
      int8_t* q = xq + g * 256 + 32 * sub_slot(qtype, j);
      int32_t t = 0;
      for (int i = 0; i < 32; i++) {
        float v = std::nearbyint(load_f(x, g * 256 + 32 * j + i) * inv);
        q[i] = (int8_t)std::min(127.f, std::max(-127.f, v));
        t += q[i];
      }
      xsd[g * 8 + j] = (float)t * dx[g];
    }
    if (x32)
      for (int t = 0; t < 128; t++) x32[g * 128 + t] = (int16_t)(32 * (xq[g * 256 + 2 * t] + xq[g * 256 + 2 * t + 1]));
  }
  for (int64_t j = K / 32; j < s16(K); j++) xsd[j] = 0.f;
}

// One K-quant group unpacked: u[p] the unsigned quant at kernel position p (Q4_K 0–15, Q5_K 0–31, Q6_K 0–63, its
// value q − 32), s[i] the sub-block scale of positions 2i and 2i + 1 (int16), d.
void unpack8_portable(int qtype, const uint8_t* b, uint8_t* u, int16_t* s, float& d) {
  uint8_t q[256];
  int16_t sc[256];  // per element, natural order
  if (qtype == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* s6 = (const int8_t*)(b + 192);
    d = fp16_to_fp32(rd16(b + 208));
    for (int h = 0; h < 2; h++)
      for (int t = 0; t < 128; t++) {
        int sh = t / 32, l = t % 32, e = 128 * h + t;
        q[e] = (uint8_t)(((ql[64 * h + (sh & 1) * 32 + l] >> (4 * (sh >> 1))) & 15) | ((qh[32 * h + l] >> (2 * sh)) & 3) << 4);
        sc[e] = s6[e / 16];
      }
  } else {  // Q4_K, Q5_K
    const bool five = qtype == Q5_K;
    int16_t s8[8];
    int32_t mn[8];
    d = fp16_to_fp32(rd16(b));
    kquant_scales(b + 4, s8, mn);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) {
        int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
        if (five) {
          lo |= ((qh[l] >> (2 * c)) & 1) << 4;
          hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        q[64 * c + l] = (uint8_t)lo;
        q[64 * c + 32 + l] = (uint8_t)hi;
        sc[64 * c + l] = s8[2 * c];
        sc[64 * c + 32 + l] = s8[2 * c + 1];
      }
  }
  for (int p = 0; p < 256; p++) {
    const int e = 32 * sub_slot(qtype, p / 32) + p % 32;
    u[p] = q[e];
    if (p % 2 == 0) s[p / 2] = sc[e];
  }
}

// isum_l over one group, from an unpacked group and x in the kernel order
void isum8_portable(const uint8_t* u, const int16_t* s, const int8_t* x, bool q6, int32_t* lanes) {
  for (int l = 0; l < 16; l++) lanes[l] = 0;
  for (int p = 0; p < 256; p++) lanes[(p % 64) / 4] += (int32_t)s[p / 2] * ((int32_t)u[p] - (q6 ? 32 : 0)) * x[p];
}

// ---------------------------------------------------------------------------------------------------------------
// The per-row float steps, shared by every path.

inline float tree16(const float* a) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; l++) t8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) t4[l] = t8[l] + t8[l + 4];
  float t2a = t4[0] + t4[2], t2b = t4[1] + t4[3];
  return t2a + t2b;
}

struct Call {
  const uint8_t* w;
  int64_t N, K, M, row_bytes, S16;
  int qtype;
  Format f;
  const int16_t* xq;  // G = 32: [M, K]
  const int8_t* xq8;  // G = 256: [M, K], the kernel order
  const int16_t* x32; // Q6_K, AVX2 and portable paths: [M, K / 2]
  const uint8_t* xu;  // Q6_K, AVX-512 path: xq8 + 128 as unsigned bytes [M, K] (x32 is not made)
  const float* dx;
  const float* xsd;   // [M, S16]
  const float* bias;  // [N] or null
  float* y;           // [M, N] fp32, or null: then
  uint16_t* yb;       // [M, N] bf16, each output rounded as torch's .to(bfloat16) rounds it
};

// Output i of the call
inline void put(const Call& c, int64_t i, float v) {
  if (c.yb) c.yb[i] = c10::BFloat16(v).x;
  else c.y[i] = v;
}

// A weight row's minimums per 32 elements, mm[S16] (zero past K / 32): dmin_g · m_j, or m_g. Exact.
void row_mins(const Call& c, const uint8_t* row, float* mm) {
  std::fill(mm, mm + c.S16, 0.f);
  for (int64_t g = 0; g < c.K / c.f.G; g++) {
    const uint8_t* b = row + g * c.f.block_bytes;
    if (c.f.kmin) {
      int16_t sc[8];
      int32_t mn[8];
      kquant_scales(b + 4, sc, mn);
      float dmin = fp16_to_fp32(rd16(b + 2));
      for (int j = 0; j < 8; j++) mm[g * 8 + j] = dmin * (float)mn[j];
    } else if (c.f.lmin) {
      mm[g] = fp16_to_fp32(rd16(b + 2));
    }
  }
}

inline void min_lanes_portable(const float* mm, const float* xsd, int64_t S16, float* mn) {
  for (int l = 0; l < 16; l++) mn[l] = 0.f;
  for (int64_t j = 0; j < S16; j += 16)
    for (int l = 0; l < 16; l++) mn[l] = mn[l] + mm[j + l] * xsd[j + l];
}

inline float finish(const Call& c, float yacc, float ymn, int64_t n) {
  float y = yacc;
  if (c.f.kmin) y = y - ymn;
  else if (c.f.lmin) y = y + ymn;
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
  const bool mins = c.f.kmin || c.f.lmin;
  alignas(64) int16_t w[256], s8[128];
  alignas(64) uint8_t u[256];
  std::vector<float> acc(ROW_TILE * 16), mm(c.S16);
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t mt = std::min<int64_t>(ROW_TILE, c.M - m0);
    for (int64_t n = n0; n < n1; n++) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const uint8_t* row = c.w + n * c.row_bytes;
      for (int64_t g = 0; g < groups; g++) {
        Scales s;
        if (G == 256) unpack8_portable(c.qtype, row + g * c.f.block_bytes, u, s8, s.d);
        else unpack_portable(c.qtype, row + g * c.f.block_bytes, w, s);
        for (int64_t r = 0; r < mt; r++) {
          const int64_t m = m0 + r;
          int32_t lanes[16];
          if (G == 256) isum8_portable(u, s8, c.xq8 + m * c.K + g * G, c.qtype == Q6_K, lanes);
          else isum_portable(w, c.xq + m * c.K + g * G, G, lanes);
          float sc = s.d * c.dx[m * groups + g];
          for (int l = 0; l < 16; l++) acc[r * 16 + l] = acc[r * 16 + l] + (float)lanes[l] * sc;
        }
      }
      if (mins) row_mins(c, row, mm.data());
      for (int64_t r = 0; r < mt; r++) {
        float mn[16] = {0.f};
        if (mins) min_lanes_portable(mm.data(), c.xsd + (m0 + r) * c.S16, c.S16, mn);
        put(c, (m0 + r) * c.N + n, finish(c, tree16(&acc[r * 16]), tree16(mn), n));
      }
    }
  }
}

#if QMM_X86
// ---------------------------------------------------------------------------------------------------------------
// AVX2 path: lanes 0–7 and 8–15 of the 16 are two ymm registers (the two 16-element halves of each 32).

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

// fp16 → fp32 in hardware: the same exact value as fp16_to_fp32
__attribute__((target("f16c"))) inline float f16c(uint16_t h) { return _cvtsh_ss(h); }

AVX2_FN inline __m256i shr(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

// unpack8_portable's values: each 32 positions (half h of chunk k) one ymm
AVX2_FN void unpack8_avx2(int qtype, const uint8_t* b, uint8_t* u, int16_t* s, float& d) {
  const __m256i lo4 = _mm256_set1_epi8(15);
  if (qtype == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    d = f16c(rd16(b + 208));
    const __m256i three = _mm256_set1_epi8(3);
    for (int k = 0; k < 4; k++) {
      const __m256i vh = _mm256_loadu_si256((const __m256i*)(qh + 32 * (k / 2)));
      for (int h = 0; h < 2; h++) {  // elements 64k + 32h + l: the nibble k % 2 of ql, bits 2·(2(k % 2) + h) of qh
        __m256i q = _mm256_and_si256(shr(_mm256_loadu_si256((const __m256i*)(ql + 64 * (k / 2) + 32 * h)), 4 * (k % 2)), lo4);
        __m256i hb = _mm256_and_si256(shr(vh, 2 * (2 * (k % 2) + h)), three);
        _mm256_store_si256((__m256i*)(u + 64 * k + 32 * h), _mm256_or_si256(q, _mm256_slli_epi16(hb, 4)));
        const int e = 4 * k + 2 * h;  // the half's two 16-element scales
        _mm256_store_si256((__m256i*)(s + 32 * k + 16 * h), _mm256_set_m128i(_mm_set1_epi16(sc[e + 1]), _mm_set1_epi16(sc[e])));
      }
    }
  } else {  // Q4_K, Q5_K
    const bool five = qtype == Q5_K;
    int16_t s8[8];
    int32_t mn[8];
    d = f16c(rd16(b));
    kquant_scales(b + 4, s8, mn);
    const uint8_t* qs = b + (five ? 48 : 16);
    const __m256i vh = five ? _mm256_loadu_si256((const __m256i*)(b + 16)) : _mm256_setzero_si256(), one = _mm256_set1_epi8(1);
    for (int k = 0; k < 4; k++)
      for (int h = 0; h < 2; h++) {
        const int sb = SB[2 * k + h];  // its nibble sb % 2 of qs[32·(sb / 2) ..], its fifth bit bit sb of qh
        __m256i q = _mm256_and_si256(shr(_mm256_loadu_si256((const __m256i*)(qs + 32 * (sb / 2))), 4 * (sb % 2)), lo4);
        if (five) q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(shr(vh, sb), one), 4));
        _mm256_store_si256((__m256i*)(u + 64 * k + 32 * h), q);
        _mm256_store_si256((__m256i*)(s + 32 * k + 16 * h), _mm256_set1_epi16(s8[sb]));
      }
  }
}

// The weights PREFETCH_BYTES ahead of a block of n bytes at b (a thread's rows are one stream), up to end
inline void prefetch(const uint8_t* b, int64_t n, const uint8_t* end) {
  const uint8_t* a = b + PREFETCH_BYTES;
  if (a + n <= end)
    for (int64_t l = 0; l < n; l += 64) _mm_prefetch((const char*)(a + l), _MM_HINT_T0);
}

// Q4_K / Q5_K, from a block's first 16 bytes (d, dmin and the 12 packed bytes s_i = byte 4 + i), in one register:
// bytes 0–7 sc_j, 8–15 m_j (kquant_scales' values). Low bits: sc_j = s_j & 63, m_j = s_4+j & 63 (j < 4),
// sc_j = s_4+j & 15, m_j = s_4+j >> 4 (j ≥ 4); top two bits (j ≥ 4): those of s_j−4 (sc), s_j (m).
AVX2_FN inline __attribute__((always_inline)) __m128i kquant_scales16(__m128i q) {
  const __m128i lo = _mm_shuffle_epi8(q, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i hi = _mm_shuffle_epi8(q, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i low = _mm_and_si128(_mm_blend_epi16(lo, _mm_srli_epi16(lo, 4), 0xC0),
                                    _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  return _mm_or_si128(low, _mm_srli_epi16(_mm_and_si128(hi, _mm_set1_epi8((char)0xC0)), 2));
}

// A K-quant group's minimums dmin · float(m_j), 8 at once (row_mins' products), from kquant_scales16 and d, dmin
AVX2_FN inline __attribute__((always_inline)) void mins8(__m128i sm, __m128 dd, float* mm) {
  __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
  _mm256_storeu_ps(mm, _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), mf));
}

// The largest of 8 lanes
AVX2_FN inline __attribute__((always_inline)) float hmax8(__m256 v) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}

// 32 values v[0..3] times iv, rint (the default rounding) within ±127, stored in order as int8 at q -> their sum
AVX2_FN inline __attribute__((always_inline)) int32_t round32_avx2(const __m256* v, __m256 iv, int8_t* q) {
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  __m256i a[4];
  for (int t = 0; t < 4; t++) a[t] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[t], iv)), lim), nlim);
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
  _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));  // in order
  const __m256i t2 = _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]));
  __m128i t1 = _mm_add_epi32(_mm256_castsi256_si128(t2), _mm256_extracti128_si256(t2, 1));
  t1 = _mm_add_epi32(t1, _mm_srli_si128(t1, 8));
  t1 = _mm_add_epi32(t1, _mm_srli_si128(t1, 4));
  return _mm_cvtsi128_si32(t1);
}

// quantize_row8_portable's values with AVX2 (max, one fp32 multiply, rint under the default rounding: to nearest,
// ties to even; ±127 at most), x32 where asked for
template <typename T>
AVX2_FN void quantize_row8_avx2(const T* x, int64_t K, int qtype, int8_t* xq, float* dx, float* xsd, int16_t* x32) {
  alignas(32) float buf[256];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < K / 256; g++) {
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8) {
      __m256 v;
      if constexpr (std::is_same_v<T, float>) {
        v = _mm256_loadu_ps(x + g * 256 + i);
      } else {  // bf16: the upper half of an fp32
        v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(x + g * 256 + i))), 16));
      }
      _mm256_store_ps(buf + i, v);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v, absmask));
    }
    const float amax = hmax8(mx);
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    dx[g] = amax / 127.f;
    const __m256 iv = _mm256_set1_ps(inv);
    for (int j = 0; j < 8; j++) {
      __m256 v[4];
      for (int t = 0; t < 4; t++) v[t] = _mm256_load_ps(buf + 32 * j + 8 * t);
      xsd[g * 8 + j] = (float)round32_avx2(v, iv, xq + g * 256 + 32 * sub_slot(qtype, j)) * dx[g];
    }
    if (x32)
      for (int k = 0; k < 8; k++)
        _mm256_storeu_si256((__m256i*)(x32 + g * 128 + 16 * k),
                            _mm256_maddubs_epi16(_mm256_set1_epi8(32), _mm256_loadu_si256((const __m256i*)(xq + g * 256 + 32 * k))));
  }
  for (int64_t j = K / 32; j < s16(K); j++) xsd[j] = 0.f;
}

// Keeps an accumulator in its register, added to in program order: integer adds are associative, and without this
// GCC sums a slot's products as a tree instead, every product stored to the stack first (1.5× slower on a Zen 3)
AVX2_FN inline __attribute__((always_inline)) void in_register(__m256i& v) { __asm__("" : "+x"(v)); }

AVX2_FN inline __m256i madd2(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

// tree16 of lanes 0–7 (a) and 8–15 (b), in registers
AVX2_FN inline __attribute__((always_inline)) float tree16_avx2(__m256 a, __m256 b) {
  const __m256 t8 = _mm256_add_ps(a, b);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // [t4_0 + t4_2, t4_1 + t4_3, ..]
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// min_lanes_portable's mn, lanes 0–7 and 8–15, then its tree
AVX2_FN inline __attribute__((always_inline)) float min_tree_avx2(const float* mm, const float* xsd, int64_t S16) {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  for (int64_t j = 0; j < S16; j += 16) {
    a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(mm + j), _mm256_loadu_ps(xsd + j)));
    b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_loadu_ps(mm + j + 8), _mm256_loadu_ps(xsd + j + 8)));
  }
  return tree16_avx2(a, b);
}

// K-quants, calls of few rows (M ≤ SMALL_ROWS): one weight row × MR rows, each group unpacked in registers and
// applied to the tile's rows, the accumulators in registers across the groups. A 32-position slot s (kernel order)
// is one ymm: its pairs' products (vpmaddubsw) times their sub-block scale (vpmaddwd) go to lanes 8·(s % 2) ..
// 8·(s % 2) + 7 of the 16. Q6_K: q · x less 32 · x by pairs (x32), then the scale.
// The float steps are the portable path's, in its order. `first`: the tile that writes the row's minimums into mm.
template <int QT, int MR>
AVX2_FN void fused_avx2(const Call& c, int64_t n, int64_t m0, bool first, float* mm) {
  const int64_t groups = c.K / 256;
  const uint8_t* xr[MR];
  const int16_t* x32[MR];  // Q6_K
  for (int i = 0; i < MR; i++) {
    xr[i] = (const uint8_t*)c.xq8 + (m0 + i) * c.K;
    x32[i] = QT == Q6_K ? c.x32 + (m0 + i) * (c.K / 2) : nullptr;
  }
  const uint8_t* row = c.w + n * c.row_bytes;
  const uint8_t* end = c.w + c.N * c.row_bytes;
  const __m256i lo4 = _mm256_set1_epi8(15);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* b = row + g * c.f.block_bytes;
    if (first) prefetch(b, c.f.block_bytes, end);
    const uint8_t* xg[MR];
    for (int i = 0; i < MR; i++) xg[i] = xr[i] + g * 256;
    __m256i is[MR][2];
    for (int i = 0; i < MR; i++) is[i][0] = is[i][1] = _mm256_setzero_si256();
    float d;
    if constexpr (QT == Q6_K) {
      d = f16c(rd16(b + 208));
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 192)));  // 16 scales
      const __m256i sca = _mm256_permute2x128_si256(sc16, sc16, 0x00), scb = _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const __m256i qh0 = _mm256_loadu_si256((const __m256i*)(b + 128)), qh1 = _mm256_loadu_si256((const __m256i*)(b + 160));
#pragma GCC unroll 8
      for (int s = 0; s < 8; s++) {  // elements 32s ..: element 128h + 32t + l, h = s / 4, t = s % 4: the nibble
        const int h = s / 4, t = s % 4;  // t / 2 of ql[64h + 32 (t % 2) + l], bits 2t of qh[32h + l]
        __m256i q = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32 * (t % 2)));
        if (t / 2) q = _mm256_srli_epi16(q, 4);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h ? qh1 : qh0, 2 * t), _mm256_set1_epi8(3));
        q = _mm256_or_si256(_mm256_and_si256(q, lo4), _mm256_slli_epi16(hb, 4));  // q, unsigned
        // sub-blocks 2s (bytes 0–15: the low lane) and 2s + 1: words 2s % 8 and 2s % 8 + 1 of sca or scb
        const int w0 = (2 * s) % 8;
        const __m256i sv = _mm256_shuffle_epi8(s < 4 ? sca : scb,
                                               _mm256_setr_epi8(2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1,
                                                                2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1,
                                                                2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3,
                                                                2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3, 2 * w0 + 2, 2 * w0 + 3));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {  // q · x − 32 · x, pair by pair (|·| ≤ 2 · 63 · 127 + 2 · 32 · 127 < 2¹⁵)
          const __m256i pr = _mm256_sub_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i*)(xg[i] + 32 * s))),
                                              _mm256_loadu_si256((const __m256i*)(x32[i] + g * 128 + 16 * s)));
          is[i][s % 2] = _mm256_add_epi32(is[i][s % 2], _mm256_madd_epi16(pr, sv));
        }
      }
    } else {
      const __m128i q16 = _mm_loadu_si128((const __m128i*)b);
      const __m128 dd = _mm_cvtph_ps(q16);  // d, dmin
      d = _mm_cvtss_f32(dd);
      const __m128i sm = kquant_scales16(q16);
      if (first) mins8(sm, dd, mm + g * 8);
      const __m256i scw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // sc_0..7 as words, both lanes
      const uint8_t* qs = b + (QT == Q5_K ? 48 : 16);
      const __m256i vh = QT == Q5_K ? _mm256_loadu_si256((const __m256i*)(b + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int sb = 0; sb < 8; sb++) {  // sub-block sb: the nibble sb % 2 of qs[32 (sb / 2) ..], at slot SB[sb]
        __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * (sb / 2)));
        if (sb % 2) q = _mm256_srli_epi16(q, 4);
        q = _mm256_and_si256(q, lo4);
        if constexpr (QT == Q5_K)  // its fifth bit: bit sb of qh
          q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(vh, sb), _mm256_set1_epi8(1)), 4));
        const __m256i sv = _mm256_shuffle_epi8(scw, _mm256_set1_epi16((short)((2 * sb + 1) << 8 | 2 * sb)));
        const int slot = SB[sb];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
          const __m256i pr = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i*)(xg[i] + 32 * slot)));
          is[i][slot % 2] = _mm256_add_epi32(is[i][slot % 2], _mm256_madd_epi16(pr, sv));
        }
      }
    }
    for (int i = 0; i < MR; i++) {
      const __m256 sc = _mm256_set1_ps(d * c.dx[(m0 + i) * groups + g]);
      for (int h = 0; h < 2; h++) acc[i][h] = _mm256_add_ps(acc[i][h], _mm256_mul_ps(_mm256_cvtepi32_ps(is[i][h]), sc));
    }
  }
  for (int i = 0; i < MR; i++) {
    const int64_t m = m0 + i;
    const float ymn = c.f.kmin ? min_tree_avx2(mm, c.xsd + m * c.S16, c.S16) : 0.f;
    put(c, m * c.N + n, finish(c, tree16_avx2(acc[i][0], acc[i][1]), ymn, n));
  }
}

// Rows of a small call in tiles of ≤ 4, of sizes as equal as they can be: fused(MR, m0, first) for each, MR an
// std::integral_constant (`first`: the tile that writes the row's minimums)
template <typename F>
void small_tiles(int64_t M, const F& fused) {
  const int64_t tiles = (M + 3) / 4;
  for (int64_t t = 0, m0 = 0; t < tiles; t++) {
    const int64_t mt = (M - m0) / (tiles - t);
    if (mt == 1) fused(std::integral_constant<int, 1>(), m0, t == 0);
    else if (mt == 2) fused(std::integral_constant<int, 2>(), m0, t == 0);
    else if (mt == 3) fused(std::integral_constant<int, 3>(), m0, t == 0);
    else fused(std::integral_constant<int, 4>(), m0, t == 0);
    m0 += mt;
  }
}

// G = 32: one group's integer weights as two ymm (elements 0–15, 16–31), its d and (Q4_1, Q5_1) m: unpack_portable's
// values, every 32-element type in registers (unpack_avx2 stores them)
AVX2_FN inline __attribute__((always_inline)) void group32_avx2(int qtype, const uint8_t* b, __m256i& lo, __m256i& hi,
                                                               float& d, float& m) {
  d = f16c(rd16(b));
  if (qtype == Q8_0) {
    lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 2)));
    hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 18)));
    return;
  }
  // Q4_0, Q4_1, Q5_0, Q5_1: low nibbles elements 0–15, high ones 16–31; Q5_x: bit j of qh adds 16 to element j;
  // Q4_0 takes 8 away, Q5_0 16; Q4_1, Q5_1 have m after d
  const bool one = qtype == Q4_1 || qtype == Q5_1, five = qtype == Q5_0 || qtype == Q5_1;
  if (one) m = f16c(rd16(b + 2));
  const uint8_t* h = b + (one ? 4 : 2);
  const __m128i qs = _mm_loadu_si128((const __m128i*)(h + (five ? 4 : 0))), lo4 = _mm_set1_epi8(15);
  lo = _mm256_cvtepu8_epi16(_mm_and_si128(qs, lo4));
  hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(qs, 4), lo4));
  if (five) {
    uint32_t qh;
    std::memcpy(&qh, h, 4);
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)0x8000);
    const __m256i sixteen = _mm256_set1_epi16(16);
    const __m256i a = _mm256_and_si256(_mm256_set1_epi16((short)(qh & 0xffff)), bit);
    const __m256i c = _mm256_and_si256(_mm256_set1_epi16((short)(qh >> 16)), bit);
    lo = _mm256_add_epi16(lo, _mm256_and_si256(_mm256_cmpeq_epi16(a, bit), sixteen));
    hi = _mm256_add_epi16(hi, _mm256_and_si256(_mm256_cmpeq_epi16(c, bit), sixteen));
  }
  if (!one) {
    const __m256i offset = _mm256_set1_epi16(five ? 16 : 8);
    lo = _mm256_sub_epi16(lo, offset);
    hi = _mm256_sub_epi16(hi, offset);
  }
}

AVX2_FN void unpack_avx2(int qtype, const uint8_t* b, int16_t* w, Scales& s) {  // G = 32
  __m256i lo, hi;
  group32_avx2(qtype, b, lo, hi, s.d, s.m);
  _mm256_store_si256((__m256i*)w, lo);
  _mm256_store_si256((__m256i*)(w + 16), hi);
}

// G = 32, calls of few rows (M ≤ SMALL_ROWS): one weight row × MR rows, each group unpacked in registers and applied
// to the tile's rows (vpmaddwd: lanes 0–7 elements 0–15 by pairs, 8–15 the rest); the portable path's float steps,
// in its order. `first`: the tile that writes the row's minimums (Q4_1, Q5_1: m per group) into mm.
template <int MR>
AVX2_FN void fused32_avx2(const Call& c, int64_t n, int64_t m0, bool first, float* mm) {
  const int64_t groups = c.K / 32;
  const uint8_t* row = c.w + n * c.row_bytes;
  const uint8_t* end = c.w + c.N * c.row_bytes;
  __m256 acc[MR][2];
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* b = row + g * c.f.block_bytes;
    if (first) prefetch(b, c.f.block_bytes, end);
    __m256i lo, hi;
    float d, m = 0.f;
    group32_avx2(c.qtype, b, lo, hi, d, m);
    if (first && c.f.lmin) mm[g] = m;
    for (int i = 0; i < MR; i++) {
      const int16_t* x = c.xq + (m0 + i) * c.K + g * 32;
      const __m256 sc = _mm256_set1_ps(d * c.dx[(m0 + i) * groups + g]);
      const __m256i a = _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i*)x));
      const __m256i h = _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i*)(x + 16)));
      acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_mul_ps(_mm256_cvtepi32_ps(a), sc));
      acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_mul_ps(_mm256_cvtepi32_ps(h), sc));
    }
  }
  for (int i = 0; i < MR; i++) {
    const int64_t r = m0 + i;
    const float ymn = c.f.lmin ? min_tree_avx2(mm, c.xsd + r * c.S16, c.S16) : 0.f;
    put(c, r * c.N + n, finish(c, tree16_avx2(acc[i][0], acc[i][1]), ymn, n));
  }
}

AVX2_FN void tile_avx2(const Call& c, int64_t n0, int64_t n1) {
  if (c.M <= SMALL_ROWS) {  // one weight row at a time, the call's rows in tiles of ≤ 4
    std::vector<float> mm(c.S16);  // zero past K / 32
    for (int64_t n = n0; n < n1; n++)
      small_tiles(c.M, [&](auto mr, int64_t m0, bool first) {
        if (c.qtype == Q6_K) fused_avx2<Q6_K, mr()>(c, n, m0, first, mm.data());
        else if (c.qtype == Q5_K) fused_avx2<Q5_K, mr()>(c, n, m0, first, mm.data());
        else if (c.qtype == Q4_K) fused_avx2<Q4_K, mr()>(c, n, m0, first, mm.data());
        else fused32_avx2<mr()>(c, n, m0, first, mm.data());
      });
    return;
  }
  const int G = c.f.G, chunks = G / 32;
  const int64_t groups = c.K / G;
  const bool mins = c.f.kmin || c.f.lmin;
  const bool q6 = c.qtype == Q6_K;
  alignas(64) int16_t w[256], s8[128];
  alignas(64) uint8_t u[256];
  alignas(64) float acc[ROW_TILE * 16];
  std::vector<float> mm(c.S16);
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t mt = std::min<int64_t>(ROW_TILE, c.M - m0);
    for (int64_t n = n0; n < n1; n++) {
      std::memset(acc, 0, sizeof(acc));
      const uint8_t* row = c.w + n * c.row_bytes;
      for (int64_t g = 0; g < groups; g++) {
        Scales s;
        if (G == 256) unpack8_avx2(c.qtype, row + g * c.f.block_bytes, u, s8, s.d);
        else unpack_avx2(c.qtype, row + g * c.f.block_bytes, w, s);
        for (int64_t r = 0; r < mt; r++) {
          const int64_t m = m0 + r;
          __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
          if (G == 256) {  // lanes 0–7: the first 32 positions of each 64, 8–15 the second
            const int8_t* x = c.xq8 + m * c.K + g * 256;
            for (int k = 0; k < 4; k++)
              for (int h = 0; h < 2; h++) {
                __m256i p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i*)(u + 64 * k + 32 * h)),
                                                 _mm256_loadu_si256((const __m256i*)(x + 64 * k + 32 * h)));
                if (q6) p = _mm256_sub_epi16(p, _mm256_loadu_si256((const __m256i*)(c.x32 + m * (c.K / 2) + g * 128 + 32 * k + 16 * h)));
                __m256i& a = h ? a1 : a0;
                a = madd2(a, p, _mm256_load_si256((const __m256i*)(s8 + 32 * k + 16 * h)));
              }
          } else {
            const int16_t* x = c.xq + m * c.K + g * G;
            for (int k = 0; k < chunks; k++) {
              a0 = madd2(a0, _mm256_load_si256((const __m256i*)(w + 32 * k)), _mm256_loadu_si256((const __m256i*)(x + 32 * k)));
              a1 = madd2(a1, _mm256_load_si256((const __m256i*)(w + 32 * k + 16)), _mm256_loadu_si256((const __m256i*)(x + 32 * k + 16)));
            }
          }
          __m256 sc = _mm256_set1_ps(s.d * c.dx[m * groups + g]);
          float* ar = acc + r * 16;
          _mm256_store_ps(ar, _mm256_add_ps(_mm256_load_ps(ar), _mm256_mul_ps(_mm256_cvtepi32_ps(a0), sc)));
          _mm256_store_ps(ar + 8, _mm256_add_ps(_mm256_load_ps(ar + 8), _mm256_mul_ps(_mm256_cvtepi32_ps(a1), sc)));
        }
      }
      if (mins) row_mins(c, row, mm.data());
      for (int64_t r = 0; r < mt; r++) {
        float mn[16] = {0.f};
        if (mins) min_lanes_portable(mm.data(), c.xsd + (m0 + r) * c.S16, c.S16, mn);
        put(c, (m0 + r) * c.N + n, finish(c, tree16(acc + r * 16), tree16(mn), n));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// AVX-512 path (F, BW, VL, DQ and VNNI): one zmm holds a 32-element chunk and the 16 lanes.

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

// G = 32: one group's integer weights in a register, its d and (Q4_1, Q5_1) m: unpack_portable's values
// (unpack_avx512 stores them)
VNNI_FN inline __attribute__((always_inline)) __m512i group32(int qtype, const uint8_t* b, float& d, float& m) {
  d = f16c(rd16(b));
  if (qtype == Q8_0) return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(b + 2)));
  // Q4_0, Q4_1, Q5_0, Q5_1: the low nibbles are elements 0–15, the high ones 16–31; Q5_x: bit j of qh adds 16 to
  // element j; Q4_0 takes 8 away, Q5_0 16; Q4_1, Q5_1 have m after d
  const bool one = qtype == Q4_1 || qtype == Q5_1, five = qtype == Q5_0 || qtype == Q5_1;
  if (one) m = f16c(rd16(b + 2));
  const uint8_t* h = b + (one ? 4 : 2);
  const __m128i qs = _mm_loadu_si128((const __m128i*)(h + (five ? 4 : 0))), lo4x = _mm_set1_epi8(15);
  __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(qs, lo4x)),
                                      _mm_and_si128(_mm_srli_epi16(qs, 4), lo4x), 1);
  if (five) {
    uint32_t qh;
    std::memcpy(&qh, h, 4);
    q = _mm256_mask_add_epi8(q, (__mmask32)qh, q, _mm256_set1_epi8(16));
  }
  const int16_t offset = one ? 0 : five ? 16 : 8;
  return _mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16(offset));
}

VNNI_FN void unpack_avx512(int qtype, const uint8_t* b, int16_t* w, Scales& s) {
  // bytes widened to int16 first, nibbles cut there: a byte's high nibble is its int16's value >> 4
  const __m512i lo4 = _mm512_set1_epi16(15);
  if (qtype == Q4_K || qtype == Q5_K) {
    bool five = qtype == Q5_K;
    s.d = f16c(rd16(b));
    s.dmin = f16c(rd16(b + 2));
    uint64_t sc8, m8;  // the minimums are read by unpack_groups_avx512
    kquant_scales8(b + 4, sc8, m8);
    const uint8_t* qs = b + (five ? 48 : 16);
    const __m512i one = _mm512_set1_epi16(1);
    __m512i vh = five ? _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(b + 16))) : _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
      __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(qs + 32 * c)));
      __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_srli_epi16(v, 4);
      if (five) {
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(vh, 2 * c), one), 4));
        hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(vh, 2 * c + 1), one), 4));
      }
      _mm512_storeu_si512(w + 64 * c, _mm512_mullo_epi16(lo, _mm512_set1_epi16((sc8 >> (16 * c)) & 0xff)));
      _mm512_storeu_si512(w + 64 * c + 32, _mm512_mullo_epi16(hi, _mm512_set1_epi16((sc8 >> (16 * c + 8)) & 0xff)));
    }
  } else if (qtype == Q6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    s.d = f16c(rd16(b + 208));
    const __m512i three = _mm512_set1_epi16(3), k32 = _mm512_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
      __m512i vh = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(qh + 32 * h)));
      __m512i v0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(ql + 64 * h)));
      __m512i v1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(ql + 64 * h + 32)));
      for (int sh = 0; sh < 4; sh++) {
        __m512i v = (sh & 1) ? v1 : v0;
        __m512i q = (sh >> 1) ? _mm512_srli_epi16(v, 4) : _mm512_and_si512(v, lo4);
        q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(vh, 2 * sh), three), 4));
        int e = 128 * h + 32 * sh;
        __m512i scv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sc[e / 16])),
                                         _mm256_set1_epi16(sc[e / 16 + 1]), 1);
        _mm512_storeu_si512(w + e, _mm512_mullo_epi16(_mm512_sub_epi16(q, k32), scv));
      }
    }
  } else {  // G = 32
    _mm512_storeu_si512(w, group32(qtype, b, s.d, s.m));
  }
}

VNNI_FN inline __attribute__((always_inline)) float tree16_avx512(__m512 a) {  // tree16, in registers
  __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // [t4_0 + t4_2, t4_1 + t4_3, ..]
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

VNNI_FN inline __attribute__((always_inline)) __m512 min_lanes_avx512(const float* mm, const float* xsd, int64_t S16) {
  __m512 mn = _mm512_setzero_ps();
  for (int64_t j = 0; j < S16; j += 16)
    mn = _mm512_add_ps(mn, _mm512_mul_ps(_mm512_loadu_ps(mm + j), _mm512_loadu_ps(xsd + j)));
  return mn;
}

// min_lanes_avx512 of 16 weight rows (mm16 [16][S16]) × M rows (xsd [M][S16]) into mn [16][M][16]: each pair the same
// steps in the same order, eight pairs' chains side by side (one pair alone is a chain of dependent adds: 18 at
// K = 8 960, a tenth of a 9-row pass's time on the Zen 5)
VNNI_FN void min_lanes16(const float* mm16, const float* xsd, int64_t S16, int64_t M, float* mn) {
  for (int64_t m = 0; m < M; m++)
    for (int j0 = 0; j0 < 16; j0 += 8) {
      __m512 a[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
      for (int64_t s = 0; s < S16; s += 16) {
        const __m512 x = _mm512_loadu_ps(xsd + m * S16 + s);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(_mm512_loadu_ps(mm16 + (j0 + j) * S16 + s), x));
      }
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++) _mm512_store_ps(mn + ((j0 + j) * M + m) * 16, a[j]);
    }
}

// unpack8_portable's values, a 64-position chunk a zmm: the file's 64-byte load of nibbles is one chunk as it is.
// load8 reads a group's bytes into registers, chunk8 makes chunk k's quants (Q6_K: q − 32, signed) and scales.
struct Raw8 {
  __m512i v0, v1;  // the nibbles: qs (Q4_K, Q5_K) or ql (Q6_K), bytes 0–63 and 64–127
  __m512i h0, h1;  // Q5_K: qh twice (h0); Q6_K: qh bytes 0–31 (h0) and 32–63 (h1), each twice
  __m512i scx;     // the sub-block scales as int16 (8 or 16)
  float d;
  __m128i sm;      // Q4_K/Q5_K: kquant_scales16 (bytes 8–15: the minimums m_j)
  __m128 dd;       // Q4_K/Q5_K: d, dmin
};

struct Index8 {  // the scale of positions 2i, 2i + 1 of chunk k: Q6_K sc[4k + i / 8], Q4_K/Q5_K sc[SB[2k + i / 16]]
  alignas(64) int16_t q6[4][32], q45[4][32];
  Index8() {
    for (int k = 0; k < 4; k++)
      for (int i = 0; i < 32; i++) q6[k][i] = (int16_t)(4 * k + i / 8), q45[k][i] = (int16_t)SB[2 * k + i / 16];
  }
};
const Index8 INDEX8;

VNNI_FN inline __m512i twice(const uint8_t* p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p)); }

template <int QT>
VNNI_FN inline __attribute__((always_inline)) Raw8 load8(const uint8_t* b) {
  Raw8 r;
  if constexpr (QT == Q6_K) {
    r.d = f16c(rd16(b + 208));
    r.scx = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 192))));
    r.v0 = _mm512_loadu_si512(b);
    r.v1 = _mm512_loadu_si512(b + 64);
    r.h0 = twice(b + 128);
    r.h1 = twice(b + 160);
  } else {
    const __m128i q = _mm_loadu_si128((const __m128i*)b);
    r.dd = _mm_cvtph_ps(q);  // d, dmin
    r.d = _mm_cvtss_f32(r.dd);
    r.sm = kquant_scales16(q);
    r.scx = _mm512_castsi128_si512(_mm_cvtepu8_epi16(r.sm));
    const uint8_t* qs = b + (QT == Q5_K ? 48 : 16);
    r.v0 = _mm512_loadu_si512(qs);
    r.v1 = _mm512_loadu_si512(qs + 64);
    r.h0 = QT == Q5_K ? twice(b + 16) : _mm512_setzero_si512();
    r.h1 = r.h0;
  }
  return r;
}

template <int QT>
VNNI_FN inline __attribute__((always_inline)) void chunk8(const Raw8& r, int k, __m512i& w, __m512i& s) {
  const __m512i lo4 = _mm512_set1_epi8(15);
  const __m512i v = k / 2 ? r.v1 : r.v0;
  w = _mm512_and_si512(k % 2 ? _mm512_srli_epi16(v, 4) : v, lo4);  // the nibble k % 2
  if constexpr (QT == Q6_K) {  // qh's bits 2·(2(k % 2) + h) in half h
    const long long a = 4 * (k % 2);
    const __m512i hb = _mm512_srlv_epi64(k / 2 ? r.h1 : r.h0, _mm512_set_epi64(a + 2, a + 2, a + 2, a + 2, a, a, a, a));
    w = _mm512_sub_epi8(_mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(3)), 4)),
                        _mm512_set1_epi8(32));  // q − 32, signed
    s = _mm512_permutexvar_epi16(_mm512_load_si512(INDEX8.q6[k]), r.scx);
  } else {
    if constexpr (QT == Q5_K) {  // sub-blocks SB[2k], SB[2k + 1]: the fifth bit of sub-block sb is bit sb of qh
      const long long a = SB[2 * k], c = SB[2 * k + 1];
      const __m512i hb = _mm512_srlv_epi64(r.h0, _mm512_set_epi64(c, c, c, c, a, a, a, a));
      w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(1)), 4));
    }
    s = _mm512_permutexvar_epi16(_mm512_load_si512(INDEX8.q45[k]), r.scx);
  }
}

template <int QT>
VNNI_FN void unpack8_avx512_t(const uint8_t* b, uint8_t* u, int16_t* s, float& d) {
  const Raw8 r = load8<QT>(b);
  d = r.d;
  for (int k = 0; k < 4; k++) {
    __m512i w, sc;
    chunk8<QT>(r, k, w, sc);
    _mm512_storeu_si512(u + 64 * k, w);
    _mm512_storeu_si512(s + 32 * k, sc);
  }
}

VNNI_FN void unpack8_avx512(int qtype, const uint8_t* b, uint8_t* u, int16_t* s, float& d) {
  if (qtype == Q6_K) unpack8_avx512_t<Q6_K>(b, u, s, d);
  else if (qtype == Q5_K) unpack8_avx512_t<Q5_K>(b, u, s, d);
  else unpack8_avx512_t<Q4_K>(b, u, s, d);
}

// Groups of one weight row, unpacked: G = 32: w int16 [K]; K-quants: u [groups · 256] and s [groups · 128] (a
// chunk of GROUP_CHUNK groups at a time), d [K / G], mm [S16] (the minimums dmin·m_j or m, zero past K / 32).
struct RowBuf {
  std::vector<int16_t> w, s;
  std::vector<uint8_t> u;
  std::vector<float> d, mm;
  RowBuf(const Call& c)
      : w(c.f.G == 32 ? c.K : 0), s(c.f.G == 256 ? GROUP_CHUNK * 128 : 0), u(c.f.G == 256 ? GROUP_CHUNK * 256 : 0),
        d(c.K / c.f.G), mm(c.S16) {}
};

// K-quants: groups [g0, g1) of weight row n into rb (u, s at g − g0; d and mm at g)
VNNI_FN void unpack_groups8_avx512(const Call& c, int64_t n, int64_t g0, int64_t g1, RowBuf& rb) {
  const uint8_t* row = c.w + n * c.row_bytes;
  const uint8_t* end = c.w + c.N * c.row_bytes;
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* b = row + g * c.f.block_bytes;
    prefetch(b, c.f.block_bytes, end);
    unpack8_avx512(c.qtype, b, rb.u.data() + (g - g0) * 256, rb.s.data() + (g - g0) * 128, rb.d[g]);
    if (c.f.kmin) {
      const __m128i q = _mm_loadu_si128((const __m128i*)b);
      mins8(kquant_scales16(q), _mm_cvtph_ps(q), rb.mm.data() + g * 8);
    }
  }
}

// G = 32: weight row n whole into rb (w, d, mm)
VNNI_FN void unpack_row_avx512(const Call& c, int64_t n, RowBuf& rb) {
  const uint8_t* row = c.w + n * c.row_bytes;
  for (int64_t g = 0; g < c.K / 32; g++) {
    Scales s;
    unpack_avx512(c.qtype, row + g * c.f.block_bytes, rb.w.data() + g * 32, s);
    rb.d[g] = s.d;
    if (c.f.lmin) rb.mm[g] = s.m;  // Q4_1, Q5_1: the minimum m_g (the others have none)
  }
}

// One chunk k of group g for NR weight rows × MR rows: is[r][i] += the pairs of weight chunk wv[r] and row i's x
// (u8 × s8 into int16: exact, |·| ≤ 2 · 31 · 127; Q6_K: x + 128 (xu, unsigned) times q − 32 (signed), |·| ≤
// 2 · 255 · 32) times their scales sv[r], into int32. Q6_K's 128 · Σ sc·(q − 32) is taken away per group (offset128).
template <int NR, int MR, bool Q6>
VNNI_FN inline __attribute__((always_inline)) void chunk_products(const __m512i* wv, const __m512i* sv,
                                                                  const int8_t* const* xr, const uint8_t* const* xu,
                                                                  int64_t g, int k, __m512i (&is)[NR][MR]) {
  for (int i = 0; i < MR; i++) {
    const __m512i xv = _mm512_loadu_si512(Q6 ? (const void*)(xu[i] + g * 256 + 64 * k) : (const void*)(xr[i] + g * 256 + 64 * k));
    for (int r = 0; r < NR; r++) {
      const __m512i pr = Q6 ? _mm512_maddubs_epi16(xv, wv[r]) : _mm512_maddubs_epi16(wv[r], xv);
      is[r][i] = _mm512_dpwssd_epi32(is[r][i], pr, sv[r]);
    }
  }
}

// Q6_K: what x + 128 adds to a chunk's lanes, 128 · Σ sc·(q − 32) over each lane's positions (the weights' alone)
VNNI_FN inline __attribute__((always_inline)) __m512i offset128(__m512i acc, __m512i wv, __m512i sv) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_set1_epi8((char)0x80), wv), sv);
}

// The group's float step (the top's acc_l): acc[r][i] += float(is[r][i]) · (d_r · dx of row m + i, group g)
template <int NR, int MR>
VNNI_FN inline __attribute__((always_inline)) void group_step(const Call& c, const float* d, int64_t m, int64_t g,
                                                              const __m512i (&is)[NR][MR], __m512 (&acc)[NR][MR]) {
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) {
      float sc = d[r] * c.dx[(m + i) * (c.K / 256) + g];
      acc[r][i] = _mm512_add_ps(acc[r][i], _mm512_mul_ps(_mm512_cvtepi32_ps(is[r][i]), _mm512_set1_ps(sc)));
    }
}

// NR weight rows × MR rows over groups [g0, g1) of a K-quant: the accumulators stay in registers across the groups,
// in accm [NR][ROW_TILE][16] between calls. Q6: x + 128 times q − 32, less offset128 once per group.
template <int NR, int MR, bool Q6>
VNNI_FN inline __attribute__((always_inline)) void micro8(const Call& c, RowBuf* const* rb, int64_t g0, int64_t g1,
                                                          int64_t m, int64_t mrow, float* accm) {
  const int64_t groups = c.K / 256;
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) acc[r][i] = _mm512_load_ps(accm + (r * ROW_TILE + mrow + i) * 16);
  const int8_t* xr[MR];
  const uint8_t* xu[MR];
  for (int i = 0; i < MR; i++) xr[i] = c.xq8 + (m + i) * c.K, xu[i] = Q6 ? c.xu + (m + i) * c.K : nullptr;
  // CH independent integer chains per accumulator (summed after: exact), so that a small tile is not bound by
  // vpdpwssd's latency
  constexpr int CH = NR * MR >= 8 ? 1 : NR * MR >= 4 ? 2 : 4;
  for (int64_t g = g0; g < g1; g++) {
    __m512i is[CH][NR][MR];
    for (int h = 0; h < CH; h++)
      for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) is[h][r][i] = _mm512_setzero_si512();
    __m512i off[NR];
    for (int r = 0; r < NR; r++) off[r] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
      __m512i wv[NR], sv[NR];
      for (int r = 0; r < NR; r++) {
        wv[r] = _mm512_loadu_si512(rb[r]->u.data() + (g - g0) * 256 + 64 * k);
        sv[r] = _mm512_loadu_si512(rb[r]->s.data() + (g - g0) * 128 + 32 * k);
        if constexpr (Q6) off[r] = offset128(off[r], wv[r], sv[r]);
      }
      chunk_products<NR, MR, Q6>(wv, sv, xr, xu, g, k, is[k % CH]);
    }
    for (int h = 1; h < CH; h++)
      for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) is[0][r][i] = _mm512_add_epi32(is[0][r][i], is[h][r][i]);
    if constexpr (Q6)
      for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) is[0][r][i] = _mm512_sub_epi32(is[0][r][i], off[r]);
    float d[NR];
    for (int r = 0; r < NR; r++) d[r] = rb[r]->d[g];
    group_step<NR, MR>(c, d, m, g, is[0], acc);
  }
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) _mm512_store_ps(accm + (r * ROW_TILE + mrow + i) * 16, acc[r][i]);
}

template <int NR, bool Q6>
VNNI_FN void rows8(const Call& c, RowBuf* const* rb, int64_t g0, int64_t g1, int64_t m0, int64_t m1, float* accm) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) micro8<NR, 4, Q6>(c, rb, g0, g1, m, m - m0, accm);
  switch (m1 - m) {
    case 3: micro8<NR, 3, Q6>(c, rb, g0, g1, m, m - m0, accm); break;
    case 2: micro8<NR, 2, Q6>(c, rb, g0, g1, m, m - m0, accm); break;
    case 1: micro8<NR, 1, Q6>(c, rb, g0, g1, m, m - m0, accm); break;
  }
}

template <int NR>
VNNI_FN void rows256(const Call& c, RowBuf* const* rb, int64_t g0, int64_t g1, int64_t m0, int64_t m1, float* accm) {
  if (c.qtype == Q6_K) rows8<NR, true>(c, rb, g0, g1, m0, m1, accm);
  else rows8<NR, false>(c, rb, g0, g1, m0, m1, accm);
}

// Small calls (M ≤ SMALL_ROWS): NR weight rows × MR rows over every group, each group unpacked in
// registers (load8, chunk8: the integers of the buffered path, no buffer) and its minimums into mm[r]; the float
// steps those of micro8, in the same order. The result in accm [NR][ROW_TILE][16].
template <int NR, int MR, int QT>
VNNI_FN void fused8(const Call& c, float* const* mm, int64_t n, int64_t m0, float* accm) {
  const int64_t groups = c.K / 256;
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();
  const int8_t* xr[MR];
  const uint8_t* xu[MR];
  for (int i = 0; i < MR; i++) xr[i] = c.xq8 + (m0 + i) * c.K, xu[i] = QT == Q6_K ? c.xu + (m0 + i) * c.K : nullptr;
  const uint8_t* row[NR];
  for (int r = 0; r < NR; r++) row[r] = c.w + (n + r) * c.row_bytes;
  const uint8_t* end = c.w + c.N * c.row_bytes;
  for (int64_t g = 0; g < groups; g++) {
    Raw8 raw[NR];
    for (int r = 0; r < NR; r++) {
      const uint8_t* b = row[r] + g * c.f.block_bytes;
      prefetch(b, c.f.block_bytes, end);
      raw[r] = load8<QT>(b);
      if constexpr (QT != Q6_K) mins8(raw[r].sm, raw[r].dd, mm[r] + g * 8);
    }
    __m512i is[NR][MR];  // one chain each: a group's sums do not wait for the last group's
    for (int r = 0; r < NR; r++)
      for (int i = 0; i < MR; i++) is[r][i] = _mm512_setzero_si512();
    __m512i off[NR];
    for (int r = 0; r < NR; r++) off[r] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
      __m512i wv[NR], sv[NR];
      for (int r = 0; r < NR; r++) {
        chunk8<QT>(raw[r], k, wv[r], sv[r]);
        if constexpr (QT == Q6_K) off[r] = offset128(off[r], wv[r], sv[r]);
      }
      chunk_products<NR, MR, QT == Q6_K>(wv, sv, xr, xu, g, k, is);
    }
    if constexpr (QT == Q6_K)
      for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) is[r][i] = _mm512_sub_epi32(is[r][i], off[r]);
    float d[NR];
    for (int r = 0; r < NR; r++) d[r] = raw[r].d;
    group_step<NR, MR>(c, d, m0, g, is, acc);
  }
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) _mm512_store_ps(accm + (r * ROW_TILE + m0 + i) * 16, acc[r][i]);
}

// Small calls, G = 32 (M ≤ SMALL_ROWS): NR weight rows × MR rows over every group, each group unpacked in registers
// and applied to every row (its minimums into rb's mm); the float steps those of tile_avx512's buffered loop, in the
// same order. The result in accm [NR][ROW_TILE][16].
template <int NR, int MR>
VNNI_FN void fused32(const Call& c, RowBuf* const* rb, int64_t n, int64_t m0, float* accm) {
  const int64_t groups = c.K / 32;
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();
  const uint8_t* end = c.w + c.N * c.row_bytes;
  for (int64_t g = 0; g < groups; g++) {
    __m512i w[NR];
    float d[NR];
    for (int r = 0; r < NR; r++) {
      const uint8_t* b = c.w + (n + r) * c.row_bytes + g * c.f.block_bytes;
      prefetch(b, c.f.block_bytes, end);
      float m = 0.f;
      w[r] = group32(c.qtype, b, d[r], m);
      if (c.f.lmin) rb[r]->mm[g] = m;
    }
    for (int i = 0; i < MR; i++) {
      const __m512i xv = _mm512_loadu_si512(c.xq + (m0 + i) * c.K + g * 32);
      const float dx = c.dx[(m0 + i) * groups + g];
      for (int r = 0; r < NR; r++) {
        const __m512i isum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w[r], xv);
        acc[r][i] = _mm512_add_ps(acc[r][i], _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d[r] * dx)));
      }
    }
  }
  for (int r = 0; r < NR; r++)
    for (int i = 0; i < MR; i++) _mm512_store_ps(accm + (r * ROW_TILE + m0 + i) * 16, acc[r][i]);
}

// Every row of the call in tiles of ≤ 8 rows, of sizes as equal as they can be
template <int NR>
VNNI_FN void small32(const Call& c, RowBuf* const* rb, int64_t n, float* accm) {
  const int64_t tiles = (c.M + 7) / 8;
  for (int64_t t = 0, m0 = 0; t < tiles; t++) {
    const int64_t mt = (c.M - m0) / (tiles - t);
    switch (mt) {
      case 1: fused32<NR, 1>(c, rb, n, m0, accm); break;
      case 2: fused32<NR, 2>(c, rb, n, m0, accm); break;
      case 3: fused32<NR, 3>(c, rb, n, m0, accm); break;
      case 4: fused32<NR, 4>(c, rb, n, m0, accm); break;
      case 5: fused32<NR, 5>(c, rb, n, m0, accm); break;
      case 6: fused32<NR, 6>(c, rb, n, m0, accm); break;
      case 7: fused32<NR, 7>(c, rb, n, m0, accm); break;
      default: fused32<NR, 8>(c, rb, n, m0, accm); break;
    }
    m0 += mt;
  }
}

// One weight row at a time (with two, their registers spill to the stack: slower), rows [m0, m0 + mt), mt ≤ 12;
// Q6_K's tiles stop at 8 (past 8 its registers spill: 9 and 12 rows ran 0.8x; Q4_K's 12 ran 1.06x 5 + 4)
constexpr int TILE_ROWS = 12, TILE_ROWS_Q6 = 8;

template <int QT>
VNNI_FN void small8_t(const Call& c, float* const* mm, int64_t n, int64_t m0, int64_t mt, float* accm) {
  switch (mt) {
    case 1: return fused8<1, 1, QT>(c, mm, n, m0, accm);
    case 2: return fused8<1, 2, QT>(c, mm, n, m0, accm);
    case 3: return fused8<1, 3, QT>(c, mm, n, m0, accm);
    case 4: return fused8<1, 4, QT>(c, mm, n, m0, accm);
    case 5: return fused8<1, 5, QT>(c, mm, n, m0, accm);
    case 6: return fused8<1, 6, QT>(c, mm, n, m0, accm);
    case 7: return fused8<1, 7, QT>(c, mm, n, m0, accm);
    case 8: return fused8<1, 8, QT>(c, mm, n, m0, accm);
  }
  if constexpr (QT != Q6_K) {
    switch (mt) {
      case 9: return fused8<1, 9, QT>(c, mm, n, m0, accm);
      case 10: return fused8<1, 10, QT>(c, mm, n, m0, accm);
      case 11: return fused8<1, 11, QT>(c, mm, n, m0, accm);
      case 12: return fused8<1, 12, QT>(c, mm, n, m0, accm);
    }
  }
}

// Every row of the call, in as few tiles of ≤ TILE_ROWS (Q6_K: TILE_ROWS_Q6) rows as there can be, of sizes as
// equal as they can be (Q6_K, 9 rows: 5 + 4)
VNNI_FN void small8(const Call& c, float* mm, int64_t n, float* accm) {
  const int most = c.qtype == Q6_K ? TILE_ROWS_Q6 : TILE_ROWS;
  const int64_t tiles = (c.M + most - 1) / most;
  for (int64_t t = 0, m0 = 0; t < tiles; t++) {
    const int64_t mt = (c.M - m0) / (tiles - t);
    float* const one[1] = {mm};
    if (c.qtype == Q6_K) small8_t<Q6_K>(c, one, n, m0, mt, accm);
    else if (c.qtype == Q5_K) small8_t<Q5_K>(c, one, n, m0, mt, accm);
    else small8_t<Q4_K>(c, one, n, m0, mt, accm);
    m0 += mt;
  }
}

// tree16 of each of 16 vectors, in vector lanes: lane j = tree16(a[j]) (the same adds of the same pairs)
VNNI_FN inline __attribute__((always_inline)) __m512 tree16x16(const __m512 (&a)[16]) {
  __m512 b[8], t[4], u[2];
  for (int s = 0; s < 8; s++)  // rows 2s, 2s + 1: lanes l + l + 8, by halves
    b[s] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * s], a[2 * s + 1], 0x44), _mm512_shuffle_f32x4(a[2 * s], a[2 * s + 1], 0xEE));
  for (int s = 0; s < 4; s++)  // rows 4s .. 4s + 3, a 128-bit lane each: + 4
    t[s] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * s], b[2 * s + 1], 0x88), _mm512_shuffle_f32x4(b[2 * s], b[2 * s + 1], 0xDD));
  for (int s = 0; s < 2; s++)  // + 2: 128-bit lane q holds rows 8s + q and 8s + 4 + q
    u[s] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * s], t[2 * s + 1], 0x44), _mm512_shuffle_ps(t[2 * s], t[2 * s + 1], 0xEE));
  // + 1: element 4q + i holds row 4i + q
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), e);
}

// K-quants' outputs n .. n + 15 of every row (finish_rows' steps, 16 weight rows in vector lanes), from acc
// [16][M][16] and (Q4_K, Q5_K) the minimums' lanes mn [16][M][16] (min_lanes_avx512's)
VNNI_FN void finish16(const Call& c, const float* mn, int64_t n, const float* acc) {
  for (int64_t m = 0; m < c.M; m++) {
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_load_ps(acc + (j * c.M + m) * 16);
    __m512 y = tree16x16(a);
    if (c.f.kmin) {
      for (int j = 0; j < 16; j++) a[j] = _mm512_load_ps(mn + (j * c.M + m) * 16);
      y = _mm512_sub_ps(y, tree16x16(a));
    }
    if (c.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(c.bias + n));
    if (c.yb) _mm256_storeu_si256((__m256i*)(c.yb + m * c.N + n), bf16_c10(y));
    else _mm512_storeu_ps(c.y + m * c.N + n, y);
  }
}

// The minimums and the trees of weight row n for rows [m0, m1), from acc [ROW_TILE][16]
VNNI_FN void finish_rows(const Call& c, const RowBuf& rb, int64_t n, int64_t m0, int64_t m1, const float* acc) {
  for (int64_t m = m0; m < m1; m++) {
    float ymn = 0.f;
    if (c.f.kmin || c.f.lmin) ymn = tree16_avx512(min_lanes_avx512(rb.mm.data(), c.xsd + m * c.S16, c.S16));
    put(c, m * c.N + n, finish(c, tree16_avx512(_mm512_load_ps(acc + (m - m0) * 16)), ymn, n));
  }
}

// Weight rows n .. n+NR−1 for rows m0 .. m1: groups a chunk at a time (the unpacked chunk stays in L1), then the
// minimums and the trees.
template <int NR>
VNNI_FN void rows_kquant(const Call& c, RowBuf* const* rb, int64_t n, int64_t m0, int64_t m1, float* accm) {
  const int64_t groups = c.K / 256;
  for (int r = 0; r < NR; r++)
    for (int64_t i = 0; i < m1 - m0; i++) _mm512_store_ps(accm + (r * ROW_TILE + i) * 16, _mm512_setzero_ps());
  for (int64_t g0 = 0; g0 < groups; g0 += GROUP_CHUNK) {
    const int64_t g1 = std::min<int64_t>(groups, g0 + GROUP_CHUNK);
    for (int r = 0; r < NR; r++) unpack_groups8_avx512(c, n + r, g0, g1, *rb[r]);
    rows256<NR>(c, rb, g0, g1, m0, m1, accm);
  }
  for (int r = 0; r < NR; r++) finish_rows(c, *rb[r], n + r, m0, m1, accm + r * ROW_TILE * 16);
}

// K-quants, many rows (a prompt): every weight row of the tile unpacked a chunk of groups at a time (in L2), applied
// to 64 rows before the next chunk, so that each chunk of x is read from L2 once per weight pair, not the whole of x
// from memory. Each output's float steps are the same as rows_kquant's, in the same order.
VNNI_FN void tile_kquant_many_avx512(const Call& c, int64_t n0, int64_t n1) {
  const int64_t groups = c.K / 256, nt = n1 - n0;
  std::vector<RowBuf> rbs;
  rbs.reserve(nt);
  for (int64_t r = 0; r < nt; r++) rbs.emplace_back(c);
  std::vector<float> accv(nt * ROW_TILE * 16 + 16);
  float* acc = (float*)(((uintptr_t)accv.data() + 63) & ~(uintptr_t)63);  // [nt][ROW_TILE][16], 64-byte aligned
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t m1 = std::min<int64_t>(c.M, m0 + ROW_TILE);
    std::fill(acc, acc + nt * ROW_TILE * 16, 0.f);
    for (int64_t g0 = 0; g0 < groups; g0 += GROUP_CHUNK) {
      const int64_t g1 = std::min<int64_t>(groups, g0 + GROUP_CHUNK);
      for (int64_t r = 0; r < nt; r++) unpack_groups8_avx512(c, n0 + r, g0, g1, rbs[r]);
      int64_t r = 0;
      for (; r + 2 <= nt; r += 2) {
        RowBuf* two[2] = {&rbs[r], &rbs[r + 1]};
        rows256<2>(c, two, g0, g1, m0, m1, acc + r * ROW_TILE * 16);
      }
      if (r < nt) {
        RowBuf* one[1] = {&rbs[r]};
        rows256<1>(c, one, g0, g1, m0, m1, acc + r * ROW_TILE * 16);
      }
    }
    for (int64_t r = 0; r < nt; r++) finish_rows(c, rbs[r], n0 + r, m0, m1, acc + r * ROW_TILE * 16);
  }
}

VNNI_FN void tile_avx512(const Call& c, int64_t n0, int64_t n1) {
  if (c.f.G == 256 && c.M > MANY_ROWS) {  // NB weight rows unpacked together at a time
    for (int64_t a = n0; a < n1; a += NB) tile_kquant_many_avx512(c, a, std::min(n1, a + NB));
    return;
  }
  const int64_t groups = c.K / c.f.G;
  RowBuf b0(c), b1(c);
  RowBuf* rb[2] = {&b0, &b1};
  alignas(64) float accm[2 * ROW_TILE * 16];  // [NR][ROW_TILE] zmm
  alignas(64) float acc16[16 * SMALL_ROWS * 16];  // [16][M][16]: 16 weight rows' (finish16)
  alignas(64) float mn16[16 * SMALL_ROWS * 16];  // [16][M][16]: their minimums' lanes
  std::vector<float> mm16(c.f.kmin && c.M <= SMALL_ROWS ? 16 * c.S16 : 0);  // [16][S16]: their minimums, 0 past K / 32
  for (int64_t m0 = 0; m0 < c.M; m0 += ROW_TILE) {
    const int64_t m1 = std::min<int64_t>(c.M, m0 + ROW_TILE);
    if (c.f.G == 256 && c.M <= SMALL_ROWS) {  // 16 weight rows at a time, finished together; the rest alone
      int64_t n = n0;
      for (; n + 16 <= n1; n += 16) {
        for (int j = 0; j < 16; j++) small8(c, c.f.kmin ? mm16.data() + j * c.S16 : b0.mm.data(), n + j, acc16 + j * c.M * 16);
        if (c.f.kmin) min_lanes16(mm16.data(), c.xsd, c.S16, c.M, mn16);
        finish16(c, mn16, n, acc16);
      }
      for (; n < n1; n++) {
        small8(c, b0.mm.data(), n, accm);
        finish_rows(c, b0, n, 0, c.M, accm);
      }
      continue;
    }
    if (c.f.G == 256) {
      int64_t n = n0;
      for (; n + 2 <= n1; n += 2) rows_kquant<2>(c, rb, n, m0, m1, accm);
      if (n < n1) rows_kquant<1>(c, rb, n, m0, m1, accm);
      continue;
    }
    if (c.M == 1) {  // G = 32, a step: one weight row at a time (two: Q8_0's `down` 0.83 against 0.38 ms on a Zen 5)
      for (int64_t n = n0; n < n1; n++) {
        small32<1>(c, rb, n, accm);
        finish_rows(c, b0, n, 0, c.M, accm);
      }
      continue;
    }
    if (c.M <= SMALL_ROWS) {  // G = 32, a pass's rows: two weight rows at a time, in registers
      int64_t n = n0;
      for (; n + 2 <= n1; n += 2) {
        small32<2>(c, rb, n, accm);
        finish_rows(c, b0, n, 0, c.M, accm);
        finish_rows(c, b1, n + 1, 0, c.M, accm + ROW_TILE * 16);
      }
      if (n < n1) {
        small32<1>(c, rb, n, accm);
        finish_rows(c, b0, n, 0, c.M, accm);
      }
      continue;
    }
    for (int64_t n = n0; n < n1; n++) {  // G = 32: a group is one chunk
      unpack_row_avx512(c, n, b0);
      for (int64_t m = m0; m < m1; m++) {
        const int16_t* x = c.xq + m * c.K;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; g++) {
          __m512i isum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(b0.w.data() + g * 32),
                                             _mm512_loadu_si512(x + g * 32));
          float sc = b0.d[g] * c.dx[m * groups + g];
          acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(sc)));
        }
        _mm512_store_ps(accm + (m - m0) * 16, acc);
      }
      finish_rows(c, b0, n, m0, m1, accm);
    }
  }
}

// The activations' quantisation with AVX-512 (same values as the portable one: max, one fp32 multiply, rint).
template <typename T>
VNNI_FN void quantize_row_avx512(const T* x, int64_t K, int G, int16_t* xq, float* dx, float* xsd) {
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
      _mm256_storeu_si256((__m256i*)(xq + g * G + i), _mm512_cvtepi32_epi16(a));
      _mm256_storeu_si256((__m256i*)(xq + g * G + i + 16), _mm512_cvtepi32_epi16(b));
      xsd[(g * G + i) / 32] = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(a, b)) * dx[g];
    }
  }
  for (int64_t j = K / 32; j < s16(K); j++) xsd[j] = 0.f;
}

// 32 values v[0..1] times iv, rint (the default rounding: to nearest, ties to even) within ±127, stored in order as
// int8 at q -> their sum
VNNI_FN inline __attribute__((always_inline)) int32_t round32_avx512(const __m512* v, __m512 iv, int8_t* q) {
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  __m512i a[2];
  for (int h = 0; h < 2; h++) {
    a[h] = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[h], iv)), lim), nlim);
    _mm_storeu_si128((__m128i*)(q + 16 * h), _mm512_cvtepi32_epi8(a[h]));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(a[0], a[1]));
}

// quantize_row8_portable's values with AVX-512
template <typename T>
VNNI_FN void quantize_row8_avx512(const T* x, int64_t K, int qtype, int8_t* xq, float* dx, float* xsd, uint8_t* xu) {
  alignas(64) float buf[256];
  for (int64_t g = 0; g < K / 256; g++) {
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < 256; i += 16) {
      __m512 v;
      if constexpr (std::is_same_v<T, float>) {
        v = _mm512_loadu_ps(x + g * 256 + i);
      } else {  // bf16: the upper half of an fp32
        v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + g * 256 + i))), 16));
      }
      _mm512_store_ps(buf + i, v);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    float amax = _mm512_reduce_max_ps(mx);
    float inv = amax > 0.f ? 127.f / amax : 0.f;
    dx[g] = amax / 127.f;
    const __m512 iv = _mm512_set1_ps(inv);
    for (int j = 0; j < 8; j++) {
      const __m512 v[2] = {_mm512_load_ps(buf + 32 * j), _mm512_load_ps(buf + 32 * j + 16)};
      xsd[g * 8 + j] = (float)round32_avx512(v, iv, xq + g * 256 + 32 * sub_slot(qtype, j)) * dx[g];
    }
    if (xu)  // Q6_K: x + 128 as unsigned bytes (the sign bit flipped)
      for (int k = 0; k < 4; k++)
        _mm512_storeu_si512(xu + g * 256 + 64 * k,
                            _mm512_xor_si512(_mm512_loadu_si512(xq + g * 256 + 64 * k), _mm512_set1_epi8((char)0x80)));
  }
  for (int64_t j = K / 32; j < s16(K); j++) xsd[j] = 0.f;
}

// Weight rows [n0, n1) as the fp32 values the file means (dequantize, below): d·w − dmin·m_j, d·w + m, or d·w;
// into out [N, K] fp32, or bf16 (T = uint16_t) rounded to nearest, ties to even (torch's .to(bfloat16)).
template <typename T>
VNNI_FN void dequantize_rows_avx512(const Call& c, int64_t n0, int64_t n1, T* out) {
  alignas(64) int16_t w[256];
  const int G = c.f.G;
  const bool kmin = c.f.kmin, lmin = c.f.lmin;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t g = 0; g < c.K / G; g++) {
      const uint8_t* b = c.w + n * c.row_bytes + g * c.f.block_bytes;
      Scales s;
      unpack_avx512(c.qtype, b, w, s);
      if (kmin) kquant_scales(b + 4, s.sc, s.mins);
      T* o = out + n * c.K + g * G;
      const __m512 d = _mm512_set1_ps(s.d);
      for (int i = 0; i < G; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_load_si256((const __m256i*)(w + i)))), d);
        if (kmin) v = _mm512_sub_ps(v, _mm512_set1_ps(s.dmin * (float)s.mins[i / 32]));
        else if (lmin) v = _mm512_add_ps(v, _mm512_set1_ps(s.m));
        if constexpr (std::is_same_v<T, float>) _mm512_storeu_ps(o + i, v);
        else _mm256_storeu_si256((__m256i*)(o + i), bf16_rne(v));
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

// Every row's activations (see the top) into the buffers c reads: G = 32 into xq, the K-quants into xq8 (and x32
// for Q6_K, or xu on AVX-512: it may be xq8 itself, each chunk flipped after it is written), and dx, xsd
template <typename T>
void quantize_rows_t(const T* x, const Call& c, int path, int16_t* xq, int8_t* xq8, int16_t* x32, uint8_t* xu,
                     float* dx, float* xsd) {
  const int64_t K = c.K, G = c.f.G;
  at::parallel_for(0, c.M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      float *dxm = dx + m * (K / G), *xsdm = xsd + m * c.S16;
      if (G == 256) {
        int16_t* x32m = x32 ? x32 + m * (K / 2) : nullptr;
#if QMM_X86
        if (path == AVX512VNNI) {
          quantize_row8_avx512<T>(x + m * K, K, c.qtype, xq8 + m * K, dxm, xsdm, xu ? xu + m * K : nullptr);
          continue;
        }
        if (path == AVX2) {
          quantize_row8_avx2<T>(x + m * K, K, c.qtype, xq8 + m * K, dxm, xsdm, x32m);
          continue;
        }
#endif
        quantize_row8_portable<T>(x + m * K, K, c.qtype, xq8 + m * K, dxm, xsdm, x32m);
        continue;
      }
#if QMM_X86
      if (path == AVX512VNNI) { quantize_row_avx512<T>(x + m * K, K, (int)G, xq + m * K, dxm, xsdm); continue; }
#endif
      quantize_row_portable<T>(x + m * K, K, (int)G, xq + m * K, dxm, xsdm);
    }
  });
}

// quantize_rows_t for x [M, K] fp32 or bf16
void quantize_rows(const torch::Tensor& x, const Call& c, int path, int16_t* xq, int8_t* xq8, int16_t* x32, uint8_t* xu,
                   float* dx, float* xsd) {
  if (x.scalar_type() == at::kFloat) quantize_rows_t<float>(x.data_ptr<float>(), c, path, xq, xq8, x32, xu, dx, xsd);
  else quantize_rows_t<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), c, path, xq, xq8, x32, xu, dx, xsd);
}

// What mm and mm_prompt check and prepare alike: x as [M, K] (contiguous, fp32 or bf16), the output's shape [..., N],
// the bias in fp32 (or undefined)
struct Operands {
  Format f;
  int64_t row_bytes, M;
  torch::Tensor x, bias;
  std::vector<int64_t> shape;
};

// f(a, e) over [0, n) in chunks of about n / (8 · threads), multiples of `unit`, handed to the threads as they come
// free (one atomic counter): a core slowed by a neighbour's process takes fewer chunks instead of holding up the call
// (OpenMP's even split waited for it: with a neighbour taking 30 % of a core, 501-row products gained up to 1.24×,
// benchmarks/README.md). Each chunk is computed whole by one thread, so the values do not depend on the split.
template <typename F>
void chunks(int64_t n, int64_t unit, const F& f) {
  const int64_t threads = at::get_num_threads();
  const int64_t size = std::max<int64_t>(1, n / (8 * threads * unit)) * unit;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t a; (a = next.fetch_add(size)) < n;) f(a, std::min(n, a + size));
  });
}

void check_packed(const char* who, const torch::Tensor& p, int64_t qtype, int64_t N, int64_t K);  // with pack, below

// w: the file's blocks [N, row_bytes], or (packed) pack()'s form of them
Operands operands(const char* who, torch::Tensor x, const torch::Tensor& w, int64_t qtype, int64_t N, int64_t K,
                  const c10::optional<torch::Tensor>& bias, bool packed = false) {
  Operands o{format_of(qtype), 0, 0, {}, {}, {}};
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, who, ": x must be [..., K]");
  TORCH_CHECK(K % o.f.G == 0, who, ": K = ", K, " is not a multiple of ", o.f.G);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, who, ": x must be fp32 or bf16");
  o.row_bytes = K / o.f.G * o.f.block_bytes;
  if (packed) check_packed(who, w, qtype, N, K);
  else TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() == N * o.row_bytes,
                   who, ": w must hold N · ", o.row_bytes, " contiguous bytes");
  o.shape = x.sizes().vec();
  o.shape.back() = N;
  o.x = x.reshape({-1, K}).contiguous();
  o.M = o.x.size(0);
  if (bias && bias->defined()) {
    o.bias = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(o.bias.numel() == N, who, ": bias must be [N]");
  }
  return o;
}

// y = x · Wᵀ (+ bias). x [..., K] fp32 or bf16 (M rows); w [N, row_bytes] uint8 (the file's blocks, row after
// row); bias [N] fp32 or undefined; path 0 = the best this CPU has. -> [..., N] in x's dtype.
torch::Tensor mm(torch::Tensor x, torch::Tensor w, int64_t qtype, int64_t N, int64_t K,
                 c10::optional<torch::Tensor> bias, int64_t path) {
  const Operands o = operands("qmatmul", x, w, qtype, N, K, bias);
  const Format f = o.f;
  const int64_t M = o.M;
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "qmatmul: path ", path, " does not run on this CPU");
  auto out = torch::empty(o.shape, o.x.options());  // x's dtype: bf16 written by put(), rounded as torch rounds
  if (M == 0 || N == 0) return out;
  const bool bf16 = o.x.scalar_type() == at::kBFloat16;
  const bool k8 = f.G == 256;
  const bool q6_wide = qtype == Q6_K && path == AVX512VNNI;  // xu, else x32 (see Call)
  std::vector<int16_t> xq(k8 ? 0 : M * K), x32(qtype == Q6_K && !q6_wide ? M * K / 2 : 0);
  std::vector<int8_t> xq8(k8 ? M * K : 0);
  std::vector<uint8_t> xu(q6_wide ? M * K : 0);
  std::vector<float> dx(M * (K / f.G));
  std::vector<float> xsd(M * s16(K));
  int16_t* x32p = x32.empty() ? nullptr : x32.data();
  uint8_t* xup = xu.empty() ? nullptr : xu.data();
  Call c{w.data_ptr<uint8_t>(), N, K, M, o.row_bytes, s16(K), (int)qtype, f, xq.data(), xq8.data(),
         x32p, xup, dx.data(), xsd.data(), o.bias.defined() ? o.bias.data_ptr<float>() : nullptr,
         bf16 ? nullptr : out.data_ptr<float>(), bf16 ? (uint16_t*)out.data_ptr<at::BFloat16>() : nullptr};
  quantize_rows(o.x, c, (int)path, xq.data(), xq8.data(), x32p, xup, dx.data(), xsd.data());
  chunks(N, NB, [&](int64_t n0, int64_t n1) {  // a chunk's buffers made once (made every NB rows: 1/5 of a gate/up)
#if QMM_X86
    if (path == AVX512VNNI) return tile_avx512(c, n0, n1);
    if (path == AVX2) return tile_avx2(c, n0, n1);
#endif
    tile_portable(c, n0, n1);
  });
  return out;
}

// The weights as the file means them, into out [N, K] fp32 or bf16 (for a prompt's prefill: GgufLinear). Exact
// products, one rounding for the K-quants' minimum: the values of gguf_blocks.dequantize, then (bf16) rounded to
// nearest, ties to even, as torch's .to(bfloat16) rounds them.
template <typename T>
void dequantize_into(const Call& c, T* o, int path) {
  at::parallel_for(0, c.N, 16, [&](int64_t n0, int64_t n1) {
#if QMM_X86
    if (path == AVX512VNNI) {
      dequantize_rows_avx512<T>(c, n0, n1, o);
      return;
    }
#endif
    alignas(64) int16_t q[256];
    for (int64_t n = n0; n < n1; n++)
      for (int64_t g = 0; g < c.K / c.f.G; g++) {
        Scales s;
        unpack_portable(c.qtype, c.w + n * c.row_bytes + g * c.f.block_bytes, q, s);
        for (int i = 0; i < c.f.G; i++) {
          float v = (float)q[i] * s.d;
          if (c.f.kmin) v = v - s.dmin * (float)s.mins[i / 32];
          else if (c.f.lmin) v = v + s.m;
          if constexpr (std::is_same_v<T, float>) o[n * c.K + g * c.f.G + i] = v;
          else o[n * c.K + g * c.f.G + i] = c10::BFloat16(v).x;  // c10's conversion: to nearest, ties to even
        }
      }
  });
}

void dequantize(torch::Tensor w, int64_t qtype, int64_t N, int64_t K, torch::Tensor out, int64_t path) {
  const Format f = format_of(qtype);
  TORCH_CHECK(K % f.G == 0, "qmatmul: K = ", K, " is not a multiple of ", f.G);
  const int64_t row_bytes = K / f.G * f.block_bytes;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() == N * row_bytes,
              "qmatmul: w must hold N · ", row_bytes, " contiguous bytes");
  TORCH_CHECK(out.is_contiguous() && out.numel() == N * K &&
              (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "qmatmul: out must be a contiguous [N, K] fp32 or bf16 tensor");
  Call c{w.data_ptr<uint8_t>(), N, K, 0, row_bytes, s16(K), (int)qtype, f, nullptr, nullptr, nullptr, nullptr, nullptr,
         nullptr, nullptr, nullptr};
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= PORTABLE && path <= best_path(), "qmatmul: path ", path, " does not run on this CPU");
  if (out.scalar_type() == at::kFloat) dequantize_into<float>(c, out.data_ptr<float>(), (int)path);
  else dequantize_into<uint16_t>(c, (uint16_t*)out.data_ptr<c10::BFloat16>(), (int)path);
}


#if QMM_X86
// ---------------------------------------------------------------------------------------------------------------
// A prompt's product (many rows; the K-quants on AVX-512 VNNI): y = x · Wᵀ with x quantized as mm quantizes it
// (int8 per 256, the kernel order), and a zmm's 16 lanes 16 outputs: the quants of 16 weight rows interleaved 4 at a
// time, [K / 4][16][4], times 4 bytes of a row of x broadcast (vpdpbusd: 64 products an instruction, exact; the
// quants unsigned, Q6_K's q − 32 signed and x + 128 unsigned), a slot's int32 sums (32 positions, Q6_K 16) then
// times the slot's scale in fp32, a group's times dx; the minimums (Q6_K: the 128 of x + 128, a group's) after the
// groups. Twice the products an instruction of mm's pairs (vpmaddubsw,
// vpdpwssd), which suit a few rows but not hundreds. Its float order is not mm's: a prompt's rows go through it
// alone, and every mode prefills the same way.

struct Packed {  // weight rows n0 .. n0 + 16 of a call
  std::vector<uint8_t, Aligned64<uint8_t>> q;  // [K / 4][16][4]: 4 quants of each row in turn (Q6_K: q − 32, signed)
  std::vector<float> s;     // [slots][16]: the scale of slot j (Q4_K: d·sc_SB[j mod 8], 32 positions; Q6_K: d·sc_j, 16)
  std::vector<float> mn;    // Q4_K, Q5_K: [K / 32][16] dmin·m_j; Q6_K: [K / 256][16] (pack16); taken away
  std::vector<uint8_t> rows;  // [16][K]: the rows' quants before interleaving
  Packed(int64_t K, int slot) : q(K * 16), s(K / slot * 16), mn(K / 32 * 16), rows(16 * K) {}
};

// Row n's scales and minimums in group g into p (see Packed), from its block b, its d and its 256 quants as Packed
// holds them (q, Q6_K: q − 32): the same for AVX-512 and AVX2
template <int QT>
void pack_scales(const uint8_t* b, float d, const uint8_t* quants, int n, int64_t g, Packed& p) {
  if constexpr (QT == Q6_K) {  // mn: what x + 128 adds, 128 · d · Σ sc_j · Σ (q − 32) (the integer exact)
    const int8_t* s6 = (const int8_t*)(b + 192);
    const int8_t* q = (const int8_t*)quants;
    int32_t sum = 0;
    for (int j = 0; j < 16; j++) {
      p.s[(g * 16 + j) * 16 + n] = d * (float)s6[j];
      int32_t t = 0;
      for (int i = 0; i < 16; i++) t += q[16 * j + i];
      sum += (int32_t)s6[j] * t;
    }
    p.mn[g * 16 + n] = 128.f * d * (float)sum;
  } else {
    int16_t sc[8];
    int32_t mn[8];
    kquant_scales(b + 4, sc, mn);
    const float dmin = fp16_to_fp32(rd16(b + 2));
    for (int j = 0; j < 8; j++) {
      p.s[(g * 8 + j) * 16 + n] = d * (float)sc[SB[j]];  // slot j holds sub-block SB[j]
      p.mn[(g * 8 + j) * 16 + n] = dmin * (float)mn[j];  // natural j
    }
  }
}

template <int QT>
VNNI_FN void pack16(const Call& c, int64_t n0, Packed& p) {
  const int64_t groups = c.K / 256;
  for (int n = 0; n < 16; n++) {
    const uint8_t* row = c.w + (n0 + n) * c.row_bytes;
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* b = row + g * c.f.block_bytes;
      const Raw8 r = load8<QT>(b);
      for (int k = 0; k < 4; k++) {
        __m512i w, sc;
        chunk8<QT>(r, k, w, sc);
        _mm512_storeu_si512(p.rows.data() + n * c.K + g * 256 + 64 * k, w);
      }
      pack_scales<QT>(b, r.d, p.rows.data() + n * c.K + g * 256, n, g, p);
    }
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)c.K));
  for (int64_t k4 = 0; k4 < c.K / 4; k4++)  // the 16 rows' 4 bytes at k4: one gather
    _mm512_storeu_si512(p.q.data() + k4 * 64, _mm512_i32gather_epi32(idx, p.rows.data() + 4 * k4, 1));
}

// R rows × NB blocks of 16 outputs, into y [M, N] fp32 (O = float) or bf16 (O = uint16_t, rounded as torch rounds)
template <int QT, int R, int NB, typename O>
VNNI_FN void prompt_tile(const Call& c, const Packed* const* p, const int8_t* xq, const float* dx, const float* xm,
                         int64_t S, int64_t xs, int64_t m0, int64_t n0, O* y) {
  constexpr int SLOT = QT == Q6_K ? 16 : 32, SLOTS = 256 / SLOT;
  const int64_t groups = c.K / 256;
  __m512 acc[R][NB];  // in memory: touched once a group (the registers hold ia and gacc)
  for (int r = 0; r < R; r++)
    for (int b = 0; b < NB; b++) acc[r][b] = _mm512_setzero_ps();
  const int8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xq + (m0 + r) * c.K;
  for (int64_t g = 0; g < groups; g++) {
    __m512 gacc[R][NB];
    for (int r = 0; r < R; r++)
      for (int b = 0; b < NB; b++) gacc[r][b] = _mm512_setzero_ps();
    for (int j = 0; j < SLOTS; j++) {
      __m512i ia[R][NB];
      for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) ia[r][b] = _mm512_setzero_si512();
      const int64_t k40 = (g * 256 + j * SLOT) / 4;
      for (int t = 0; t < SLOT / 4; t++) {
        __m512i w[NB];
        for (int b = 0; b < NB; b++) w[b] = _mm512_loadu_si512(p[b]->q.data() + (k40 + t) * 64);
        for (int r = 0; r < R; r++) {
          int32_t xv;
          std::memcpy(&xv, xr[r] + 4 * (k40 + t), 4);
          const __m512i xb = _mm512_set1_epi32(xv);
          for (int b = 0; b < NB; b++)  // Q6_K: x + 128 unsigned, q − 32 signed; else the quants unsigned
            ia[r][b] = QT == Q6_K ? _mm512_dpbusd_epi32(ia[r][b], xb, w[b]) : _mm512_dpbusd_epi32(ia[r][b], w[b], xb);
        }
      }
      for (int b = 0; b < NB; b++) {
        const __m512 s = _mm512_loadu_ps(p[b]->s.data() + (g * SLOTS + j) * 16);
        for (int r = 0; r < R; r++) gacc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][b]), s, gacc[r][b]);
      }
    }
    for (int r = 0; r < R; r++) {
      const __m512 d = _mm512_set1_ps(dx[(m0 + r) * groups + g]);
      for (int b = 0; b < NB; b++) acc[r][b] = _mm512_fmadd_ps(gacc[r][b], d, acc[r][b]);
    }
  }
  for (int64_t j = 0; j < S; j++)  // the minimums (Q6_K: the 128 of x + 128 a group), j natural
    for (int b = 0; b < NB; b++) {
      const __m512 mv = _mm512_loadu_ps(p[b]->mn.data() + j * 16);
      for (int r = 0; r < R; r++) acc[r][b] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(xm[(m0 + r) * xs + j]), acc[r][b]);
    }
  for (int r = 0; r < R; r++)
    for (int b = 0; b < NB; b++) {
      __m512 v = acc[r][b];
      if (c.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(c.bias + n0 + 16 * b));
      if constexpr (std::is_same_v<O, float>) _mm512_storeu_ps(y + (m0 + r) * c.N + n0 + 16 * b, v);
      else _mm256_storeu_si256((__m256i*)(y + (m0 + r) * c.N + n0 + 16 * b), bf16_rne(v));
    }
}

template <int QT, int NB, typename O>
VNNI_FN void prompt_rows(const Call& c, const Packed* const* p, const int8_t* xq, const float* dx, const float* xm,
                         int64_t S, int64_t xs, int64_t n0, O* y) {
  int64_t m = 0;
  for (; m + 6 <= c.M; m += 6) prompt_tile<QT, 6, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y);
  switch (c.M - m) {
    case 5: prompt_tile<QT, 5, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y); break;
    case 4: prompt_tile<QT, 4, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y); break;
    case 3: prompt_tile<QT, 3, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y); break;
    case 2: prompt_tile<QT, 2, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y); break;
    case 1: prompt_tile<QT, 1, NB, O>(c, p, xq, dx, xm, S, xs, m, n0, y); break;
  }
}

template <int QT>
VNNI_FN void unpack16(const Call& c, const uint8_t* pk, int64_t b, Packed& p);  // below, with pack's form

// pk: pack()'s form of the weights (Q4_K, Q6_K), read in place of the file's blocks (no gather; the same Packed)
template <int QT, typename O>
VNNI_FN void prompt_avx512(const Call& c, const int8_t* xq, const float* dx, const float* xm, int64_t S, int64_t xs,
                           O* y, const uint8_t* pk = nullptr) {
  constexpr int SLOT = QT == Q6_K ? 16 : 32;
  auto fill = [&](int64_t b, Packed& p) {
    if (pk) return unpack16<QT>(c, pk, b, p);
    pack16<QT>(c, 16 * b, p);
  };
  chunks(c.N / 16, 2, [&](int64_t b0, int64_t b1) {
    Packed p0(c.K, SLOT), p1(c.K, SLOT);
    const Packed* two[2] = {&p0, &p1};
    int64_t b = b0;
    for (; b + 2 <= b1; b += 2) {
      fill(b, p0);
      fill(b + 1, p1);
      prompt_rows<QT, 2, O>(c, two, xq, dx, xm, S, xs, 16 * b, y);
    }
    if (b < b1) {
      fill(b, p0);
      prompt_rows<QT, 1, O>(c, two, xq, dx, xm, S, xs, 16 * b, y);
    }
  });
}

// The same product with AVX2 (no VNNI): a ymm's 8 lanes 8 outputs, Packed's 16 rows two ymm; 4 bytes of a row of x
// broadcast times the quants by pairs (vpmaddubsw), the pairs summed in int16 while they fit (T16 steps: a slot for
// Q4_K, half of one for Q5_K and Q6_K), then widened to int32 (vpmaddwd by ones); tiles of 3 rows (4 ran no
// faster). On a Zen 3, 501 rows: Q4_K ~140 GMAC/s over 2 cores, 1.5× the same loop with GCC's tree of the adds (see
// in_register), ~2× the fp32 GEMM of the dequantized weights.
template <int QT>
AVX2_FN void pack16_avx2(const Call& c, int64_t n0, Packed& p) {
  const int64_t groups = c.K / 256;
  alignas(32) uint8_t u[256];
  alignas(32) int16_t s8[128];
  for (int n = 0; n < 16; n++) {
    const uint8_t* row = c.w + (n0 + n) * c.row_bytes;
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* b = row + g * c.f.block_bytes;
      float d;
      unpack8_avx2(QT, b, u, s8, d);
      uint8_t* q = p.rows.data() + n * c.K + g * 256;
      for (int i = 0; i < 256; i++) q[i] = QT == Q6_K ? (uint8_t)(u[i] - 32) : u[i];  // Q6_K: q − 32, signed
      pack_scales<QT>(b, d, q, n, g, p);
    }
  }
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)c.K));
  for (int64_t k4 = 0; k4 < c.K / 4; k4++)  // the 16 rows' 4 bytes at k4: two gathers
    for (int h = 0; h < 2; h++)
      _mm256_storeu_si256((__m256i*)(p.q.data() + k4 * 64 + 32 * h),
                          _mm256_i32gather_epi32((const int*)(p.rows.data() + 8 * h * c.K + 4 * k4), idx, 1));
}

// R rows × the 16 outputs of p, into y [M, N] fp32 or bf16
template <int QT, int R, typename O>
AVX2_FN void prompt_tile_avx2(const Call& c, const Packed& p, const int8_t* xq, const float* dx, const float* xm,
                              int64_t S, int64_t xs, int64_t m0, int64_t n0, O* y) {
  constexpr int SLOT = QT == Q6_K ? 16 : 32, SLOTS = 256 / SLOT;
  // steps of 4 bytes whose pair sums stay in int16: T16 · 2 · max|q| · max|x| < 2¹⁵ (Q4_K 8 · 2 · 15 · 127, Q5_K
  // 4 · 2 · 31 · 127, Q6_K 2 · 2 · 32 · 255)
  constexpr int T16 = QT == Q4_K ? 8 : QT == Q5_K ? 4 : 2;
  static_assert(SLOT / 4 % T16 == 0);
  const int64_t groups = c.K / 256;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xq + (m0 + r) * c.K;
  for (int64_t g = 0; g < groups; g++) {
    __m256 gacc[R][2];
    for (int r = 0; r < R; r++) gacc[r][0] = gacc[r][1] = _mm256_setzero_ps();
    for (int j = 0; j < SLOTS; j++) {
      __m256i p16[R][2], ia[R][2];  // int16 pair sums over T16 steps of 4 bytes, then their int32 sums
      const int64_t k40 = (g * 256 + j * SLOT) / 4;
#pragma GCC unroll 8
      for (int t = 0; t < SLOT / 4; t++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)(p.q.data() + (k40 + t) * 64));
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)(p.q.data() + (k40 + t) * 64 + 32));
        for (int r = 0; r < R; r++) {
          int32_t xv;
          std::memcpy(&xv, xr[r] + 4 * (k40 + t), 4);
          const __m256i xb = _mm256_set1_epi32(xv);
          for (int h = 0; h < 2; h++) {
            const __m256i w = h ? w1 : w0;  // Q6_K: x + 128 unsigned, q − 32 signed; else the quants unsigned
            const __m256i pr = QT == Q6_K ? _mm256_maddubs_epi16(xb, w) : _mm256_maddubs_epi16(w, xb);
            p16[r][h] = t % T16 ? _mm256_add_epi16(p16[r][h], pr) : pr;
            in_register(p16[r][h]);
            if (t % T16 == T16 - 1) {
              const __m256i w32 = _mm256_madd_epi16(p16[r][h], ones);
              ia[r][h] = t == T16 - 1 ? w32 : _mm256_add_epi32(ia[r][h], w32);
            }
          }
        }
      }
      for (int h = 0; h < 2; h++) {
        const __m256 s = _mm256_loadu_ps(p.s.data() + (g * SLOTS + j) * 16 + 8 * h);
        for (int r = 0; r < R; r++) gacc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r][h]), s, gacc[r][h]);
      }
    }
    for (int r = 0; r < R; r++) {
      const __m256 d = _mm256_set1_ps(dx[(m0 + r) * groups + g]);
      for (int h = 0; h < 2; h++) acc[r][h] = _mm256_fmadd_ps(gacc[r][h], d, acc[r][h]);
    }
  }
  for (int64_t j = 0; j < S; j++)  // the minimums (Q6_K: the 128 of x + 128 a group), j natural
    for (int h = 0; h < 2; h++) {
      const __m256 mv = _mm256_loadu_ps(p.mn.data() + j * 16 + 8 * h);
      for (int r = 0; r < R; r++) acc[r][h] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(xm[(m0 + r) * xs + j]), acc[r][h]);
    }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) {
      __m256 v = acc[r][h];
      if (c.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(c.bias + n0 + 8 * h));
      if constexpr (std::is_same_v<O, float>) _mm256_storeu_ps(y + (m0 + r) * c.N + n0 + 8 * h, v);
      else _mm_storeu_si128((__m128i*)(y + (m0 + r) * c.N + n0 + 8 * h), bf16_rne8(v));
    }
}

template <int QT>
AVX2_FN void unpack16_avx2(const Call& c, const uint8_t* pk, int64_t b, Packed& p);  // below, with pack's form

// pk: pack()'s form of the weights, read in place of the file's blocks (the same Packed)
template <int QT, typename O>
AVX2_FN void prompt_avx2(const Call& c, const int8_t* xq, const float* dx, const float* xm, int64_t S, int64_t xs,
                         O* y, const uint8_t* pk = nullptr) {
  constexpr int SLOT = QT == Q6_K ? 16 : 32;
  chunks(c.N / 16, 1, [&](int64_t b0, int64_t b1) {
    Packed p(c.K, SLOT);
    for (int64_t b = b0; b < b1; b++) {
      if (pk) unpack16_avx2<QT>(c, pk, b, p);
      else pack16_avx2<QT>(c, 16 * b, p);
      int64_t m = 0;
      for (; m + 3 <= c.M; m += 3) prompt_tile_avx2<QT, 3, O>(c, p, xq, dx, xm, S, xs, m, 16 * b, y);
      if (c.M - m == 2) prompt_tile_avx2<QT, 2, O>(c, p, xq, dx, xm, S, xs, m, 16 * b, y);
      else if (c.M - m == 1) prompt_tile_avx2<QT, 1, O>(c, p, xq, dx, xm, S, xs, m, 16 * b, y);
    }
  });
}
#endif  // QMM_X86

// ---------------------------------------------------------------------------------------------------------------
// Steps and passes on AVX-512 VNNI and AVX2 (Q4_K, Q5_K, Q6_K): the weights packed once, at load (pack), for
// vpdpbusd: a zmm's 16 lanes are 16 outputs, the quants of 16 weight rows interleaved 4 at a time as the prompt's
// Packed holds them, but 4 bits each (Q5_K: 5, Q6_K: 6), so that a step reads about the file's bytes (Q4_K +2.8 %,
// Q5_K +2.3 %, Q6_K the same). Every row of x times each unpacked weight vector: the cost of a call grows with its
// rows by the products alone (AVX2, vpmaddubsw: about three times the instructions a product, a 9-row pass about
// two steps). mm_packed takes calls of any size; GgufLinear sends it those of ≤ 33 rows, a prompt going to
// mm_prompt, which reads the same packed form (unpack16, unpack16_avx2).
//
// The arithmetic, for one output (every tile computes it alike, whatever M, the tile or the thread):
//   x        quantized as mm quantizes it (int8 per 256, the kernel order)
//   a slot   32 positions of a group (Q6_K: 16): ia = Σ q·x over them (Q6_K: Σ (q − 32)·x), int32, exact
//   a group  gacc = 0; gacc = fma(float(ia_j), d·sc_j, gacc) for its slots in order (d·sc_j exact in fp32);
//            acc = fma(gacc, dx_g, acc)
//   mins     Q4_K, Q5_K: mac = fma(dmin·m_j, xsd_j, mac) for the group's 8 sub-blocks, natural j (dmin·m_j exact);
//            Q6_K: none (mac = 0)
//   y        acc − mac (+ bias), rounded once to the output dtype
// Groups in order, each with its minimums (acc and mac in memory, touched once a group).

// A packed group of 16 weight rows: Q4_K q [4 · 8][64] (slot j, pair t: the low nibbles quad 8j + 2t, the high ones
// quad 8j + 2t + 1, of each row's 4 bytes at byte 4r), sc [8][16] (slot order), m [8][16] (natural), d [16],
// dmin [16] fp16. Q5_K: Q4_K's with the quants' fifth bits after q, hb [8][64] (slot j: bit k of byte 4r + i is
// bit 4 of quad 8j + k's byte i of row r), the rest HIGH5 bytes further. Q6_K q [16 · 3][64] (slot j, vector v < 3:
// quad 4j + v in bits 0–5, bits 2v, 2v + 1 of quad 4j + 3 in bits 6–7), sc [16][16] int8, d [16] fp16.
constexpr int64_t PACKED_Q4K = 2048 + 128 + 128 + 32 + 32;
constexpr int64_t HIGH5 = 512;
constexpr int64_t PACKED_Q5K = PACKED_Q4K + HIGH5;
constexpr int64_t PACKED_Q6K = 3072 + 256 + 32;

// The 32-element types: a packed group is 32 elements of 16 weight rows, the file's bytes a row
// and group. The quants unsigned (Q8_0: q + 128; Q4_0, Q5_0: the file's q, whose value is q − 8 | 16):
//   Q8_0         [8][64]: quad t (elements 4t .. 4t + 3), 4 bytes of each row at byte 4r
//   Q4_x, Q5_x   [4][64]: vector t holds quad 2t in its low nibbles, quad 2t + 1 in its high ones (byte 4r + i)
//   Q5_x         then hb [64]: bit k of byte 4r + i is bit 4 of quad k's byte i of row r
// then d [16] fp16, and (Q4_1, Q5_1) m [16] fp16.
constexpr bool type32(int64_t qtype) { return qtype == Q4_0 || qtype == Q4_1 || qtype == Q5_0 || qtype == Q5_1 || qtype == Q8_0; }
constexpr bool five32(int64_t qtype) { return qtype == Q5_0 || qtype == Q5_1; }
constexpr bool min32(int64_t qtype) { return qtype == Q4_1 || qtype == Q5_1; }
constexpr int64_t d_at32(int64_t qtype) { return (qtype == Q8_0 ? 512 : 256) + (five32(qtype) ? 64 : 0); }
constexpr int32_t offset32(int64_t qtype) { return qtype == Q8_0 ? 128 : qtype == Q4_0 ? 8 : qtype == Q5_0 ? 16 : 0; }

constexpr int64_t packed_bytes(int qtype) {
  return type32(qtype) ? d_at32(qtype) + (min32(qtype) ? 64 : 32)
         : qtype == Q6_K ? PACKED_Q6K : qtype == Q5_K ? PACKED_Q5K : PACKED_Q4K;
}
constexpr int64_t packed_group(int qtype) { return type32(qtype) ? 32 : 256; }  // a packed group's elements
constexpr bool packable(int64_t qtype) { return qtype == Q4_K || qtype == Q5_K || qtype == Q6_K || type32(qtype); }
constexpr int64_t high5(int qtype) { return qtype == Q5_K ? HIGH5 : 0; }  // Q4_K, Q5_K: where sc, m, d, dmin move

void check_packed(const char* who, const torch::Tensor& p, int64_t qtype, int64_t N, int64_t K) {
  TORCH_CHECK(packable(qtype) && N % 16 == 0 && K % packed_group((int)qtype) == 0 &&
              p.scalar_type() == at::kByte && p.is_contiguous() &&
              p.numel() == N / 16 * (K / packed_group((int)qtype)) * packed_bytes((int)qtype),
              who, ": packed must be pack()'s form of an [N, K] Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 weight");
}

// A 32-element block's fields after its d (bytes 0–1): where m, the fifth bits (qh) and the quants (qs) sit, −1: none
struct Fields32 {
  int m, qh, qs;
};
constexpr Fields32 fields32(int64_t qtype) {
  return qtype == Q4_1 ? Fields32{2, -1, 4} : qtype == Q5_0 ? Fields32{-1, 2, 6} : qtype == Q5_1 ? Fields32{2, 4, 8}
                       : Fields32{-1, -1, 2};  // Q8_0, Q4_0
}

// The four bytes at p as one word, read and written
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void wr32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Two quads of nibbles as one word: byte i the nibble at `shift` (0: low, 4: high) of q[i] low, of q[4 + i] high
inline uint32_t nibble_quads(const uint8_t* q, int shift) {
  return (rd32(q) >> shift & 0x0F0F0F0Fu) | (rd32(q + 4) >> shift & 0x0F0F0F0Fu) << 4;
}

// A 32-element type's rows [16·b0, 16·b1) into out [N / 16][K / 32][packed_bytes] (pack_rows), or back (unpack_rows)
void pack_rows32(const uint8_t* w, int qtype, int64_t K, int64_t row_bytes, int64_t b0, int64_t b1, uint8_t* out) {
  const int64_t groups = K / 32, gb = packed_bytes(qtype), at = d_at32(qtype);
  const int bb = format_of(qtype).block_bytes;
  const Fields32 f = fields32(qtype);
  for (int64_t b = b0; b < b1; b++)
    for (int64_t g = 0; g < groups; g++) {
      uint8_t* o = out + (b * groups + g) * gb;
      for (int r = 0; r < 16; r++) {
        const uint8_t* blk = w + (16 * b + r) * row_bytes + g * bb;
        std::memcpy(o + at + 2 * r, blk, 2);
        if (f.m >= 0) std::memcpy(o + at + 32 + 2 * r, blk + f.m, 2);
        if (qtype == Q8_0) {
          for (int t = 0; t < 8; t++) wr32(o + 64 * t + 4 * r, rd32(blk + f.qs + 4 * t) ^ 0x80808080u);  // q + 128
          continue;
        }
        // quads 2t and 2t + 1 (elements 8t .. 8t + 7) as one word of nibbles (nibble_quads, as pack_quants_words):
        // element j and j + 16 share qs[j], the low nibble and the high
        for (int t = 0; t < 4; t++) wr32(o + 64 * t + 4 * r, nibble_quads(blk + f.qs + 8 * (t % 2), 4 * (t / 2)));
        if (f.qh >= 0) {  // element j's fifth bit, bit j of qh, to bit 2t (j = 8t + i) or 2t + 1 (j = 8t + 4 + i)
          const uint32_t qh = rd32(blk + f.qh);  // of byte i
          for (int i = 0; i < 4; i++) {
            uint32_t v = 0;
            for (int t = 0; t < 4; t++) v |= (qh >> (8 * t + i) & 1) << 2 * t | (qh >> (8 * t + 4 + i) & 1) << 2 * t << 1;
            o[256 + 4 * r + i] = (uint8_t)v;
          }
        }
      }
    }
}

void unpack_rows32(const uint8_t* pk, int qtype, int64_t K, int64_t row_bytes, int64_t b0, int64_t b1, uint8_t* w) {
  const int64_t groups = K / 32, gb = packed_bytes(qtype), at = d_at32(qtype);
  const int bb = format_of(qtype).block_bytes;
  const Fields32 f = fields32(qtype);
  for (int64_t b = b0; b < b1; b++)
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* o = pk + (b * groups + g) * gb;
      for (int r = 0; r < 16; r++) {
        uint8_t* blk = w + (16 * b + r) * row_bytes + g * bb;
        std::memcpy(blk, o + at + 2 * r, 2);
        if (f.m >= 0) std::memcpy(blk + f.m, o + at + 32 + 2 * r, 2);
        if (qtype == Q8_0) {
          for (int t = 0; t < 8; t++)
            for (int i = 0; i < 4; i++) blk[f.qs + 4 * t + i] = (uint8_t)(o[64 * t + 4 * r + i] ^ 0x80);
          continue;
        }
        uint8_t q[32];
        for (int t = 0; t < 4; t++)
          for (int i = 0; i < 4; i++) {
            const uint8_t v = o[64 * t + 4 * r + i], h = f.qh >= 0 ? o[256 + 4 * r + i] : 0;
            q[8 * t + i] = (uint8_t)((v & 15) | ((h >> (2 * t)) & 1) << 4);
            q[8 * t + 4 + i] = (uint8_t)((v >> 4) | ((h >> (2 * t + 1)) & 1) << 4);
          }
        for (int j = 0; j < 16; j++) blk[f.qs + j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        if (f.qh >= 0) {
          uint32_t qh = 0;
          for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
          std::memcpy(blk + f.qh, &qh, 4);
        }
      }
    }
}

// Row r's quants of one K-quant block blk into o, pack_rows' form (unpack_rows reads them back), four bytes a step: each
// byte's arithmetic stays in its byte (nibbles, fifth bits, 6-bit quants and their 2-bit parts), any byte order
void pack_quants_words(int qtype, const uint8_t* blk, int r, uint8_t* o) {
  constexpr uint32_t LO4 = 0x0F0F0F0Fu, LO2 = 0x03030303u, LO1 = 0x01010101u;
  if (qtype != Q6_K) {  // slot j: sub-block SB[j], the low (even) or high (odd) nibbles of qs[32 · (SB[j] / 2) ...]
    const bool five = qtype == Q5_K;
    const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
    for (int j = 0; j < 8; j++) {
      const int sub = SB[j], shift = 4 * (sub & 1);
      const uint8_t* q = qs + 32 * (sub / 2);
      uint32_t fifth = 0;  // Q5_K: bit sub of qh[l], as bits 2t (a) and 2t + 1 (b) of the slot's bytes
      for (int t = 0; t < 4; t++) {
        wr32(o + (4 * j + t) * 64 + 4 * r, nibble_quads(q + 8 * t, shift));
        if (five) fifth |= (rd32(qh + 8 * t) >> sub & LO1) << 2 * t | (rd32(qh + 8 * t + 4) >> sub & LO1) << (2 * t + 1);
      }
      if (five) wr32(o + 2048 + 64 * j + 4 * r, fifth);
    }
    return;
  }
  const uint8_t *ql = blk, *qh = blk + 128;  // Q6_K: element e = 128h + 32sh + l, as unpack8_portable
  auto quad = [&](int e) {  // elements e .. e + 3, 6 bits each
    const int h = e / 128, sh = e % 128 / 32, l = e % 32;
    return (rd32(ql + 64 * h + (sh & 1) * 32 + l) >> 4 * (sh >> 1) & LO4) | (rd32(qh + 32 * h + l) >> 2 * sh & LO2) << 4;
  };
  for (int j = 0; j < 16; j++) {
    const uint32_t top = quad(16 * j + 12);  // quad 3: bits 6–7 of the other three
    for (int v = 0; v < 3; v++) wr32(o + (3 * j + v) * 64 + 4 * r, quad(16 * j + 4 * v) | (top >> 2 * v & LO2) << 6);
  }
}

// Rows [16·b0, 16·b1) of w into out [N / 16][K / 256][packed_bytes]; portable (a load's work)
void pack_rows(const uint8_t* w, int qtype, int64_t K, int64_t row_bytes, int64_t b0, int64_t b1, uint8_t* out) {
  if (type32(qtype)) return pack_rows32(w, qtype, K, row_bytes, b0, b1, out);
  const int64_t groups = K / 256, gb = packed_bytes(qtype), h5 = high5(qtype);
  const int bb = format_of(qtype).block_bytes;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t g = 0; g < groups; g++) {
      uint8_t* o = out + (b * groups + g) * gb;
      for (int r = 0; r < 16; r++) {
        const uint8_t* blk = w + (16 * b + r) * row_bytes + g * bb;
        pack_quants_words(qtype, blk, r, o);
        if (qtype == Q6_K) {
          const int8_t* s6 = (const int8_t*)(blk + 192);
          for (int j = 0; j < 16; j++) o[3072 + 16 * j + r] = (uint8_t)s6[j];
          std::memcpy(o + 3328 + 2 * r, blk + 208, 2);
        } else {
          int16_t sc[8];
          int32_t mn[8];
          kquant_scales(blk + 4, sc, mn);
          for (int j = 0; j < 8; j++) {
            o[h5 + 2048 + 16 * j + r] = (uint8_t)sc[SB[j]];
            o[h5 + 2176 + 16 * j + r] = (uint8_t)mn[j];
          }
          std::memcpy(o + h5 + 2304 + 2 * r, blk, 2);
          std::memcpy(o + h5 + 2336 + 2 * r, blk + 2, 2);
        }
      }
    }
}

// The file's blocks of rows [16·b0, 16·b1) back from pack_rows' form (bit for bit: pack keeps every bit of a block);
// portable (a load's or a subset head's work, not a step's)
void unpack_rows(const uint8_t* pk, int qtype, int64_t K, int64_t row_bytes, int64_t b0, int64_t b1, uint8_t* w) {
  if (type32(qtype)) return unpack_rows32(pk, qtype, K, row_bytes, b0, b1, w);
  const int64_t groups = K / 256, gb = packed_bytes(qtype);
  const int bb = format_of(qtype).block_bytes;
  uint8_t u[256], q[256];
  for (int64_t b = b0; b < b1; b++)
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* o = pk + (b * groups + g) * gb;
      for (int r = 0; r < 16; r++) {
        uint8_t* blk = w + (16 * b + r) * row_bytes + g * bb;
        if (qtype == Q6_K) {
          std::memset(u, 0, 256);
          for (int j = 0; j < 16; j++)
            for (int v = 0; v < 3; v++)
              for (int i = 0; i < 4; i++) {
                const uint8_t byte = o[(3 * j + v) * 64 + 4 * r + i];
                u[16 * j + 4 * v + i] = byte & 63;
                u[16 * j + 12 + i] |= (uint8_t)((byte >> 6) << (2 * v));
              }
        } else {
          for (int j = 0; j < 8; j++)
            for (int t = 0; t < 4; t++)
              for (int i = 0; i < 4; i++) {
                const uint8_t byte = o[(4 * j + t) * 64 + 4 * r + i];
                const uint8_t hb = high5(qtype) ? o[2048 + 64 * j + 4 * r + i] : 0;
                u[32 * j + 8 * t + i] = (uint8_t)((byte & 15) | ((hb >> (2 * t)) & 1) << 4);
                u[32 * j + 8 * t + 4 + i] = (uint8_t)((byte >> 4) | ((hb >> (2 * t + 1)) & 1) << 4);
              }
        }
        for (int p = 0; p < 256; p++) q[32 * sub_slot(qtype, p / 32) + p % 32] = u[p];  // natural order
        if (qtype == Q6_K) {  // unpack8_portable's reading, written
          uint8_t *ql = blk, *qh = blk + 128;
          std::memset(blk, 0, 192);
          for (int h = 0; h < 2; h++)
            for (int t = 0; t < 128; t++) {
              const int sh = t / 32, l = t % 32, e = 128 * h + t;
              ql[64 * h + (sh & 1) * 32 + l] |= (uint8_t)((q[e] & 15) << (4 * (sh >> 1)));
              qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * sh));
            }
          for (int j = 0; j < 16; j++) blk[192 + j] = o[3072 + 16 * j + r];
          std::memcpy(blk + 208, o + 3328 + 2 * r, 2);
        } else {  // d, dmin, the 12 bytes kquant_scales reads, (Q5_K) the fifth bits, the nibbles
          const int64_t h5 = high5(qtype);
          uint8_t sc[8], mn[8];
          for (int j = 0; j < 8; j++) {
            sc[SB[j]] = o[h5 + 2048 + 16 * j + r];
            mn[j] = o[h5 + 2176 + 16 * j + r];
          }
          std::memcpy(blk, o + h5 + 2304 + 2 * r, 2);
          std::memcpy(blk + 2, o + h5 + 2336 + 2 * r, 2);
          uint8_t* s = blk + 4;
          for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
            s[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
          }
          uint8_t* qs = blk + (h5 ? 48 : 16);
          if (h5) std::memset(blk + 16, 0, 32);
          for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
              qs[32 * c + l] = (uint8_t)((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
              if (h5) blk[16 + l] |= (uint8_t)((q[64 * c + l] >> 4) << (2 * c) | (q[64 * c + 32 + l] >> 4) << (2 * c + 1));
            }
        }
      }
    }
}

#if QMM_X86
// Q6_K slot j of a packed group o: its four quads' 6-bit quants (unsigned) from its three vectors
VNNI_FN inline __attribute__((always_inline)) void q6_quads(const uint8_t* o, int j, __m512i* w) {
  const __m512i m6 = _mm512_set1_epi8(63), m2 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(15);
  __m512i v[3];
  for (int k = 0; k < 3; k++) {
    v[k] = _mm512_loadu_si512(o + (3 * j + k) * 64);
    w[k] = _mm512_and_si512(v[k], m6);
  }
  // quad 3: bits 6–7 of the three, as bits 0–1, 2–3, 4–5 (0xE4: A where C, else B)
  const __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v[0], 6), _mm512_srli_epi16(v[1], 4), m2, 0xE4);
  w[3] = _mm512_and_si512(_mm512_ternarylogic_epi32(t, _mm512_srli_epi16(v[2], 2), m4, 0xE4), m6);
}

// Q5_K: a pair's two quads w0, w1 (their low 4 bits) get their fifth bits, bits 0 and 1 of hb's bytes; hb then moves
// on to the next pair's (bits 2t, 2t + 1 for pair t: constant shifts only)
VNNI_FN inline __attribute__((always_inline)) void fifth_bits(__m512i& hb, __m512i& w0, __m512i& w1) {
  const __m512i bit4 = _mm512_set1_epi8(16);
  w0 = _mm512_ternarylogic_epi32(w0, _mm512_slli_epi16(hb, 4), bit4, 0xF8);  // A | (B & C)
  w1 = _mm512_ternarylogic_epi32(w1, _mm512_slli_epi16(hb, 3), bit4, 0xF8);
  hb = _mm512_srli_epi16(hb, 2);
}

// a = fma(x, y, a), 16 lanes in memory
VNNI_FN inline __attribute__((always_inline)) void fma_into(float* a, __m512 x, __m512 y) {
  _mm512_store_ps(a, _mm512_fmadd_ps(x, y, _mm512_load_ps(a)));
}

// R rows (x: xq8, [M, K] kernel order; off16: Q6_K's −32 · Σ x per 16) × 16 outputs of block b over every group, into y
template <int QT, int R, typename O>
VNNI_FN void packed_tile(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off16, int64_t m0,
                         int64_t b, O* y) {
  const int64_t groups = c.K / 256, gb = packed_bytes(QT), h5 = high5(QT);
  const __m512i lo4 = _mm512_set1_epi8(15);
  alignas(64) float acc_m[R][16], mac_m[R][16];  // in memory: touched once a group (the registers hold ia, gacc)
  for (int r = 0; r < R; r++)
    for (int l = 0; l < 16; l++) acc_m[r][l] = mac_m[r][l] = 0.f;
  const uint8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xs + (m0 + r) * c.K;
  const uint8_t* o = pk + b * groups * gb;
  for (int64_t g = 0; g < groups; g++, o += gb) {
    for (int64_t p = 2048; p < gb; p += 64) _mm_prefetch((const char*)(o + PREFETCH_BYTES + p), _MM_HINT_T0);
    __m512 gacc[R];
    for (int r = 0; r < R; r++) gacc[r] = _mm512_setzero_ps();
    if constexpr (QT == Q6_K) {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + 3328)));
#pragma GCC unroll 2
      for (int j = 0; j < 16; j++) {
        for (int k = 0; k < 3; k++) _mm_prefetch((const char*)(o + PREFETCH_BYTES + (3 * j + k) * 64), _MM_HINT_T0);
        __m512i w[4];
        q6_quads(o, j, w);
        __m512i ia[R];
        for (int r = 0; r < R; r++) ia[r] = _mm512_set1_epi32(off16[(m0 + r) * (c.K / 16) + 16 * g + j]);  // a load
        for (int k = 0; k < 4; k++)
          for (int r = 0; r < R; r++) {
            int32_t xv;
            std::memcpy(&xv, xr[r] + g * 256 + 16 * j + 4 * k, 4);
            ia[r] = _mm512_dpbusd_epi32(ia[r], w[k], _mm512_set1_epi32(xv));
          }
        const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(o + 3072 + 16 * j)))));
        for (int r = 0; r < R; r++) gacc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), s, gacc[r]);
      }
      for (int r = 0; r < R; r++) fma_into(acc_m[r], gacc[r], _mm512_set1_ps(c.dx[(m0 + r) * groups + g]));
    } else {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + h5 + 2304)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + h5 + 2336)));
#pragma GCC unroll 2
      for (int j = 0; j < 8; j++) {
        __m512i ia[R];
        for (int r = 0; r < R; r++) ia[r] = _mm512_setzero_si512();
        __m512i hb = _mm512_setzero_si512();
        if constexpr (QT == Q5_K) hb = _mm512_loadu_si512(o + 2048 + 64 * j);
        for (int t = 0; t < 4; t++) {
          _mm_prefetch((const char*)(o + PREFETCH_BYTES + (4 * j + t) * 64), _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(o + (4 * j + t) * 64);
          __m512i w0 = _mm512_and_si512(v, lo4), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
          if constexpr (QT == Q5_K) fifth_bits(hb, w0, w1);
          for (int r = 0; r < R; r++) {
            int32_t x0, x1;
            std::memcpy(&x0, xr[r] + g * 256 + 32 * j + 8 * t, 4);
            std::memcpy(&x1, xr[r] + g * 256 + 32 * j + 8 * t + 4, 4);
            ia[r] = _mm512_dpbusd_epi32(ia[r], w0, _mm512_set1_epi32(x0));
            ia[r] = _mm512_dpbusd_epi32(ia[r], w1, _mm512_set1_epi32(x1));
          }
        }
        const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(o + h5 + 2048 + 16 * j)))));
        for (int r = 0; r < R; r++) gacc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), s, gacc[r]);
      }
      for (int r = 0; r < R; r++) fma_into(acc_m[r], gacc[r], _mm512_set1_ps(c.dx[(m0 + r) * groups + g]));
      for (int j = 0; j < 8; j++) {
        const __m512 mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(o + h5 + 2176 + 16 * j)))));
        for (int r = 0; r < R; r++) fma_into(mac_m[r], mn, _mm512_set1_ps(c.xsd[(m0 + r) * c.S16 + 8 * g + j]));
      }
    }
  }
  for (int r = 0; r < R; r++) {
    __m512 v = _mm512_sub_ps(_mm512_load_ps(acc_m[r]), _mm512_load_ps(mac_m[r]));
    if (c.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(c.bias + 16 * b));
    if constexpr (std::is_same_v<O, float>) _mm512_storeu_ps(y + (m0 + r) * c.N + 16 * b, v);
    else _mm256_storeu_si256((__m256i*)(y + (m0 + r) * c.N + 16 * b), bf16_rne(v));
  }
}

// The same arithmetic with AVX2 (no VNNI), the same bits: a ymm's 8 lanes are 8 outputs, a packed vector's 16 rows two
// ymm (rows 0–7, then 8–15), each half of a group taken in turn (16 ymm registers: a slot's 8 unpacked quads, its
// rows' sums). A slot's ia as the AVX2 prompt kernel sums it (vpmaddubsw pairs added in int16 over T16 quads, within
// 2¹⁵: Q4_K 8 · 2 · 15 · 127, Q5_K 4 · 2 · 31 · 127, Q6_K 2 · 2 · 63 · 127; then vpmaddwd by ones), exact as vpdpbusd's;
// gacc, acc and mac in memory.
AVX2_FN inline __attribute__((always_inline)) __m256i select_bits(__m256i a, __m256i b, __m256i mask) {
  return _mm256_or_si256(_mm256_and_si256(a, mask), _mm256_andnot_si256(mask, b));  // a where mask, else b
}

// q6_quads for half h: slot j's four quads, 6-bit quants (unsigned), rows 8h .. 8h + 7
AVX2_FN inline __attribute__((always_inline)) void q6_quads_avx2(const uint8_t* o, int j, int h, __m256i* w) {
  const __m256i m6 = _mm256_set1_epi8(63), m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(15);
  __m256i v[3];
  for (int k = 0; k < 3; k++) {
    v[k] = _mm256_loadu_si256((const __m256i*)(o + (3 * j + k) * 64 + 32 * h));
    w[k] = _mm256_and_si256(v[k], m6);
  }
  const __m256i t = select_bits(_mm256_srli_epi16(v[0], 6), _mm256_srli_epi16(v[1], 4), m2);
  w[3] = _mm256_and_si256(select_bits(t, _mm256_srli_epi16(v[2], 2), m4), m6);
}

// fifth_bits for half h
AVX2_FN inline __attribute__((always_inline)) void fifth_bits_avx2(__m256i& hb, __m256i& w0, __m256i& w1) {
  const __m256i bit4 = _mm256_set1_epi8(16);
  w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
  w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
  hb = _mm256_srli_epi16(hb, 2);
}

// a = fma(x, y, a), 8 lanes in memory
AVX2_FN inline __attribute__((always_inline)) void fma_into8(float* a, __m256 x, __m256 y) {
  _mm256_store_ps(a, _mm256_fmadd_ps(x, y, _mm256_load_ps(a)));
}

// packed_tile's product with AVX2: R rows × 16 outputs of block b over every group, into y
template <int QT, int R, typename O>
AVX2_FN void packed_tile_avx2(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off16, int64_t m0,
                              int64_t b, O* y) {
  constexpr int T16 = QT == Q4_K ? 8 : QT == Q5_K ? 4 : 2;  // quads summed in int16 (see above)
  const int64_t groups = c.K / 256, gb = packed_bytes(QT), h5 = high5(QT);
  const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  // gacc in registers where they leave room for a slot's quads (Q4_K, Q5_K: 8 ymm; Q6_K: 4), else in memory
  constexpr bool REG = QT == Q6_K || R <= 4;
  alignas(32) float acc_m[R][16], mac_m[R][16], gacc_m[REG ? 1 : R][8];
  __m256 gacc_r[R];
  for (int r = 0; r < R; r++)
    for (int l = 0; l < 16; l++) acc_m[r][l] = mac_m[r][l] = 0.f;
  const uint8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xs + (m0 + r) * c.K;
  const uint8_t* o = pk + b * groups * gb;
  for (int64_t g = 0; g < groups; g++, o += gb) {
    for (int64_t p = 0; p < gb; p += 64) _mm_prefetch((const char*)(o + PREFETCH_BYTES + p), _MM_HINT_T0);
    for (int h = 0; h < 2; h++) {
      for (int r = 0; r < R; r++) {
        if constexpr (REG) gacc_r[r] = _mm256_setzero_ps();
        else _mm256_store_ps(gacc_m[r], _mm256_setzero_ps());
      }
      if constexpr (QT == Q6_K) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 3328 + 16 * h)));
        for (int j = 0; j < 16; j++) {
          __m256i w[4];
          q6_quads_avx2(o, j, h, w);
          const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(o + 3072 + 16 * j + 8 * h)))));
          for (int r = 0; r < R; r++) {
            const uint8_t* x = xr[r] + g * 256 + 16 * j;
            __m256i ia = _mm256_set1_epi32(off16[(m0 + r) * (c.K / 16) + 16 * g + j]);
            for (int k = 0; k < 4; k += 2) {
              int32_t x0, x1;
              std::memcpy(&x0, x + 4 * k, 4);
              std::memcpy(&x1, x + 4 * k + 4, 4);
              __m256i p16 = _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(x0));
              in_register(p16);
              p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(w[k + 1], _mm256_set1_epi32(x1)));
              ia = _mm256_add_epi32(ia, _mm256_madd_epi16(p16, ones));
            }
            if constexpr (REG) gacc_r[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), s, gacc_r[r]);  // gacc = fma(float(ia), s, gacc)
            else fma_into8(gacc_m[r], _mm256_cvtepi32_ps(ia), s);
          }
        }
      } else {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + h5 + 2304 + 16 * h)));
        for (int j = 0; j < 8; j++) {
          __m256i w[8];  // quads 8j .. 8j + 7
          __m256i hb = _mm256_setzero_si256();
          if constexpr (QT == Q5_K) hb = _mm256_loadu_si256((const __m256i*)(o + 2048 + 64 * j + 32 * h));
          for (int t = 0; t < 4; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(o + (4 * j + t) * 64 + 32 * h));
            w[2 * t] = _mm256_and_si256(v, lo4);
            w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            if constexpr (QT == Q5_K) fifth_bits_avx2(hb, w[2 * t], w[2 * t + 1]);
          }
          const __m256 s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(o + h5 + 2048 + 16 * j + 8 * h)))));
          for (int r = 0; r < R; r++) {
            const uint8_t* x = xr[r] + g * 256 + 32 * j;
            __m256i ia = _mm256_setzero_si256();
            for (int q0 = 0; q0 < 8; q0 += T16) {
              __m256i p16 = _mm256_setzero_si256();
              for (int q = q0; q < q0 + T16; q++) {
                int32_t xv;
                std::memcpy(&xv, x + 4 * q, 4);
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(w[q], _mm256_set1_epi32(xv)));
                in_register(p16);
              }
              ia = _mm256_add_epi32(ia, _mm256_madd_epi16(p16, ones));
            }
            if constexpr (REG) gacc_r[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), s, gacc_r[r]);  // gacc = fma(float(ia), s, gacc)
            else fma_into8(gacc_m[r], _mm256_cvtepi32_ps(ia), s);
          }
        }
      }
      for (int r = 0; r < R; r++)
        fma_into8(acc_m[r] + 8 * h, REG ? gacc_r[r] : _mm256_load_ps(gacc_m[REG ? 0 : r]), _mm256_set1_ps(c.dx[(m0 + r) * groups + g]));
      if constexpr (QT != Q6_K) {
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + h5 + 2336 + 16 * h)));
        for (int j = 0; j < 8; j++) {
          const __m256 mn = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(o + h5 + 2176 + 16 * j + 8 * h)))));
          for (int r = 0; r < R; r++) fma_into8(mac_m[r] + 8 * h, mn, _mm256_set1_ps(c.xsd[(m0 + r) * c.S16 + 8 * g + j]));
        }
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) {
      __m256 v = _mm256_sub_ps(_mm256_load_ps(acc_m[r] + 8 * h), _mm256_load_ps(mac_m[r] + 8 * h));
      if (c.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(c.bias + 16 * b + 8 * h));
      if constexpr (std::is_same_v<O, float>) _mm256_storeu_ps(y + (m0 + r) * c.N + 16 * b + 8 * h, v);
      else _mm_storeu_si128((__m128i*)(y + (m0 + r) * c.N + 16 * b + 8 * h), bf16_rne8(v));
    }
}

// The 32-element types' steps and passes on AVX-512 VNNI (AVX2: packed_tile32_avx2, the same bits), from their packed
// form: the K-quants' tile with 32-element groups. x is quantized to int8 per 32 elements (not mm's int16: vpdpbusd
// takes bytes), in natural order. The arithmetic, for one output:
//   x        per group g of 32: amax = max|x|, inv = 127 / amax, xq_i = rint(x_i · inv) (±127 at most),
//            dx_g = amax / 127 (0 where amax is), xs_g = Σ xq_i
//   a group  ia = Σ u_i·xq_i − o·xs_g = Σ w_i·xq_i, int32, exact (u the unsigned quant, w = u − o its value's integer:
//            o = 128 for Q8_0, 8 for Q4_0, 16 for Q5_0, 0 for Q4_1 and Q5_1);
//            acc = fma(float(ia), d·dx_g, acc) (d·dx_g one fp32 multiplication);
//            Q4_1, Q5_1: acc = fma(m, xsd_g, acc) with xsd_g = float(xs_g) · dx_g
//   y        acc (+ bias), rounded once to the output dtype
// Groups in order. off: −o·xs_g per row and group; c.dx: dx_g; c.xsd: xsd_g (Q4_1, Q5_1).
template <typename T>
VNNI_FN void quantize_row32_avx512(const T* x, int64_t K, int32_t o, int8_t* xq, float* dx, int32_t* off, float* xsd) {
  for (int64_t g = 0; g < K / 32; g++) {
    __m512 v[2];
    for (int h = 0; h < 2; h++) {
      if constexpr (std::is_same_v<T, float>) v[h] = _mm512_loadu_ps(x + g * 32 + 16 * h);
      else  // bf16: the upper half of an fp32
        v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(x + g * 32 + 16 * h))), 16));
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const __m512 iv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    dx[g] = amax / 127.f;
    const int32_t xs = round32_avx512(v, iv, xq + g * 32);
    off[g] = -o * xs;
    if (xsd) xsd[g] = (float)xs * dx[g];
  }
}

// ia[r] += w · the 4 bytes of row r's x at `at`, for each of R rows
template <int R>
VNNI_FN inline __attribute__((always_inline)) void dot_rows(__m512i* ia, __m512i w, const uint8_t* const* xr, int64_t at) {
  for (int r = 0; r < R; r++) {
    int32_t xv;
    std::memcpy(&xv, xr[r] + at, 4);
    ia[r] = _mm512_dpbusd_epi32(ia[r], w, _mm512_set1_epi32(xv));
  }
}

// Quads 2t and 2t + 1 of a packed Q4_x / Q5_x group o as unsigned bytes; hb: the group's fifth bits (Q5_x), moved
// on to the next pair's
template <int QT>
VNNI_FN inline __attribute__((always_inline)) void quad_pair32(const uint8_t* o, int t, __m512i& hb, __m512i& w0,
                                                               __m512i& w1) {
  const __m512i v = _mm512_loadu_si512(o + 64 * t), lo4 = _mm512_set1_epi8(15);
  w0 = _mm512_and_si512(v, lo4), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
  if constexpr (five32(QT)) fifth_bits(hb, w0, w1);
}

template <int QT, int R, typename O>
VNNI_FN void packed_tile32(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off, int64_t m0,
                           int64_t b, O* y) {
  constexpr int64_t GB = packed_bytes(QT), AT = d_at32(QT);
  const int64_t groups = c.K / 32;
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  const uint8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xs + (m0 + r) * c.K;
  const uint8_t* o = pk + b * groups * GB;
  for (int64_t g = 0; g < groups; g++, o += GB) {
    for (int64_t p = 0; p < GB; p += 64) _mm_prefetch((const char*)(o + PREFETCH_BYTES + p), _MM_HINT_T0);
    __m512i ia[R];
    for (int r = 0; r < R; r++) ia[r] = _mm512_set1_epi32(off[(m0 + r) * groups + g]);
    if constexpr (QT == Q8_0) {
      for (int t = 0; t < 8; t++) dot_rows<R>(ia, _mm512_loadu_si512(o + 64 * t), xr, g * 32 + 4 * t);
    } else {
      __m512i hb = five32(QT) ? _mm512_loadu_si512(o + 256) : _mm512_setzero_si512(), w0, w1;
      for (int t = 0; t < 4; t++) {
        quad_pair32<QT>(o, t, hb, w0, w1);
        dot_rows<R>(ia, w0, xr, g * 32 + 8 * t);
        dot_rows<R>(ia, w1, xr, g * 32 + 8 * t + 4);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + AT)));
    for (int r = 0; r < R; r++)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r]), _mm512_mul_ps(d, _mm512_set1_ps(c.dx[(m0 + r) * groups + g])), acc[r]);
    if constexpr (min32(QT)) {
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + AT + 32)));
      for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(c.xsd[(m0 + r) * groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) {
    __m512 v = acc[r];
    if (c.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(c.bias + 16 * b));
    if constexpr (std::is_same_v<O, float>) _mm512_storeu_ps(y + (m0 + r) * c.N + 16 * b, v);
    else _mm256_storeu_si256((__m256i*)(y + (m0 + r) * c.N + 16 * b), bf16_rne(v));
  }
}

// A prompt's product for the 32-element types on AVX-512 VNNI: packed_tile32's arithmetic, so the same bits (each
// output its groups in order: ia from −o·Σx, one fma by d·dx; Q4_1, Q5_1 one more by m·xsd), but two blocks of 16
// weight rows at a time, the broadcasts of x shared by both, over PROMPT32_ROWS rows at a time (a last tile short of
// them reads its first row again and stores only its own), and the quants unpacked to bytes once a call (Q8_0's are
// bytes: read in place). 501 rows of Qwen2.5-1.5B's gate/up: see benchmarks/README.md.
constexpr int PROMPT32_ROWS = 6;

// Block b's unsigned quants as bytes, [K / 32][8 quads][64] (what packed_tile32 makes of them as it reads)
template <int QT>
VNNI_FN void bytes32(const Call& c, const uint8_t* pk, int64_t b, uint8_t* q) {
  constexpr int64_t GB = packed_bytes(QT);
  const int64_t groups = c.K / 32;
  const uint8_t* o = pk + b * groups * GB;
  for (int64_t g = 0; g < groups; g++, o += GB, q += 512) {
    __m512i hb = five32(QT) ? _mm512_loadu_si512(o + 256) : _mm512_setzero_si512(), w0, w1;
    for (int t = 0; t < 4; t++) {
      quad_pair32<QT>(o, t, hb, w0, w1);
      _mm512_storeu_si512(q + 128 * t, w0);  // quad 2t
      _mm512_storeu_si512(q + 128 * t + 64, w1);  // quad 2t + 1
    }
  }
}

// Rows m0 .. m0 + rows − 1 (rows ≤ R) × NB blocks b0 .. of 16 outputs; q[i]: block b0 + i's quads, a group every qs bytes
template <int QT, int R, int NB, typename O>
VNNI_FN void prompt_tile32(const Call& c, const uint8_t* pk, const uint8_t* const* q, int64_t qs, const uint8_t* xs,
                           const int32_t* off, int64_t m0, int64_t rows, int64_t b0, O* y) {
  constexpr int64_t GB = packed_bytes(QT), AT = d_at32(QT);
  const int64_t groups = c.K / 32;
  int64_t mr[R];  // row r's: its own, or m0 past `rows`
  const uint8_t* xr[R];
  for (int r = 0; r < R; r++) mr[r] = m0 + (r < rows ? r : 0), xr[r] = xs + mr[r] * c.K;
  __m512 acc[R][NB];
  for (int r = 0; r < R; r++)
    for (int i = 0; i < NB; i++) acc[r][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    __m512i ia[R][NB];
    for (int r = 0; r < R; r++) {
      const __m512i o0 = _mm512_set1_epi32(off[mr[r] * groups + g]);
      for (int i = 0; i < NB; i++) ia[r][i] = o0;
    }
    for (int t = 0; t < 8; t++) {
      __m512i w[NB];
      for (int i = 0; i < NB; i++) w[i] = _mm512_loadu_si512(q[i] + g * qs + 64 * t);
      for (int r = 0; r < R; r++) {
        int32_t xv;
        std::memcpy(&xv, xr[r] + g * 32 + 4 * t, 4);
        const __m512i xb = _mm512_set1_epi32(xv);
        for (int i = 0; i < NB; i++) ia[r][i] = _mm512_dpbusd_epi32(ia[r][i], w[i], xb);
      }
    }
    for (int i = 0; i < NB; i++) {
      const uint8_t* o = pk + ((b0 + i) * groups + g) * GB;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + AT)));
      for (int r = 0; r < R; r++)
        acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][i]), _mm512_mul_ps(d, _mm512_set1_ps(c.dx[mr[r] * groups + g])), acc[r][i]);
      if constexpr (min32(QT)) {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + AT + 32)));
        for (int r = 0; r < R; r++) acc[r][i] = _mm512_fmadd_ps(m, _mm512_set1_ps(c.xsd[mr[r] * groups + g]), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < NB; i++) {
      __m512 v = acc[r][i];
      if (c.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(c.bias + 16 * (b0 + i)));
      O* out = y + (m0 + r) * c.N + 16 * (b0 + i);
      if constexpr (std::is_same_v<O, float>) _mm512_storeu_ps(out, v);
      else _mm256_storeu_si256((__m256i*)out, bf16_rne(v));
    }
}

template <int QT, typename O>
VNNI_FN void prompt32_avx512(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off, O* y) {
  constexpr int64_t GB = packed_bytes(QT);
  const int64_t groups = c.K / 32;
  chunks(c.N / 16, 2, [&](int64_t b0, int64_t b1) {
    std::vector<uint8_t> bytes(QT == Q8_0 ? 0 : 2 * groups * 512);
    for (int64_t b = b0; b < b1; b += 2) {
      const int64_t nb = std::min<int64_t>(2, b1 - b);
      const uint8_t* q[2];
      for (int64_t i = 0; i < nb; i++) {
        if constexpr (QT == Q8_0) q[i] = pk + (b + i) * groups * GB;
        else bytes32<QT>(c, pk, b + i, bytes.data() + i * groups * 512), q[i] = bytes.data() + i * groups * 512;
      }
      const int64_t qs = QT == Q8_0 ? GB : 512;
      for (int64_t m = 0; m < c.M; m += PROMPT32_ROWS) {
        const int64_t rows = std::min<int64_t>(PROMPT32_ROWS, c.M - m);
        if (nb == 2) prompt_tile32<QT, PROMPT32_ROWS, 2, O>(c, pk, q, qs, xs, off, m, rows, b, y);
        else prompt_tile32<QT, PROMPT32_ROWS, 1, O>(c, pk, q, qs, xs, off, m, rows, b, y);
      }
    }
  });
}

// quantize_row32_avx512 with AVX2: the same xq, dx, off and xsd (the same fp32 operations, rint alike)
template <typename T>
AVX2_FN void quantize_row32_avx2(const T* x, int64_t K, int32_t o, int8_t* xq, float* dx, int32_t* off, float* xsd) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < K / 32; g++) {
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int h = 0; h < 4; h++) {
      if constexpr (std::is_same_v<T, float>) v[h] = _mm256_loadu_ps(x + g * 32 + 8 * h);
      else  // bf16: the upper half of an fp32
        v[h] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(x + g * 32 + 8 * h))), 16));
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[h], absmask));
    }
    const float amax = hmax8(mx);
    const __m256 iv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    dx[g] = amax / 127.f;
    const int32_t xs = round32_avx2(v, iv, xq + g * 32);
    off[g] = -o * xs;
    if (xsd) xsd[g] = (float)xs * dx[g];
  }
}

// packed_tile32 with AVX2 (no VNNI), the same bits: a ymm's 8 lanes 8 outputs, each half of the 16 in turn. A group's
// ia as AVX-512 sums it, exact: vpmaddubsw of the unsigned quants and 4 bytes of x, two quads' pairs added in int16
// (2 · 2 · 31 · 127 < 2¹⁵), vpmaddwd by ones into int32. Q8_0's q + 128 would overflow the int16 pairs: its q signed,
// |q| times x with q's sign (vpsignb; |−128| = 128, 2 · 128 · 127 < 2¹⁵), so its ia starts at 0, not at −128·Σx.
// acc in memory.
template <int QT, int R, typename O>
AVX2_FN void packed_tile32_avx2(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off, int64_t m0,
                                int64_t b, O* y) {
  constexpr int64_t GB = packed_bytes(QT), AT = d_at32(QT);
  const int64_t groups = c.K / 32;
  const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const uint8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = xs + (m0 + r) * c.K;
  for (int h = 0; h < 2; h++) {
    alignas(32) float acc[R][8];
    for (int r = 0; r < R; r++)
      for (int l = 0; l < 8; l++) acc[r][l] = 0.f;
    const uint8_t* o = pk + b * groups * GB;
    for (int64_t g = 0; g < groups; g++, o += GB) {
      if (h == 0)
        for (int64_t p = 0; p < GB; p += 64) _mm_prefetch((const char*)(o + PREFETCH_BYTES + p), _MM_HINT_T0);
      __m256i ia[R];
      for (int r = 0; r < R; r++) ia[r] = _mm256_set1_epi32(QT == Q8_0 ? 0 : off[(m0 + r) * groups + g]);
      if constexpr (QT == Q8_0) {
        for (int t = 0; t < 8; t++) {
          const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(o + 64 * t + 32 * h)), _mm256_set1_epi8((char)0x80));
          const __m256i u = _mm256_abs_epi8(q);
          for (int r = 0; r < R; r++) {
            int32_t xv;
            std::memcpy(&xv, xr[r] + g * 32 + 4 * t, 4);
            const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_set1_epi32(xv), q));
            ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(p, ones));
          }
        }
      } else {
        __m256i hb = _mm256_setzero_si256();
        if constexpr (five32(QT)) hb = _mm256_loadu_si256((const __m256i*)(o + 256 + 32 * h));
        for (int t = 0; t < 4; t++) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(o + 64 * t + 32 * h));
          __m256i w0 = _mm256_and_si256(v, lo4), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
          if constexpr (five32(QT)) fifth_bits_avx2(hb, w0, w1);
          for (int r = 0; r < R; r++) {
            int32_t x0, x1;
            std::memcpy(&x0, xr[r] + g * 32 + 8 * t, 4);
            std::memcpy(&x1, xr[r] + g * 32 + 8 * t + 4, 4);
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(x0)),
                                               _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x1)));
            ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(p, ones));
          }
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + AT + 16 * h)));
      for (int r = 0; r < R; r++) {
        const __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(c.dx[(m0 + r) * groups + g]));
        _mm256_store_ps(acc[r], _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), s, _mm256_load_ps(acc[r])));
      }
      if constexpr (min32(QT)) {
        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + AT + 32 + 16 * h)));
        for (int r = 0; r < R; r++)
          _mm256_store_ps(acc[r], _mm256_fmadd_ps(m, _mm256_set1_ps(c.xsd[(m0 + r) * groups + g]), _mm256_load_ps(acc[r])));
      }
    }
    for (int r = 0; r < R; r++) {
      __m256 v = _mm256_load_ps(acc[r]);
      if (c.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(c.bias + 16 * b + 8 * h));
      if constexpr (std::is_same_v<O, float>) _mm256_storeu_ps(y + (m0 + r) * c.N + 16 * b + 8 * h, v);
      else _mm_storeu_si128((__m128i*)(y + (m0 + r) * c.N + 16 * b + 8 * h), bf16_rne8(v));
    }
  }
}

// Every row of the call for blocks [b0, b1): tiles of ≤ PACKED_TILE rows, of sizes as equal as they can be (a
// 9-row pass one tile, its weights unpacked once: 1.05–1.17× the 5 + 4 of tiles of 6, one and five rows alike);
// wide: AVX-512 VNNI's tiles, else AVX2's (the same values)
constexpr int PACKED_TILE = 9;
template <int QT, typename O, bool WIDE>
void packed_blocks(const Call& c, const uint8_t* pk, const uint8_t* xs, const int32_t* off16, int64_t b0, int64_t b1,
                   O* y) {
  const int64_t tiles = (c.M + PACKED_TILE - 1) / PACKED_TILE;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t t = 0, m = 0; t < tiles; t++) {
      const int64_t rows = (c.M - m) / (tiles - t) + ((c.M - m) % (tiles - t) ? 1 : 0);
      auto tile = [&](auto r) {
        if constexpr (type32(QT) && WIDE) packed_tile32<QT, decltype(r)::value, O>(c, pk, xs, off16, m, b, y);
        else if constexpr (type32(QT)) packed_tile32_avx2<QT, decltype(r)::value, O>(c, pk, xs, off16, m, b, y);
        else if constexpr (WIDE) packed_tile<QT, decltype(r)::value, O>(c, pk, xs, off16, m, b, y);
        else packed_tile_avx2<QT, decltype(r)::value, O>(c, pk, xs, off16, m, b, y);
      };
      switch (rows) {
        case 9: tile(std::integral_constant<int, 9>()); break;
        case 8: tile(std::integral_constant<int, 8>()); break;
        case 7: tile(std::integral_constant<int, 7>()); break;
        case 6: tile(std::integral_constant<int, 6>()); break;
        case 5: tile(std::integral_constant<int, 5>()); break;
        case 4: tile(std::integral_constant<int, 4>()); break;
        case 3: tile(std::integral_constant<int, 3>()); break;
        case 2: tile(std::integral_constant<int, 2>()); break;
        default: tile(std::integral_constant<int, 1>()); break;
      }
      m += rows;
    }
}

// Packed (the prompt kernel's) for block b from pack()'s form: the bytes and floats pack16 makes from the file's blocks
// (the same values: d·sc and dmin·m exact; Q6_K's q − 32 and its mn from the same integers, the same float steps)
template <int QT>
VNNI_FN void unpack16(const Call& c, const uint8_t* pk, int64_t b, Packed& p) {
  const int64_t groups = c.K / 256, gb = packed_bytes(QT), h5 = high5(QT);
  const __m512i lo4 = _mm512_set1_epi8(15);
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* o = pk + (b * groups + g) * gb;
    uint8_t* q = p.q.data() + g * 64 * 64;  // quads 64g ..
    if constexpr (QT == Q6_K) {
      const __m512i k32 = _mm512_set1_epi8(32), ones = _mm512_set1_epi8(1);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + 3328)));
      __m512i sum = _mm512_setzero_si512();
      for (int j = 0; j < 16; j++) {
        __m512i w[4];
        q6_quads(o, j, w);
        __m512i tj = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
          const __m512i qs = _mm512_sub_epi8(w[k], k32);  // q − 32, signed
          _mm512_storeu_si512(q + (4 * j + k) * 64, qs);
          tj = _mm512_dpbusd_epi32(tj, ones, qs);  // Σ (q − 32) over the slot, per row
        }
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(o + 3072 + 16 * j)));
        sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(sc, tj));
        _mm512_storeu_ps(p.s.data() + (g * 16 + j) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
      }
      _mm512_storeu_ps(p.mn.data() + g * 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(128.f), d), _mm512_cvtepi32_ps(sum)));
    } else {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + h5 + 2304)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(o + h5 + 2336)));
      for (int j = 0; j < 8; j++) {
        __m512i hb = _mm512_setzero_si512();
        if constexpr (QT == Q5_K) hb = _mm512_loadu_si512(o + 2048 + 64 * j);
        for (int t = 0; t < 4; t++) {
          const __m512i v = _mm512_loadu_si512(o + (4 * j + t) * 64);
          __m512i w0 = _mm512_and_si512(v, lo4), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
          if constexpr (QT == Q5_K) fifth_bits(hb, w0, w1);
          _mm512_storeu_si512(q + (8 * j + 2 * t) * 64, w0);
          _mm512_storeu_si512(q + (8 * j + 2 * t + 1) * 64, w1);
        }
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(o + h5 + 2048 + 16 * j))));
        const __m512 mv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(o + h5 + 2176 + 16 * j))));
        _mm512_storeu_ps(p.s.data() + (g * 8 + j) * 16, _mm512_mul_ps(d, sc));
        _mm512_storeu_ps(p.mn.data() + (g * 8 + j) * 16, _mm512_mul_ps(dmin, mv));
      }
    }
  }
}

// unpack16 with AVX2: Packed (the AVX2 prompt kernel's) for block b from pack()'s form, the same bytes and floats
template <int QT>
AVX2_FN void unpack16_avx2(const Call& c, const uint8_t* pk, int64_t b, Packed& p) {
  const int64_t groups = c.K / 256, gb = packed_bytes(QT), h5 = high5(QT);
  const __m256i lo4 = _mm256_set1_epi8(15);
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* o = pk + (b * groups + g) * gb;
    uint8_t* q = p.q.data() + g * 64 * 64;  // quads 64g ..
    for (int h = 0; h < 2; h++) {
      if constexpr (QT == Q6_K) {
        const __m256i k32 = _mm256_set1_epi8(32), ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 3328 + 16 * h)));
        __m256i sum = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++) {
          __m256i w[4];
          q6_quads_avx2(o, j, h, w);
          __m256i tj = _mm256_setzero_si256();
          for (int k = 0; k < 4; k++) {
            const __m256i qs = _mm256_sub_epi8(w[k], k32);  // q − 32, signed
            _mm256_storeu_si256((__m256i*)(q + (4 * j + k) * 64 + 32 * h), qs);
            tj = _mm256_add_epi32(tj, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qs), ones16));  // Σ (q − 32)
          }
          const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(o + 3072 + 16 * j + 8 * h)));
          sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(sc, tj));
          _mm256_storeu_ps(p.s.data() + (g * 16 + j) * 16 + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
        }
        _mm256_storeu_ps(p.mn.data() + g * 16 + 8 * h,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(128.f), d), _mm256_cvtepi32_ps(sum)));
      } else {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + h5 + 2304 + 16 * h)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + h5 + 2336 + 16 * h)));
        for (int j = 0; j < 8; j++) {
          __m256i hb = _mm256_setzero_si256();
          if constexpr (QT == Q5_K) hb = _mm256_loadu_si256((const __m256i*)(o + 2048 + 64 * j + 32 * h));
          for (int t = 0; t < 4; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(o + (4 * j + t) * 64 + 32 * h));
            __m256i w0 = _mm256_and_si256(v, lo4), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            if constexpr (QT == Q5_K) fifth_bits_avx2(hb, w0, w1);
            _mm256_storeu_si256((__m256i*)(q + (8 * j + 2 * t) * 64 + 32 * h), w0);
            _mm256_storeu_si256((__m256i*)(q + (8 * j + 2 * t + 1) * 64 + 32 * h), w1);
          }
          const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(o + h5 + 2048 + 16 * j + 8 * h))));
          const __m256 mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(o + h5 + 2176 + 16 * j + 8 * h))));
          _mm256_storeu_ps(p.s.data() + (g * 8 + j) * 16 + 8 * h, _mm256_mul_ps(d, sc));
          _mm256_storeu_ps(p.mn.data() + (g * 8 + j) * 16 + 8 * h, _mm256_mul_ps(dmin, mv));
        }
      }
    }
  }
}
#endif  // QMM_X86

// The packed form of w [N, row_bytes] (the K-quants and the 32-element types, N a multiple of 16): [N / 16, K / G, packed_bytes] uint8
// (G: packed_group)
torch::Tensor pack(torch::Tensor w, int64_t qtype, int64_t N, int64_t K) {
  TORCH_CHECK(packable(qtype), "qmatmul.pack: the K-quants and the 32-element types only");
  const int64_t G = packed_group((int)qtype);
  TORCH_CHECK(N % 16 == 0 && K % G == 0, "qmatmul.pack: N must be a multiple of 16, K of ", G);
  const int64_t row_bytes = K / format_of(qtype).G * format_of(qtype).block_bytes;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() == N * row_bytes,
              "qmatmul.pack: w must hold N · ", row_bytes, " contiguous bytes");
  auto out = torch::empty({N / 16, K / G, packed_bytes((int)qtype)}, torch::kUInt8);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 16, 4, [&](int64_t b0, int64_t b1) { pack_rows(wp, (int)qtype, K, row_bytes, b0, b1, op); });
  return out;
}

// The file's blocks [N, row_bytes] of pack's form `packed`: unpack(pack(w)) is w
torch::Tensor unpack(torch::Tensor packed, int64_t qtype, int64_t N, int64_t K) {
  check_packed("qmatmul.unpack", packed, qtype, N, K);
  const int64_t row_bytes = K / format_of(qtype).G * format_of(qtype).block_bytes;
  auto out = torch::empty({N, row_bytes}, torch::kUInt8);
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 16, 4, [&](int64_t b0, int64_t b1) { unpack_rows(pp, (int)qtype, K, row_bytes, b0, b1, op); });
  return out;
}

// The SIMD path a call of mm_packed or mm_prompt runs: `path` (AUTO: the best here), AVX2 or AVX-512 VNNI
int simd_path(const char* who, int64_t path) {
  if (path == AUTO) path = best_path();
  TORCH_CHECK(path >= AVX2 && path <= best_path(), who, ": needs AVX2 or AVX-512 VNNI, path ", path,
              " does not run on this CPU");
  return (int)path;
}

// The 32-element types' x, every row (quantize_row32_avx512 / _avx2: the same values): xq [M, K], dx, off [M, K / 32],
// xsd [M, K / 32] (Q4_1, Q5_1; else not written)
void quantize32(const torch::Tensor& x, int64_t qtype, bool wide, int8_t* xq, float* dx, int32_t* off, float* xsd) {
#if QMM_X86
  const int64_t M = x.size(0), K = x.size(1), G = K / 32;
  at::parallel_for(0, M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m++) {
      float* xsdm = min32(qtype) ? xsd + m * G : nullptr;
      if (x.scalar_type() == at::kFloat) {
        const float* xm = x.data_ptr<float>() + m * K;
        if (wide) quantize_row32_avx512<float>(xm, K, offset32(qtype), xq + m * K, dx + m * G, off + m * G, xsdm);
        else quantize_row32_avx2<float>(xm, K, offset32(qtype), xq + m * K, dx + m * G, off + m * G, xsdm);
      } else {
        const c10::BFloat16* xm = x.data_ptr<c10::BFloat16>() + m * K;
        if (wide) quantize_row32_avx512<c10::BFloat16>(xm, K, offset32(qtype), xq + m * K, dx + m * G, off + m * G, xsdm);
        else quantize_row32_avx2<c10::BFloat16>(xm, K, offset32(qtype), xq + m * K, dx + m * G, off + m * G, xsdm);
      }
    }
  });
#endif
}

// y = x · Wᵀ (+ bias) from pack's form of W (AVX-512 VNNI or AVX2, the same values), any number of rows:
// x [..., K] fp32 or bf16 -> [..., N]
// prompt: a 32-element type's prompt on AVX-512 VNNI (mm_prompt: prompt32_avx512, the packed tiles' bits)
torch::Tensor packed_product(torch::Tensor x, torch::Tensor packed, int64_t qtype, int64_t N, int64_t K,
                             c10::optional<torch::Tensor> bias, int64_t path, bool prompt) {
  const char* who = prompt ? "qmatmul.mm_prompt" : "qmatmul.mm_packed";
  const Operands o = operands(who, x, packed, qtype, N, K, bias, true);
  const bool wide = simd_path(who, path) == AVX512VNNI;
  const bool q32 = type32(qtype);
  const int64_t M = o.M;
  auto out = torch::empty(o.shape, o.x.options());
  if (M == 0 || N == 0) return out;
  std::vector<int8_t> xq8(M * K);
  std::vector<float> dx(M * (K / packed_group((int)qtype))), xsd(q32 ? (min32(qtype) ? M * (K / 32) : 0) : M * s16(K));
  Call c{nullptr, N, K, M, 0, s16(K), (int)qtype, o.f, nullptr, xq8.data(), nullptr, nullptr, dx.data(), xsd.data(),
         o.bias.defined() ? o.bias.data_ptr<float>() : nullptr, nullptr, nullptr};
  // Q6_K: −32 · Σ x per 16 (its slots), the offset's; the 32-element types: −o · Σ x per 32
  std::vector<int32_t> off16(qtype == Q6_K ? M * (K / 16) : q32 ? M * (K / 32) : 0);
  if (q32) quantize32(o.x, qtype, wide, xq8.data(), dx.data(), off16.data(), xsd.data());
  if (!q32) {
    quantize_rows(o.x, c, wide ? AVX512VNNI : AVX2, nullptr, xq8.data(), nullptr, nullptr, dx.data(), xsd.data());
    for (int64_t i = 0; i < (int64_t)off16.size(); i++) {
      int32_t t = 0;
      for (int e = 0; e < 16; e++) t += xq8[16 * i + e];
      off16[i] = -32 * t;
    }
  }
#if QMM_X86
  const uint8_t* pk = packed.data_ptr<uint8_t>();
  const uint8_t* xs = (const uint8_t*)xq8.data();
  auto run = [&](auto* y) {
    using O = std::remove_pointer_t<decltype(y)>;
    if (prompt) {
      if (qtype == Q8_0) prompt32_avx512<Q8_0, O>(c, pk, xs, off16.data(), y);
      else if (qtype == Q4_0) prompt32_avx512<Q4_0, O>(c, pk, xs, off16.data(), y);
      else if (qtype == Q4_1) prompt32_avx512<Q4_1, O>(c, pk, xs, off16.data(), y);
      else if (qtype == Q5_0) prompt32_avx512<Q5_0, O>(c, pk, xs, off16.data(), y);
      else prompt32_avx512<Q5_1, O>(c, pk, xs, off16.data(), y);
      return;
    }
    chunks(N / 16, 1, [&](int64_t b0, int64_t b1) {
      if (qtype == Q8_0) (wide ? packed_blocks<Q8_0, O, true> : packed_blocks<Q8_0, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q4_0) (wide ? packed_blocks<Q4_0, O, true> : packed_blocks<Q4_0, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q4_1) (wide ? packed_blocks<Q4_1, O, true> : packed_blocks<Q4_1, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q5_0) (wide ? packed_blocks<Q5_0, O, true> : packed_blocks<Q5_0, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q5_1) (wide ? packed_blocks<Q5_1, O, true> : packed_blocks<Q5_1, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q6_K) (wide ? packed_blocks<Q6_K, O, true> : packed_blocks<Q6_K, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else if (qtype == Q5_K) (wide ? packed_blocks<Q5_K, O, true> : packed_blocks<Q5_K, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
      else (wide ? packed_blocks<Q4_K, O, true> : packed_blocks<Q4_K, O, false>)(c, pk, xs, off16.data(), b0, b1, y);
    });
  };
  if (o.x.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run((uint16_t*)out.data_ptr<c10::BFloat16>());
#endif
  return out;
}

torch::Tensor mm_packed(torch::Tensor x, torch::Tensor packed, int64_t qtype, int64_t N, int64_t K,
                        c10::optional<torch::Tensor> bias, int64_t path) {
  return packed_product(x, packed, qtype, N, K, bias, path, false);
}

// A prompt's product, Q4_K / Q5_K / Q6_K on AVX-512 VNNI or AVX2 (see above), the 32-element types from the packed
// form on AVX-512 VNNI (packed_product: prompt32_avx512, mm_packed's bits); x [..., K] fp32 or bf16 -> [..., N] in x's dtype.
// packed: pack()'s form of w, read instead (the same values; w is then not read), or undefined. path: simd_path's.
torch::Tensor mm_prompt(torch::Tensor x, torch::Tensor w, int64_t qtype, int64_t N, int64_t K,
                        c10::optional<torch::Tensor> bias, c10::optional<torch::Tensor> packed, int64_t path_asked) {
  const int path = simd_path("qmatmul.mm_prompt", path_asked);
  TORCH_CHECK(N % 16 == 0, "qmatmul.mm_prompt: N must be a multiple of 16");
  const bool from_packed = packed && packed->defined();  // then w is not read (it may be empty)
  const bool wide = path == AVX512VNNI;
  TORCH_CHECK(qtype == Q4_K || qtype == Q5_K || qtype == Q6_K || (type32(qtype) && from_packed && wide),
              "qmatmul.mm_prompt: Q4_K, Q5_K or Q6_K, or a 32-element type from the packed form on AVX-512 VNNI");
  if (type32(qtype)) return packed_product(x, *packed, qtype, N, K, bias, path, true);
  const Operands o = operands("qmatmul.mm_prompt", x, from_packed ? *packed : w, qtype, N, K, bias, from_packed);
  const int64_t M = o.M;
  auto out = torch::empty(o.shape, o.x.options());  // written in x's dtype by the tiles
  std::vector<int8_t> xq8(M * K);
  std::vector<float> dx(M * (K / 256)), xsd(M * s16(K));
  Call c{from_packed ? nullptr : w.data_ptr<uint8_t>(), N, K, M, o.row_bytes, s16(K), (int)qtype, o.f, nullptr,
         xq8.data(), nullptr, nullptr, dx.data(), xsd.data(), o.bias.defined() ? o.bias.data_ptr<float>() : nullptr,
         nullptr};
  // Q6_K: x + 128 as unsigned bytes (mm's xu), in place of xq8
  quantize_rows(o.x, c, path, nullptr, xq8.data(), nullptr, qtype == Q6_K && wide ? (uint8_t*)xq8.data() : nullptr,
                dx.data(), xsd.data());
  if (qtype == Q6_K && !wide)
    for (auto& v : xq8) v = (int8_t)((uint8_t)v ^ 0x80);
  const uint8_t* pk = from_packed ? packed->data_ptr<uint8_t>() : nullptr;
#if QMM_X86
  auto run = [&](auto* y) {
    using O = std::remove_pointer_t<decltype(y)>;
    if (qtype == Q6_K) {  // the offset per group: dx
      if (wide) prompt_avx512<Q6_K, O>(c, xq8.data(), dx.data(), dx.data(), K / 256, K / 256, y, pk);
      else prompt_avx2<Q6_K, O>(c, xq8.data(), dx.data(), dx.data(), K / 256, K / 256, y, pk);
    } else if (qtype == Q5_K) {
      if (wide) prompt_avx512<Q5_K, O>(c, xq8.data(), dx.data(), xsd.data(), K / 32, s16(K), y, pk);
      else prompt_avx2<Q5_K, O>(c, xq8.data(), dx.data(), xsd.data(), K / 32, s16(K), y, pk);
    } else {
      if (wide) prompt_avx512<Q4_K, O>(c, xq8.data(), dx.data(), xsd.data(), K / 32, s16(K), y, pk);
      else prompt_avx2<Q4_K, O>(c, xq8.data(), dx.data(), xsd.data(), K / 32, s16(K), y, pk);
    }
  };
  if (o.x.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run((uint16_t*)out.data_ptr<c10::BFloat16>());
#endif
  return out;
}

std::string backend() { return path_name(best_path()); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "y = x · Wᵀ (+ bias), W in GGUF blocks");
  m.def("dequantize", &dequantize, "the weights as the file means them, into out [N, K] fp32 or bf16");
  m.def("mm_prompt", &mm_prompt, "a prompt's product (Q4_K, Q5_K, Q6_K; AVX-512 VNNI or AVX2)", py::arg("x"),
        py::arg("w"), py::arg("qtype"), py::arg("N"), py::arg("K"), py::arg("bias"), py::arg("packed") = py::none(),
        py::arg("path") = 0);
  m.def("pack", &pack, "the packed form of K-quant and 32-element weights, for mm_packed");
  m.def("unpack", &unpack, "the file's blocks back from pack's form");
  m.def("mm_packed", &mm_packed, "y = x · Wᵀ (+ bias) from pack's form (AVX-512 VNNI or AVX2)", py::arg("x"),
        py::arg("packed"), py::arg("qtype"), py::arg("N"), py::arg("K"), py::arg("bias"), py::arg("path") = 0);
  m.def("backend", &backend, "the SIMD path this CPU runs");
  m.def("best_path", &best_path, "its number (1 portable, 2 AVX2, 3 AVX-512 VNNI)");
}
