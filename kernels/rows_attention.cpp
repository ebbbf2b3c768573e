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
//   softmax     m = max s_j;  e_j = exp(s_j − m) (exp_poly, below);  l = tree16 of 16 lane sums of e_j, a shown
//               key's lane its rank among the shown keys mod 16 (so hidden slots, a batch's left padding or the
//               holes of its rejected draft tokens, leave l as the row without them has it)
//   out_d       Σ e_j · v_jd as a chain of fma in j order over the keys with e_j ≠ 0, then / l; 0 where no key is
//               shown
//
// q, K and V are read in their own dtype (fp32 or bf16; K and V also int8: a caller's per-channel scales folded into q
// and the output), widened exactly. Given those scales (qscale, oscale [B, H, D] fp32), q_d is widen(q_d) · qscale_d
// and out_d is o_d · oscale_d, each one fp32 multiplication, then q's dtype: torch's (q * qscale) then
// (attend(·) * oscale).to(q.dtype), in one call. GQA: head h reads KV head h / (H / KVH).
// The work: groups of (the heads of one KV head) × (a block of rows), spread over threads, each computed by one
// thread; a group's members share the loads of K and V (and, with AVX-512, the reductions of 16 keys' dots),
// never an operation of their arithmetic.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "aligned64.h"  // Aligned64
#include "simd16.h"  // V, vset, vload, vfma, vsum, ...

namespace {

// How far ahead of the keys and values being read they are fetched: a [4, 8, 1 500, 64] bf16 cross-attention, 6
// layers from memory, took 2.39 ms fetching the next 2 KB, 1.94 at 16 KB (T = 1; T = 2, 5: 1.2x as well; one process,
// interleaved, AMD EPYC Zen 5); an fp32 K/V reads twice the bytes a key: the same distance in bytes
constexpr int64_t AHEAD_BYTES = 16384;
inline int64_t ahead_keys(int64_t unit_bytes) { return std::max<int64_t>(1, AHEAD_BYTES / unit_bytes); }

inline float widen(float v) { return v; }
inline float widen(int8_t v) { return (float)v; }  // exact
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

// SIMD16 (simd16.h): 16 lanes as one zmm or two ymm. Lane l of a dot is the chain of fma over d ≡ l (mod 16), then
// vsum's fixed reduction; vexp is exp_poly lane by lane. Without SIMD16, the plain loops below run.
#if SIMD16
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
  const float *qscale, *oscale;  // [B, H, D] contiguous, or nullptr
  int64_t qs[3], ks[3], vs[3], ms[4];  // strides (elements): q [B, H, T], k/v [B, KVH, S], mask [B, H, T, S]
  void* out;                           // [B, T, H, D] contiguous, q's dtype
};

// s[j] = q · k_j for j < end (a hidden key's too: the mask drops it after), q widened in qf; key by key (the keys
// after the last full block of group(), or all of them where D % 16 ≠ 0 or without SIMD)
template <typename TK>
void dots(const float* qf, const TK* k, int64_t kstride, int64_t end, int64_t D, float* s) {
  for (int64_t j = 0; j < end; j++) {
    const TK* kj = k + j * kstride;
    float lanes[16] = {0.f};
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
      for (int l = 0; l < 16; l++) lanes[l] = std::fma(qf[d + l], widen(kj[d + l]), lanes[l]);
    for (; d < D; d++) lanes[d % 16] = std::fma(qf[d], widen(kj[d]), lanes[d % 16]);
#if SIMD16
    if (D % 16 == 0) {  // the SIMD reduction, as the blocks'
      s[j] = vsum(vload(lanes));
      continue;
    }
#endif
    s[j] = tree16(lanes);
  }
}

