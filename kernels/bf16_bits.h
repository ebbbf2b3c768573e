// The bf16 bits of fp32 values, rounded as c10::BFloat16 rounds them: to nearest, ties to even (the top 16 bits after
// adding 0x7FFF and the lowest bit kept), a NaN as 0x7FC0. One rule for every kernel that writes bf16 from vector
// lanes (qmatmul, float_rows, int8_rows); scalar code calls c10::BFloat16 itself. Included by those sources (their
// build key hashes it too: kernels/cpp.py).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define BF16_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl")))
#define BF16_AVX2_FN __attribute__((target("avx2")))

// 16 finite values, each in its 32-bit lane's low half (a NaN comes out as some other NaN: bf16_c10 mends it)
BF16_AVX512_FN inline __m512i bf16_rne32(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
}

BF16_AVX512_FN inline __m256i bf16_rne(__m512 v) { return _mm512_cvtepi32_epi16(bf16_rne32(v)); }  // finite values

BF16_AVX512_FN inline __m512i bf16_c10_32(__m512 v) {  // any values, each in its 32-bit lane's low half
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(bf16_rne32(v), nan, _mm512_set1_epi32(0x7FC0));
}

BF16_AVX512_FN inline __m256i bf16_c10(__m512 v) { return _mm512_cvtepi32_epi16(bf16_c10_32(v)); }  // any values

// 8 finite values, each in its 32-bit lane's low half (bf16_rne32's rule, AVX2)
BF16_AVX2_FN inline __m256i bf16_rne32_8(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
}

BF16_AVX2_FN inline __m256i bf16_c10_32_8(__m256 v) {  // 8 of any values, each in its 32-bit lane's low half, AVX2
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(bf16_rne32_8(v), _mm256_set1_epi32(0x7FC0), nan);
}

BF16_AVX512_FN inline __m128i bf16_c10_8(__m256 v) { return _mm256_cvtepi32_epi16(bf16_c10_32_8(v)); }  // any values, 8

BF16_AVX2_FN inline __m128i bf16_rne8(__m256 v) {  // 8 finite values, AVX2
  const __m256i r = bf16_rne32_8(v);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}
#endif
