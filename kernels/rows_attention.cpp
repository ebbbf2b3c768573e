// Attention of a few query rows over a KV cache, each row computed alone, on a CPU: out = softmax(s) · V with
// s_j = scale · q · k_j over the keys row r may see. The torch reference is rows_attention.py's reference().
//
// The arithmetic, for one (batch b, head h, row r); it is the same sequence whatever T, the other rows, the heads
// or the thread count, so a pass's row has the bits of a one-token step at the same position:
//
//   keys        j < end_r (causal: end_r = S − (T − 1 − r), the keys a step at that position sees; else S) and
//               mask[b, h, r, j] shown (bool: true; float: added to s_j, −inf hides)
//   s_j         16 lane sums over d with d mod 16 = l, each a chain of fma(q_d, k_jd, ·) in d order, then
//               tree16 (a_l + a_l+8, then + 4, + 2, + 1); times scale; + mask
//   softmax     m = max s_j;  e_j = exp(s_j − m) (exp_poly, below);  l = tree16 of 16 lane sums of e_j, j mod 16
//   out_d       Σ e_j · v_jd as a chain of fma in j order, then / l; 0 where no key is shown
//
// q, K and V are read in their own dtype (fp32 or bf16, widened exactly). Rows are spread over threads; one row is
// computed by one thread. GQA: head h reads KV head h / (H / KVH).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) {  // exact
  uint32_t bits = (uint32_t)v.x << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float tree16(const float* a) {
  float b[8], c[4];
  for (int l = 0; l < 8; l++) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) c[l] = b[l] + b[l + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// exp(x) for x ≤ 0 (0 below −87.3): x = n·ln2 + t, |t| ≤ ln2/2, exp(t) by a degree-6 polynomial (within 2 ulp),
// times 2ⁿ built in the exponent bits. Plain float operations: the compiler vectorizes the loop that calls it.
inline float exp_poly(float x) {
  if (!(x > -87.3f)) return 0.f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float t = std::fma(n, -0.693145751953125f, x);
  t = std::fma(n, -1.428606765330187e-06f, t);
  float p = 1.f / 720;
  p = std::fma(p, t, 1.f / 120);
  p = std::fma(p, t, 1.f / 24);
  p = std::fma(p, t, 1.f / 6);
  p = std::fma(p, t, 0.5f);
  p = std::fma(p, t, 1.f);
  p = std::fma(p, t, 1.f);
  const int32_t e = ((int32_t)n + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &e, 4);
  return p * two_n;
}

// SIMD: 16 lanes as one zmm (AVX-512) or two ymm (AVX2 with FMA), whichever this build's CPU has (the build key
// holds its flags). Lane l of a dot is the chain of fma over d ≡ l (mod 16), then vsum's fixed reduction; vexp is
// exp_poly lane by lane. Without either, the plain loops below run.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define SIMD16 1
#if defined(__AVX512F__)
constexpr int KEYS = 2;  // keys per step of the grouped dot: 2 · G chains in 32 registers
struct V { __m512 a; };
inline V vset(float x) { return {_mm512_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vload(const c10::BFloat16* p) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16))};
}
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v.a); }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.a, b.a, c.a)}; }
inline V vadd(V a, V b) { return {_mm512_add_ps(a.a, b.a)}; }
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
#else
constexpr int KEYS = 1;  // 16 ymm registers: one key at a time
struct V { __m256 lo, hi; };  // lanes 0–7, 8–15
inline V vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf8(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline V vload(const c10::BFloat16* p) { return {bf8(p), bf8(p + 8)}; }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
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
inline __m256 half_sum(V v) { return _mm256_add_ps(v.lo, v.hi); }
#endif
inline float vsum(V v) {  // tree16: (a_l + a_l+8), then + 4, + 2, + 1
  const __m256 b = half_sum(v);
  __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  c = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
inline V vexp(V x) {  // exp_poly's operations
  const V n = vround(vmul(x, vset(1.44269504088896341f)));
  V t = vfma(n, vset(-0.693145751953125f), x);
  t = vfma(n, vset(-1.428606765330187e-06f), t);
  V p = vset(1.f / 720);
  for (float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = vfma(p, t, vset(c));
  return vmul_live(x, p, vpow2(n));
}
#endif

struct Args {
  int64_t B, H, KVH, T, S, D;
  float scale;
  bool causal;
  const void *q, *k, *v, *mask;  // mask: nullptr, bool or float
  bool mask_bool;
  int64_t qs[3], ks[3], vs[3], ms[4];  // strides (elements): q [B, H, T], k/v [B, KVH, S], mask [B, H, T, S]
  void* out;                           // [B, T, H, D] contiguous, q's dtype
};

// s[j] = q · k_j for j < end (a hidden key's too: the mask drops it after), q widened in qf
template <typename TK>
void dots(const float* qf, const TK* k, int64_t kstride, int64_t end, int64_t D, float* s) {
  int64_t j0 = 0;
#if SIMD16
  if (D % 16 == 0)
    for (; j0 + 4 <= end; j0 += 4) {  // four keys at a time: four independent chains
      V acc[4] = {vset(0.f), vset(0.f), vset(0.f), vset(0.f)};
      for (int64_t d = 0; d < D; d += 16) {
        const V qv = vload(qf + d);
        for (int i = 0; i < 4; i++) acc[i] = vfma(qv, vload(k + (j0 + i) * kstride + d), acc[i]);
      }
      for (int i = 0; i < 4; i++) s[j0 + i] = vsum(acc[i]);
    }
#endif
  for (int64_t j = j0; j < end; j++) {
    const TK* kj = k + j * kstride;
    float lanes[16] = {0.f};
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
      for (int l = 0; l < 16; l++) lanes[l] = std::fma(qf[d + l], widen(kj[d + l]), lanes[l]);
    for (; d < D; d++) lanes[d % 16] = std::fma(qf[d], widen(kj[d]), lanes[d % 16]);
#if SIMD16
    if (D % 16 == 0) {  // the SIMD reduction, as the four-key loop's
      s[j] = vsum(vload(lanes));
      continue;
    }
#endif
    s[j] = tree16(lanes);
  }
}

// s[j] = s[j] · scale + mask (−inf where hidden), then exp(s[j] − max) in place; -> l = Σ e_j (0: nothing shown)
float softmax_terms(const Args& a, int64_t mrow, int64_t end, float* s) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float m = ninf;
  for (int64_t j = 0; j < end; j++) {
    float add = 0.f;
    if (a.mask) {
      if (a.mask_bool) {
        if (!((const bool*)a.mask)[mrow + j * a.ms[3]]) { s[j] = ninf; continue; }
      } else {
        add = ((const float*)a.mask)[mrow + j * a.ms[3]];
        if (add == ninf) { s[j] = ninf; continue; }
      }
    }
    const float sj = s[j] * a.scale + add;
    s[j] = sj;
    m = sj > m ? sj : m;
  }
  if (m == ninf) {
    for (int64_t j = 0; j < end; j++) s[j] = 0.f;
    return 0.f;
  }
  alignas(64) float lanes[16] = {0.f};
  int64_t J = 0;
#if SIMD16
  J = end / 16 * 16;
  V sum = vset(0.f);
  for (int64_t j = 0; j < J; j += 16) {
    const V e = vexp(vsub(vload(s + j), vset(m)));
    vstore(s + j, e);
    sum = vadd(sum, e);
  }
  vstore(lanes, sum);
#endif
  for (int64_t j = J; j < end; j++) s[j] = exp_poly(s[j] - m), lanes[j % 16] += s[j];
  return tree16(lanes);
}

// The rows (b, h, r) for the G heads h0 … h0 + G − 1 (one KV head's, or some of them), row r: each head's values
// as alone. With SIMD (D a multiple of 16, at most 256) the heads share each key's and value's loads.
template <typename TQ, typename TK, int G>
void heads_row(const Args& a, int64_t b, int64_t h0, int64_t r, float* s, float* qf, float* o) {
  const int64_t D = a.D, kvh = h0 / (a.H / a.KVH);
  const int64_t end = a.causal ? a.S - (a.T - 1 - r) : a.S;
  const TK* k = (const TK*)a.k + b * a.ks[0] + kvh * a.ks[1];
  const TK* v = (const TK*)a.v + b * a.vs[0] + kvh * a.vs[1];
  for (int g = 0; g < G; g++) {
    const TQ* q = (const TQ*)a.q + b * a.qs[0] + (h0 + g) * a.qs[1] + r * a.qs[2];
    for (int64_t d = 0; d < D; d++) qf[g * D + d] = widen(q[d]);
  }
  int64_t j0 = 0;
#if SIMD16
  if (D % 16 == 0 && G > 1)
    for (; j0 + KEYS <= end; j0 += KEYS) {  // KEYS keys, each loaded once for the G heads: KEYS · G chains
      V acc[KEYS][G];
      for (int i = 0; i < KEYS; i++)
        for (int g = 0; g < G; g++) acc[i][g] = vset(0.f);
      for (int64_t d = 0; d < D; d += 16) {
        V kv[KEYS];
        for (int i = 0; i < KEYS; i++) kv[i] = vload(k + (j0 + i) * a.ks[2] + d);
        for (int g = 0; g < G; g++) {
          const V qv = vload(qf + g * D + d);
          for (int i = 0; i < KEYS; i++) acc[i][g] = vfma(qv, kv[i], acc[i][g]);
        }
      }
      for (int g = 0; g < G; g++)
        for (int i = 0; i < KEYS; i++) s[g * a.S + j0 + i] = vsum(acc[i][g]);
    }
#endif
  float l[G];
  for (int g = 0; g < G; g++) {  // the keys left (all of them without SIMD), then each head's softmax terms
    dots<TK>(qf + g * D, k + j0 * a.ks[2], a.ks[2], end - j0, D, s + g * a.S + j0);
    l[g] = softmax_terms(a, b * a.ms[0] + (h0 + g) * a.ms[1] + r * a.ms[2], end, s + g * a.S);
  }
  // out_d = Σ_j e_j · v_jd, a chain of fma in j order; a key no head shows is skipped (its e_j are 0, and its V
  // may be anything: a padded slot's)
  bool done = false;
#if SIMD16
  if (D % 16 == 0 && D <= 256) {
    constexpr int REGS = KEYS == 2 ? 24 : 6;  // accumulators the registers hold (AVX2: a V is two of 16)
    constexpr int CB = REGS / G >= 8 ? 8 : REGS / G >= 1 ? REGS / G : 1;  // 16-wide chunks of out at a time
    for (int64_t c0 = 0; c0 < D / 16; c0 += CB) {
      const int cn = (int)std::min<int64_t>(CB, D / 16 - c0);
      V acc[G][CB];
      for (int g = 0; g < G; g++)
        for (int c = 0; c < CB; c++) acc[g][c] = vset(0.f);
      for (int64_t j = 0; j < end; j++) {
        bool any = false;
        for (int g = 0; g < G; g++) any |= s[g * a.S + j] != 0.f;
        if (!any) continue;
        const TK* vj = v + j * a.vs[2] + 16 * c0;
        V e[G];
        for (int g = 0; g < G; g++) e[g] = vset(s[g * a.S + j]);
        for (int c = 0; c < CB; c++) {
          if (c >= cn) break;
          const V vv = vload(vj + 16 * c);
          for (int g = 0; g < G; g++) acc[g][c] = vfma(e[g], vv, acc[g][c]);
        }
      }
      for (int g = 0; g < G; g++)
        for (int c = 0; c < cn; c++)
          vstore(o + g * D + 16 * (c0 + c), l[g] == 0.f ? vset(0.f) : vdiv(acc[g][c], vset(l[g])));
    }
    done = true;
  }
#endif
  if (!done)
    for (int g = 0; g < G; g++) {
      float* og = o + g * D;
      const float* sg = s + g * a.S;
      for (int64_t d = 0; d < D; d++) og[d] = 0.f;
      for (int64_t j = 0; j < end; j++) {
        if (sg[j] == 0.f) continue;
        const TK* vj = v + j * a.vs[2];
        for (int64_t d = 0; d < D; d++) og[d] = std::fma(sg[j], widen(vj[d]), og[d]);
      }
      for (int64_t d = 0; d < D; d++) og[d] = l[g] == 0.f ? 0.f : og[d] / l[g];
    }
  for (int g = 0; g < G; g++) {
    TQ* out = (TQ*)a.out + ((b * a.T + r) * a.H + h0 + g) * D;
    for (int64_t d = 0; d < D; d++) out[d] = (TQ)o[g * D + d];
  }
}

constexpr int MAX_G = 8;

template <typename TQ, typename TK>
void heads_row_g(int G, const Args& a, int64_t b, int64_t h0, int64_t r, float* s, float* qf, float* o) {
  switch (G) {
    case 8: return heads_row<TQ, TK, 8>(a, b, h0, r, s, qf, o);
    case 7: return heads_row<TQ, TK, 7>(a, b, h0, r, s, qf, o);
    case 6: return heads_row<TQ, TK, 6>(a, b, h0, r, s, qf, o);
    case 5: return heads_row<TQ, TK, 5>(a, b, h0, r, s, qf, o);
    case 4: return heads_row<TQ, TK, 4>(a, b, h0, r, s, qf, o);
    case 3: return heads_row<TQ, TK, 3>(a, b, h0, r, s, qf, o);
    case 2: return heads_row<TQ, TK, 2>(a, b, h0, r, s, qf, o);
    default: return heads_row<TQ, TK, 1>(a, b, h0, r, s, qf, o);
  }
}

template <typename TQ, typename TK>
void run(const Args& a) {
  // heads in groups of G sharing a KV head (G: the largest divisor of H / KVH up to MAX_G); one head at a time
  // where the mask differs by head (a key hidden for one head only must not reach the others' sums)
  int G = 1;
  if (a.ms[1] == 0)
    for (int g = MAX_G; g > 1; g--)
      if ((a.H / a.KVH) % g == 0) { G = g; break; }
  const int64_t groups = a.H / G;
  at::parallel_for(0, a.B * groups * a.T, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(G * a.S), qf(G * a.D), o(G * a.D);
    for (int64_t i = i0; i < i1; i++) {
      const int64_t r = i % a.T, hg = (i / a.T) % groups, b = i / (a.T * groups);
      heads_row_g<TQ, TK>(G, a, b, hg * G, r, s.data(), qf.data(), o.data());
    }
  });
}

// q [B, H, T, D]; k, v [B, KVH, S, D] (each with its last dim contiguous; fp32 or bf16, k and v alike);
// mask [B, 1 | H, 1 | T, S] bool or fp32, or none; -> out [B, T, H, D] in q's dtype.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "rows_attention: q, k, v must be 4-d");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KVH = k.size(1), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == KVH && v.size(2) == S && k.size(3) == D &&
              v.size(3) == D && KVH > 0 && H % KVH == 0, "rows_attention: shapes do not match");
  TORCH_CHECK(!causal || T <= S, "rows_attention: more causal rows than keys");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "rows_attention: k and v must share a dtype");
  for (auto* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16, "rows_attention: fp32 or bf16");
    if (t->stride(3) != 1) *t = t->contiguous();
  }
  auto out = torch::empty({B, T, H, D}, q.options());
  Args a{B, H, KVH, T, S, D, (float)scale, causal, q.data_ptr(), k.data_ptr(), v.data_ptr(), nullptr, false,
         {q.stride(0), q.stride(1), q.stride(2)}, {k.stride(0), k.stride(1), k.stride(2)},
         {v.stride(0), v.stride(1), v.stride(2)}, {0, 0, 0, 0}, out.data_ptr()};
  torch::Tensor m;
  if (mask && mask->defined()) {
    m = *mask;
    TORCH_CHECK(m.dim() == 4 && m.size(-1) == S, "rows_attention: the mask must be [B, 1 | H, 1 | T, S]");
    if (m.scalar_type() != at::kBool) m = m.to(at::kFloat);
    m = m.expand({B, H, T, S});
    a.mask = m.data_ptr();
    a.mask_bool = m.scalar_type() == at::kBool;
    for (int i = 0; i < 4; i++) a.ms[i] = m.stride(i);
  }
  if (B * H * T == 0) return out;
  const bool qb = q.scalar_type() == at::kBFloat16, kb = k.scalar_type() == at::kBFloat16;
  if (qb && kb) run<c10::BFloat16, c10::BFloat16>(a);
  else if (qb) run<c10::BFloat16, float>(a);
  else if (kb) run<float, c10::BFloat16>(a);
  else run<float, float>(a);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "attention of a few query rows, each computed alone");
}