// e_j = exp(x_j − m) in place for j < n; -> l = tree16 of the 16 lane sums, e_j in lane j mod 16
float exp_terms(float* x, int64_t n, float m) {
  alignas(64) float lanes[16] = {0.f};
  int64_t J = 0;
#if SIMD16
  J = n / 16 * 16;
  V sum = vset(0.f);
  for (int64_t j = 0; j < J; j += 16) {
    const V e = vexp(vsub(vload(x + j), vset(m)));
    vstore(x + j, e);
    sum = vadd(sum, e);
  }
  vstore(lanes, sum);
#endif
  for (int64_t j = J; j < n; j++) x[j] = exp_poly(x[j] - m), lanes[j % 16] += x[j];
  return tree16(lanes);
}

// s[j] = s[j] · scale + mask (−inf where hidden), then exp(s[j] − max) in place (0 where hidden); -> l = Σ e_j
// (0: nothing shown). shown: room for `end` floats, the shown keys' terms side by side
float softmax_terms(const Args& a, int64_t mrow, int64_t end, float* s, float* shown) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (a.mask && a.mask_bool)
    for (int64_t j = 0; j < end; j++) s[j] = ((const bool*)a.mask)[mrow + j * a.ms[3]] ? s[j] * a.scale + 0.f : ninf;
  else if (a.mask)
    for (int64_t j = 0; j < end; j++) {
      const float add = ((const float*)a.mask)[mrow + j * a.ms[3]];
      s[j] = add == ninf ? ninf : s[j] * a.scale + add;
    }
  // m = max s_j, a NaN ignored, in 16 lanes (the max of the same values whatever their order; of +0 and −0 either,
  // which gives the same e_j); without a mask, s_j · scale + 0 on the way
  alignas(64) float ml[16];
  int64_t J = 0;
#if SIMD16
  J = end / 16 * 16;
  V mv = vset(ninf);
  for (int64_t j = 0; j < J; j += 16) {
    V x = vload(s + j);
    if (!a.mask) x = vadd(vmul(x, vset(a.scale)), vset(0.f)), vstore(s + j, x);
    mv = vmax(x, mv);
  }
  vstore(ml, mv);
#else
  for (int l = 0; l < 16; l++) ml[l] = ninf;
#endif
  for (int64_t j = J; j < end; j++) {
    if (!a.mask) s[j] = s[j] * a.scale + 0.f;
    ml[j % 16] = s[j] > ml[j % 16] ? s[j] : ml[j % 16];
  }
  float m = ninf;
  for (int l = 0; l < 16; l++) m = ml[l] > m ? ml[l] : m;
  if (m == ninf) {
    for (int64_t j = 0; j < end; j++) s[j] = 0.f;
    return 0.f;
  }
  if (!a.mask) return exp_terms(s, end, m);  // every key shown: its rank is j
  int64_t n = 0;  // the shown keys side by side (no branch: a hidden one is overwritten), their terms, then back
  for (int64_t j = 0; j < end; j++) shown[n] = s[j], n += s[j] != ninf;
  const float l = exp_terms(shown, n, m);
  n = 0;
  for (int64_t j = 0; j < end; j++) {
    const bool on = s[j] != ninf;
    s[j] = on ? shown[n] : 0.f, n += on;
  }
  return l;
}

#if SIMD16 && defined(__AVX512F__)
// s[i] = vsum(acc[i]) for a block's 16 keys at once: tree16's additions in every lane, the keys side by side
// (each level adds the same lane pairs vsum adds, after shuffles that put them in one vector; a + b = b + a)
[[gnu::always_inline]] inline void vsum_block(const V* acc, float* s) {
  __m512 b[8], c[4], d[2];
  for (int p = 0; p < 8; p++)  // keys 2p, 2p+1: lanes l and l + 8
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p].a, acc[2 * p + 1].a, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(acc[2 * p].a, acc[2 * p + 1].a, _MM_SHUFFLE(3, 2, 3, 2)));
  for (int p = 0; p < 4; p++)  // keys 4p … 4p+3: + 4
    c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int p = 0; p < 2; p++)  // 128-bit lane g: keys 8p + g and 8p + 4 + g: + 2
    d[p] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),  // + 1
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // e[4g + t] is key g + 4t
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(s, _mm512_permutexvar_ps(order, e));
}
constexpr int KB = 16;  // keys a block of the shared dots
#elif SIMD16
inline void vsum_block(const V* acc, float* s) {  // a block's 4 keys
  for (int i = 0; i < 4; i++) s[i] = vsum(acc[i]);
}
constexpr int KB = 4;  // 16 ymm registers: four keys' two-ymm chains
#endif

