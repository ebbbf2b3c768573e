// 16 fp32 lanes as one zmm (AVX-512) or two ymm (AVX2 with FMA), whichever the build's CPU has (its flags are in
// the build key: kernels/cpp.py), and the operations the row kernels compose from them (rows_attention, layer_ops).
// Each is the same IEEE operation in every lane, so both widths give the same bits; without either SIMD16 is 0 and
// the kernels' plain loops run. bf16 is read widened exactly and written rounded as c10::BFloat16 rounds
// (bf16_bits.h).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#include "bf16_bits.h"
#define SIMD16 1

namespace {  // each kernel's own copy (its module may sit beside another built for other flags)

#if defined(__AVX512F__)
constexpr int ACCS = 24;  // accumulators the 32 zmm registers hold beside their operands
struct V { __m512 a; };
inline V vset(float x) { return {_mm512_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vload(const c10::BFloat16* p) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16))};
}
inline V vload(const int8_t* p) { return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))}; }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v.a); }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.a, b.a, c.a)}; }
inline V vadd(V a, V b) { return {_mm512_add_ps(a.a, b.a)}; }
inline V vmax(V x, V m) { return {_mm512_max_ps(x.a, m.a)}; }  // x > m ? x : m (NaN x: m)
// whether v, one value broadcast, has a bit set (a k-mask: all lanes or none): v ≠ 0 for a value that is never −0
using Live = __mmask16;
inline Live vlive(V e) { return _mm512_test_epi32_mask(_mm512_castps_si512(e.a), _mm512_castps_si512(e.a)); }
inline V vfma_if(Live live, V a, V b, V c) {  // c where !live
  return {_mm512_mask3_fmadd_ps(a.a, b.a, c.a, live)};
}
inline V vmul(V a, V b) { return {_mm512_mul_ps(a.a, b.a)}; }
inline V vsub(V a, V b) { return {_mm512_sub_ps(a.a, b.a)}; }
inline V vdiv(V a, V b) { return {_mm512_div_ps(a.a, b.a)}; }
inline V vround(V a) { return {_mm512_roundscale_ps(a.a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V vpow2(V n) {  // 2ⁿ for integral n in the normal range
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.a), _mm512_set1_epi32(127)), 23))};
}
inline V vmul_live(V x, V p, V two_n) {  // p · 2ⁿ where x > −87.3, else 0
  return {_mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x.a, _mm512_set1_ps(-87.3f), _CMP_GT_OQ), p.a, two_n.a)};
}
inline __m256 half_sum(V v) { return _mm256_add_ps(_mm512_castps512_ps256(v.a), _mm512_extractf32x8_ps(v.a, 1)); }
inline V vload(const uint16_t* p) {  // bf16 bits, widened exactly
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16))};
}
inline void vstore(uint16_t* p, V v) { _mm256_storeu_si256((__m256i*)p, bf16_c10(v.a)); }  // rounded to bf16
inline V vbf16(V v) { return {_mm512_castsi512_ps(_mm512_slli_epi32(bf16_c10_32(v.a), 16))}; }  // the bf16 value
inline V vneg_abs(V v) { return {_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v.a), _mm512_set1_epi32(INT32_MIN)))}; }
inline V vif_nonneg(V g, V a, V b) {  // g ≥ 0 ? b : a
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(g.a, _mm512_setzero_ps(), _CMP_GE_OQ), a.a, b.a)};
}
#else
constexpr int ACCS = 6;  // the 16 ymm registers: six two-ymm accumulators beside their operands
struct V { __m256 lo, hi; };  // lanes 0–7, 8–15
inline V vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf8(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline V vload(const c10::BFloat16* p) { return {bf8(p), bf8(p + 8)}; }
inline __m256 i8x8(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
inline V vload(const int8_t* p) { return {i8x8(p), i8x8(p + 8)}; }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V vmax(V x, V m) { return {_mm256_max_ps(x.lo, m.lo), _mm256_max_ps(x.hi, m.hi)}; }  // x > m ? x : m
using Live = bool;
inline Live vlive(V e) { return _mm256_cvtss_f32(e.lo) != 0.f; }
inline V vfma_if(Live live, V a, V b, V c) {  // c where !live
  return live ? vfma(a, b, c) : c;
}
inline V vmul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V vsub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V vdiv(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V vround(V a) {
  constexpr int R = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, R), _mm256_round_ps(a.hi, R)};
}
inline __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline V vpow2(V n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
inline __m256 live8(__m256 x, __m256 p, __m256 two_n) {
  return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GT_OQ), _mm256_mul_ps(p, two_n));
}
inline V vmul_live(V x, V p, V two_n) { return {live8(x.lo, p.lo, two_n.lo), live8(x.hi, p.hi, two_n.hi)}; }
inline V vload(const uint16_t* p) { return vload((const c10::BFloat16*)p); }  // bf16 bits, widened exactly
inline void vstore(uint16_t* p, V v) {  // rounded to bf16
  for (int h = 0; h < 2; h++) {
    const __m256i r = bf16_c10_32_8(h ? v.hi : v.lo);
    _mm_storeu_si128((__m128i*)(p + 8 * h), _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08)));
  }
}
inline V vbf16(V v) {  // the bf16 value
  return {_mm256_castsi256_ps(_mm256_slli_epi32(bf16_c10_32_8(v.lo), 16)), _mm256_castsi256_ps(_mm256_slli_epi32(bf16_c10_32_8(v.hi), 16))};
}
inline V vneg_abs(V v) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  return {_mm256_or_ps(v.lo, sign), _mm256_or_ps(v.hi, sign)};
}
inline V vif_nonneg(V g, V a, V b) {  // g ≥ 0 ? b : a
  const __m256 z = _mm256_setzero_ps();
  return {_mm256_blendv_ps(a.lo, b.lo, _mm256_cmp_ps(g.lo, z, _CMP_GE_OQ)), _mm256_blendv_ps(a.hi, b.hi, _mm256_cmp_ps(g.hi, z, _CMP_GE_OQ))};
}
inline __m256 half_sum(V v) { return _mm256_add_ps(v.lo, v.hi); }
#endif
inline float vsum(V v) {  // tree16: (a_l + a_l+8), then + 4, + 2, + 1
  const __m256 b = half_sum(v);
  __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  c = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

}  // namespace
#else
#define SIMD16 0
#endif