#if SIMD16
// s[i] = q · k_i for a block's KB keys: KB chains in registers, reduced together. kb = the keys in fp32 chunk by
// chunk ([D / 16, KB, 16]: one base pointer, fixed offsets), for a group that shares them; or k = the keys as
// they are (rows of kstride) for a group of one: a staged copy would only delay the first reads from memory.
[[gnu::always_inline]] inline void dots_block(const float* qf, int64_t D, const float* kb, float* s) {
  V acc[KB];
  for (int i = 0; i < KB; i++) acc[i] = vset(0.f);
  for (int64_t d = 0; d < D; d += 16, kb += 16 * KB) {
    const V qv = vload(qf + d);
    for (int i = 0; i < KB; i++) acc[i] = vfma(qv, vload(kb + 16 * i), acc[i]);
  }
  vsum_block(acc, s);
}
template <typename TK>
[[gnu::always_inline]] inline void dots_block(const float* qf, int64_t D, const TK* k, int64_t kstride, float* s) {
  V acc[KB];
  for (int i = 0; i < KB; i++) acc[i] = vset(0.f);
  for (int64_t d = 0; d < D; d += 16) {
    const V qv = vload(qf + d);
    for (int i = 0; i < KB; i++) acc[i] = vfma(qv, vload(k + i * kstride + d), acc[i]);
  }
  vsum_block(acc, s);
}
#endif

// One thread's buffers for a group of M members (query rows) over S keys, kept from group to group; a member's
// rows of s, qf and o start on 64-byte boundaries when S and D are multiples of 16
struct Scratch {
  std::vector<float, Aligned64<float>> s, qf, o, kb, l, shown;
  std::vector<int64_t> end;
  void fit(int64_t M, int64_t S, int64_t D) {
    s.resize(M * S), qf.resize(M * D), o.resize(M * D), kb.resize(16 * D), l.resize(M), end.resize(M), shown.resize(S);
  }
};

// out_m = Σ_j e_mj · v_j / l_m for MB members m0 … m0 + MB − 1 (their e in s rows of S): each a chain of fma in
// j order over the keys where its own e_mj ≠ 0 (a key it does not see is skipped, not multiplied by 0: a padded
// slot's V may be anything), the V loads shared; CB 16-wide chunks of out at a time.
#if SIMD16
template <typename TK, int MB>
void weighted_values(const TK* v, int64_t vstride, int64_t D, int64_t S, int64_t jend, const float* s,
                     const float* l, float* o) {
  constexpr int CB = ACCS / MB >= 8 ? 8 : ACCS / MB;
  const int64_t ahead = ahead_keys(D * (int64_t)sizeof(TK));
  for (int64_t c0 = 0; c0 < D / 16; c0 += CB) {
    const int cn = (int)std::min<int64_t>(CB, D / 16 - c0);
    V acc[MB][CB];
    for (int m = 0; m < MB; m++)
      for (int c = 0; c < CB; c++) acc[m][c] = vset(0.f);
    for (int64_t j = 0; j < jend; j++) {
      Live live[MB];
      bool any = false;
      V e[MB];
      for (int m = 0; m < MB; m++) e[m] = vset(s[m * S + j]), live[m] = vlive(e[m]), any |= live[m] != 0;
      if (c0 == 0)  // a later row's values, from memory
        for (int64_t i = 0; i < D * (int64_t)sizeof(TK); i += 64)
          __builtin_prefetch((const char*)(v + (j + ahead) * vstride) + i);
      if (!any) continue;
      const TK* vj = v + j * vstride + 16 * c0;
      for (int c = 0; c < CB; c++) {
        if (c >= cn) break;
        const V vv = vload(vj + 16 * c);
        for (int m = 0; m < MB; m++) acc[m][c] = vfma_if(live[m], e[m], vv, acc[m][c]);
      }
    }
    for (int m = 0; m < MB; m++)
      for (int c = 0; c < cn; c++)
        vstore(o + m * D + 16 * (c0 + c), l[m] == 0.f ? vset(0.f) : vdiv(acc[m][c], vset(l[m])));
  }
}

template <typename TK>
void weighted_values_n(int MB, const TK* v, int64_t vstride, int64_t D, int64_t S, int64_t jend, const float* s,
                       const float* l, float* o) {
  switch (MB) {
    case 6: return weighted_values<TK, 6>(v, vstride, D, S, jend, s, l, o);
    case 5: return weighted_values<TK, 5>(v, vstride, D, S, jend, s, l, o);
    case 4: return weighted_values<TK, 4>(v, vstride, D, S, jend, s, l, o);
    case 3: return weighted_values<TK, 3>(v, vstride, D, S, jend, s, l, o);
    case 2: return weighted_values<TK, 2>(v, vstride, D, S, jend, s, l, o);
    default: return weighted_values<TK, 1>(v, vstride, D, S, jend, s, l, o);
  }
}
#endif

// A group: heads h0 … h0 + nh − 1 (one KV head's, or some of them) × rows r0 … r0 + nr − 1 of batch b, M = nh · nr
// members, each computed as alone; the members share each key's and value's loads (and, with AVX-512, the
// reduction of their dots, 16 keys at a time).
template <typename TQ, typename TK>
void group(const Args& a, int64_t b, int64_t h0, int64_t nh, int64_t r0, int64_t nr, Scratch& w) {
  const int64_t D = a.D, S = a.S, M = nh * nr, kvh = h0 / (a.H / a.KVH);
  const int64_t SS = (S + 15) / 16 * 16;  // s's row stride: each member's row on a 64-byte boundary
  const TK* k = (const TK*)a.k + b * a.ks[0] + kvh * a.ks[1];
  const TK* v = (const TK*)a.v + b * a.vs[0] + kvh * a.vs[1];
  w.fit(M, SS, D);
  float* s = w.s.data();
  float* qf = w.qf.data();
  float* o = w.o.data();
  float* l = w.l.data();        // member m's Σ e_j
  int64_t* end = w.end.data();  // member m = (head h0 + m / nr, row r0 + m % nr): its keys j < end[m]
  int64_t jend = 0;
  for (int64_t m = 0; m < M; m++) {
    const int64_t h = h0 + m / nr, r = r0 + m % nr;
    const TQ* q = (const TQ*)a.q + b * a.qs[0] + h * a.qs[1] + r * a.qs[2];
    const float* qs = a.qscale ? a.qscale + (b * a.H + h) * D : nullptr;
    for (int64_t d = 0; d < D; d++) qf[m * D + d] = qs ? widen(q[d]) * qs[d] : widen(q[d]);
    end[m] = a.causal ? S - (a.T - 1 - r) : S;
    jend = std::max(jend, end[m]);
  }
  // s[m, j] = q_m · k_j for j < jend (past a member's end too: its softmax reads only j < end)
  int64_t j0 = 0;
#if SIMD16
  const int64_t ahead = ahead_keys(KB * D * (int64_t)sizeof(TK)) * KB;
  if (D % 16 == 0) {
    // blocks of KB keys; the last one's missing keys are zeros (their dots land in the row's padding or past jend,
    // which nothing reads: s's rows hold SS ≥ j0 + KB floats)
    for (; j0 < jend; j0 += KB) {
      for (int64_t i = 0; i < KB * D * (int64_t)sizeof(TK); i += 64)  // keys AHEAD_BYTES on, from memory
        __builtin_prefetch((const char*)(k + (j0 + ahead) * a.ks[2]) + i);
      const int64_t n = std::min<int64_t>(KB, jend - j0);
      if (M == 1 && n == KB) {
        dots_block<TK>(qf, D, k + j0 * a.ks[2], a.ks[2], s + j0);
        continue;
      }
      float* kb = w.kb.data();  // the block's keys in fp32, [D / 16, KB, 16]
      for (int64_t d = 0; d < D; d += 16)
        for (int i = 0; i < KB; i++) vstore(kb + d * KB + 16 * i, i < n ? vload(k + (j0 + i) * a.ks[2] + d) : vset(0.f));
      for (int64_t m = 0; m < M; m++) dots_block(qf + m * D, D, kb, s + m * SS + j0);
    }
    j0 = jend;
  }
#endif
  for (int64_t m = 0; m < M; m++) {  // the keys left (all of them without SIMD), then each member's softmax terms
    dots<TK>(qf + m * D, k + j0 * a.ks[2], a.ks[2], jend - j0, D, s + m * SS + j0);
    const int64_t h = h0 + m / nr, r = r0 + m % nr;
    l[m] = softmax_terms(a, b * a.ms[0] + h * a.ms[1] + r * a.ms[2], end[m], s + m * SS, w.shown.data());
    for (int64_t j = end[m]; j < jend; j++) s[m * SS + j] = 0.f;  // keys past its end: not seen
  }
  bool done = false;
#if SIMD16
  if (D % 16 == 0 && D <= 256) {
    constexpr int MB = ACCS / 4;  // members sharing the value loads, 4 chunks each (AVX2: one)
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int n = (int)std::min<int64_t>(MB, M - m0);
      weighted_values_n<TK>(n, v, a.vs[2], D, SS, jend, s + m0 * SS, l + m0, o + m0 * D);
    }
    done = true;
  }
#endif
  if (!done)
    for (int64_t m = 0; m < M; m++) {
      float* om = o + m * D;
      const float* sm = s + m * SS;
      for (int64_t d = 0; d < D; d++) om[d] = 0.f;
      for (int64_t j = 0; j < end[m]; j++) {
        if (sm[j] == 0.f) continue;
        const TK* vj = v + j * a.vs[2];
        for (int64_t d = 0; d < D; d++) om[d] = std::fma(sm[j], widen(vj[d]), om[d]);
      }
      for (int64_t d = 0; d < D; d++) om[d] = l[m] == 0.f ? 0.f : om[d] / l[m];
    }
  for (int64_t m = 0; m < M; m++) {
    const int64_t h = h0 + m / nr, r = r0 + m % nr;
    TQ* out = (TQ*)a.out + ((b * a.T + r) * a.H + h) * D;
    const float* os = a.oscale ? a.oscale + (b * a.H + h) * D : nullptr;
    for (int64_t d = 0; d < D; d++) out[d] = (TQ)(os ? o[m * D + d] * os[d] : o[m * D + d]);
  }
}

constexpr int64_t MAX_MEMBERS = 32;  // query rows (heads × rows) a group holds: M · S floats of scores

template <typename TQ, typename TK>
void run(const Args& a) {
  // groups: the heads of one KV head (at most MAX_MEMBERS of them) × a block of rows; blocks small enough that
  // every thread gets work where there is enough of it. A member's bits do not depend on the grouping.
  const int64_t rep = a.H / a.KVH, nh = std::min(rep, MAX_MEMBERS), hgroups = a.KVH * ((rep + nh - 1) / nh);
  const int64_t units = a.B * hgroups, threads = at::get_num_threads();
  const int64_t want_blocks = std::max<int64_t>(1, (2 * threads + units - 1) / units);
  const int64_t nr = std::max<int64_t>(1, std::min((a.T + want_blocks - 1) / want_blocks, MAX_MEMBERS / nh));
  const int64_t rblocks = (a.T + nr - 1) / nr, per_kv = (rep + nh - 1) / nh;
  at::parallel_for(0, units * rblocks, 1, [&](int64_t i0, int64_t i1) {
    Scratch w;
    for (int64_t i = i0; i < i1; i++) {
      const int64_t rb = i % rblocks, u = i / rblocks, b = u / hgroups, hg = u % hgroups;
      const int64_t h0 = (hg / per_kv) * rep + (hg % per_kv) * nh, nhh = std::min(nh, (hg / per_kv + 1) * rep - h0);
      group<TQ, TK>(a, b, h0, nhh, rb * nr, std::min(nr, a.T - rb * nr), w);
    }
  });
}

// q [B, H, T, D]; k, v [B, KVH, S, D] (each with its last dim contiguous; fp32 or bf16, k and v alike, or int8);
// mask [B, 1 | H, 1 | T, S] bool or fp32, or none; qscale, oscale: B · H · D fp32 each ([B, H, 1, D] or [B, 1, H, D]
// in (b, h, d) order) or none; -> out [B, T, H, D] in q's dtype.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                     double scale, bool causal, c10::optional<torch::Tensor> qscale,
                     c10::optional<torch::Tensor> oscale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "rows_attention: q, k, v must be 4-d");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KVH = k.size(1), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == KVH && v.size(2) == S && k.size(3) == D &&
              v.size(3) == D && KVH > 0 && H % KVH == 0, "rows_attention: shapes do not match");
  TORCH_CHECK(!causal || T <= S, "rows_attention: more causal rows than keys");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "rows_attention: k and v must share a dtype");
  for (auto* t : {&q, &k, &v}) {
    const bool int8_kv = t != &q && t->scalar_type() == at::kChar;
    TORCH_CHECK(int8_kv || t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16,
                "rows_attention: q fp32 or bf16; k, v fp32, bf16 or int8");
    if (t->stride(3) != 1) *t = t->contiguous();
  }
  auto out = torch::empty({B, T, H, D}, q.options());
  torch::Tensor scales[2];
  for (int i = 0; i < 2; i++) {
    const auto& given = i == 0 ? qscale : oscale;
    if (!given || !given->defined()) continue;
    scales[i] = given->contiguous();
    TORCH_CHECK(scales[i].scalar_type() == at::kFloat && scales[i].numel() == B * H * D,
                "rows_attention: a scale must hold B · H · D fp32 values");
  }
  Args a{B, H, KVH, T, S, D, (float)scale, causal, q.data_ptr(), k.data_ptr(), v.data_ptr(), nullptr, false,
         scales[0].defined() ? scales[0].data_ptr<float>() : nullptr,
         scales[1].defined() ? scales[1].data_ptr<float>() : nullptr,
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
  const bool qb = q.scalar_type() == at::kBFloat16;
  switch (k.scalar_type()) {
    case at::kBFloat16: qb ? run<c10::BFloat16, c10::BFloat16>(a) : run<float, c10::BFloat16>(a); break;
    case at::kChar: qb ? run<c10::BFloat16, int8_t>(a) : run<float, int8_t>(a); break;
    default: qb ? run<c10::BFloat16, float>(a) : run<float, float>(a);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("entry", [] { return pybind11::capsule((void*)&attend, "specdec.rows_attention.attend"); },
        "attend's address, for another module's C++ (lean_layers)");
  m.def("attend", &attend, "attention of a few query rows, each computed alone", pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("mask"), pybind11::arg("scale"), pybind11::arg("causal"),
        pybind11::arg("qscale") = pybind11::none(), pybind11::arg("oscale") = pybind11::none());
}
