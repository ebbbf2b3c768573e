// The small operations around a Llama-shaped decoder layer's products, on bf16 or fp32 activations, fused: a
// residual add and the RMS norm after it, and the rotary embedding of q and k with k and v stored into the KV cache.
// The torch ops they replace and the Python entry points are in layer_ops.py; decoding/llama_like.py calls them.
//
// Every operation is computed in fp32; in bf16 its result is rounded to bf16 to nearest, ties to even, as torch's
// bf16 ops on a CPU are (in fp32, bf16(·) below is nothing), so that:
//   add_rms   s = x + y                                    (one bf16 add, torch's bits)
//             r = Σ s_i² in fp32: 16 lanes, lane l summing i ≡ l (mod 16) in order, then (a_l + a_l+8), + 4,
//                 + 2, + 1, then the d mod 16 last terms in order           (torch sums in an order of its own:
//                 this is the one place the result is not transformers' bits)
//             h = bf16(s · (1 / sqrt(r / d + eps)))  out = bf16(w · h)   (transformers' RMS norm otherwise)
//   rope      q' = bf16(bf16(q · cos) + bf16(rot(q) · sin)), rot(q) = (−q[D/2:], q[:D/2]), k' alike (torch's bits)
//   silu_mul  out = st((g · σ(g)) · u) from the two halves of a gate/up product, σ(g) = r for g ≥ 0, e · r otherwise,
//             r = 1 / (1 + e), e = exp(−|g|) by expm (a degree-6 polynomial after range reduction, within 2 ulp;
//             −|g| held at −87.3 and above): its own bits, not torch's silu; every element alike wherever it stands
//             (the vector lanes and the scalar tail take the same IEEE operations, each rounded once)
// Each row computes alone: the same bits whatever the number of rows or threads. Compiled with -ffp-contract=off.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd16.h"  // V: 16 lanes (AVX-512 or AVX2), vload, vstore, vbf16, ...

namespace {

inline float f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t bf16(float f) { return c10::BFloat16(f).x; }  // torch's rounding (nearest, ties to even)

// An activation's storage: bf16 (uint16_t, its bits) or fp32 (float). ld widens to fp32, st rounds to the storage
// (fp32: nothing), rnd does both.
inline float ld(uint16_t b) { return f32(b); }
inline float ld(float f) { return f; }
template <typename T> inline T st(float f);
template <> inline uint16_t st<uint16_t>(float f) { return bf16(f); }
template <> inline float st<float>(float f) { return f; }
template <typename T> inline float rnd(float f) { return ld(st<T>(f)); }

template <typename T>
T* data(const torch::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) return t.data_ptr<float>();
  else return (uint16_t*)t.data_ptr<at::BFloat16>();
}

bool is_act(const torch::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat; }

#if SIMD16
template <typename T> inline V vrnd(V v) {  // rnd on 16 lanes
  if constexpr (std::is_same_v<T, float>) return v;
  else return vbf16(v);
}
#endif

// x [..., d] contiguous (updated to x + y where y is given), y like x or undefined, w [d], all of one dtype (bf16
// or fp32) -> the RMS norm of each row, like x. With SIMD16 the same operations 16 elements at a time (the sum of
// squares' 16 lanes one V).
template <typename T>
void add_rms_t(const torch::Tensor& x, const c10::optional<torch::Tensor>& y, const torch::Tensor& w, double eps,
               torch::Tensor& out) {
  const int64_t d = x.size(-1), M = d ? x.numel() / d : 0;
  const bool add = y && y->defined();
  T* xs = data<T>(x);
  const T* ys = add ? data<T>(*y) : nullptr;
  const T* ws = data<T>(w);
  T* os = data<T>(out);
  const float e = (float)eps;
  const int64_t D16 = d / 16 * 16;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    std::vector<float> s(d);
    for (int64_t m = m0; m < m1; m++) {
      T* xr = xs + m * d;
      const T* yr = add ? ys + m * d : nullptr;
      T* orow = os + m * d;
      float lanes[16] = {0.f};
      int64_t i = 0;
#if SIMD16
      V a = vset(0.f);
      for (; i < D16; i += 16) {
        V v = vload(xr + i);
        if (add) {
          v = vrnd<T>(vadd(v, vload(yr + i)));
          vstore(xr + i, v);  // exact: v is the storage's already
        }
        vstore(s.data() + i, v);
        a = vadd(a, vmul(v, v));
      }
      vstore(lanes, a);
#endif
      for (int64_t i1 = i; i1 < d; i1++) {
        if (add) xr[i1] = st<T>(ld(xr[i1]) + ld(yr[i1]));
        s[i1] = ld(xr[i1]);
      }
      for (int64_t i0 = i; i0 < D16; i0 += 16)
        for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + s[i0 + l] * s[i0 + l];
      for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) lanes[l] = lanes[l] + lanes[l + h];
      float r = lanes[0];
      for (int64_t j = D16; j < d; j++) r = r + s[j] * s[j];
      const float inv = 1.f / std::sqrt(r / (float)d + e);
      int64_t j = 0;
#if SIMD16
      for (; j + 16 <= d; j += 16) vstore(orow + j, vmul(vload(ws + j), vrnd<T>(vmul(vload(s.data() + j), vset(inv)))));
#endif
      for (; j < d; j++) orow[j] = st<T>(ld(ws[j]) * rnd<T>(s[j] * inv));
    }
  });
}

torch::Tensor add_rms(torch::Tensor x, c10::optional<torch::Tensor> y, torch::Tensor w, double eps) {
  TORCH_CHECK(is_act(x) && x.is_contiguous() && x.dim() >= 1, "add_rms: x [..., d] bf16 or fp32");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.is_contiguous() && w.numel() == x.size(-1), "add_rms: w [d] like x");
  if (y && y->defined())
    TORCH_CHECK(y->scalar_type() == x.scalar_type() && y->is_contiguous() && y->sizes() == x.sizes(), "add_rms: y like x");
  auto out = torch::empty_like(x);
  if (x.scalar_type() == at::kFloat) add_rms_t<float>(x, y, w, eps, out);
  else add_rms_t<uint16_t>(x, y, w, eps, out);
  return out;
}

// q [B, T, H, D], k, v [B, T, KVH, D] (any strides but the last), cos, sin [B, T, D] contiguous; keys, values
// [B, KVH, S, D] contiguous caches, all of one dtype (bf16 or fp32): rotated k and v go to slots start .. start + T
// -> rotated q [B, H, T, D] contiguous
template <typename T>
void rope_store_t(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& cos,
                  const torch::Tensor& sin, torch::Tensor& keys, torch::Tensor& values, int64_t start, torch::Tensor& out) {
  const int64_t B = q.size(0), T_ = q.size(1), H = q.size(2), D = q.size(3), KVH = k.size(2), S = keys.size(2);
  const T *cs = data<T>(cos), *sn = data<T>(sin), *vs = data<T>(v);
  T *qo = data<T>(out), *ko = data<T>(keys), *vo = data<T>(values);
  const T *qs = data<T>(q), *ks = data<T>(k);
  const int64_t half = D / 2;
  auto rotate = [&](const T* x, const T* c, const T* s, T* o) {
    for (int64_t i = 0; i < half; i++)
      o[i] = st<T>(rnd<T>(ld(x[i]) * ld(c[i])) + rnd<T>(-ld(x[i + half]) * ld(s[i])));
    for (int64_t i = half; i < D; i++)
      o[i] = st<T>(rnd<T>(ld(x[i]) * ld(c[i])) + rnd<T>(ld(x[i - half]) * ld(s[i])));
  };
  at::parallel_for(0, B * T_, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t b = r / T_, t = r % T_;
      const T* c = cs + (b * T_ + t) * D;
      const T* s = sn + (b * T_ + t) * D;
      for (int64_t h = 0; h < H; h++)
        rotate(qs + b * q.stride(0) + t * q.stride(1) + h * q.stride(2), c, s, qo + ((b * H + h) * T_ + t) * D);
      for (int64_t h = 0; h < KVH; h++) {
        const int64_t slot = ((b * KVH + h) * S + start + t) * D;
        rotate(ks + b * k.stride(0) + t * k.stride(1) + h * k.stride(2), c, s, ko + slot);
        std::memcpy(vo + slot, vs + b * v.stride(0) + t * v.stride(1) + h * v.stride(2), D * sizeof(T));
      }
    }
  });
}

torch::Tensor rope_store(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cos, torch::Tensor sin,
                         torch::Tensor keys, torch::Tensor values, int64_t start) {
  for (auto* t : {&q, &k, &v, &cos, &sin, &keys, &values})
    TORCH_CHECK(is_act(*t) && t->scalar_type() == q.scalar_type() && t->stride(-1) == 1,
                "rope_store: one dtype (bf16 or fp32), the last dim contiguous");
  const int64_t B = q.size(0), T = q.size(1), D = q.size(3), KVH = k.size(2), S = keys.size(2);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && k.size(0) == B && k.size(1) == T &&
              k.size(3) == D && D % 2 == 0, "rope_store: q [B, T, H, D], k, v [B, T, KVH, D]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.numel() == B * T * D,
              "rope_store: cos, sin [B, T, D]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() && keys.size(0) == B &&
              keys.size(1) == KVH && keys.size(3) == D && start >= 0 && start + T <= S,
              "rope_store: caches [B, KVH, S, D] with room for slots start .. start + T");
  auto out = torch::empty({B, q.size(2), T, D}, q.options());
  if (q.scalar_type() == at::kFloat) rope_store_t<float>(q, k, v, cos, sin, keys, values, start, out);
  else rope_store_t<uint16_t>(q, k, v, cos, sin, keys, values, start, out);
  return out;
}

// exp(x) for −87.3 ≤ x ≤ 0: x = n·ln2 + t (two-part ln2), exp(t) by a degree-6 polynomial in fma, times 2ⁿ built in
// the exponent bits; silu_mul's σ and its product, one element (the scalar twin of silu_mul16)
inline float expm(float x) {
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float t = std::fma(n, -0.693145751953125f, x);
  t = std::fma(n, -1.428606765330187e-06f, t);
  float p = 1.f / 720;
  for (float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = std::fma(p, t, c);
  const int32_t bits = ((int32_t)n + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

inline float silu_mul1(float g, float u) {
  const float e = expm(std::max(-std::fabs(g), -87.3f));
  const float r = 1.f / (1.f + e);
  return (g * (g >= 0.f ? r : e * r)) * u;
}

#if SIMD16
// silu_mul1 on 16 lanes, operation for operation
inline V silu_mul16(V g, V u) {
  const V a = vmax(vneg_abs(g), vset(-87.3f));  // −|g|, held
  const V n = vround(vmul(a, vset(1.44269504088896341f)));
  V t = vfma(n, vset(-0.693145751953125f), a);
  t = vfma(n, vset(-1.428606765330187e-06f), t);
  V p = vset(1.f / 720);
  for (float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = vfma(p, t, vset(c));
  const V e = vmul(p, vpow2(n));
  const V r = vdiv(vset(1.f), vadd(vset(1.f), e));
  return vmul(vmul(g, vif_nonneg(g, vmul(e, r), r)), u);
}
#endif

// gu [..., 2F] (the last dim contiguous; g its first F, u the rest) -> out [..., F] contiguous, in pieces of ≤ PIECE
// elements of a row spread over the threads (every element alike: where it is computed does not matter)
constexpr int64_t PIECE = 1024;
template <typename T>
void silu_mul_t(const torch::Tensor& gu, torch::Tensor& out) {
  const int64_t F = out.size(-1), M = F ? out.numel() / F : 0, stride = gu.dim() > 1 ? gu.stride(-2) : 2 * F;
  const int64_t pieces = (F + PIECE - 1) / PIECE;
  const T* src = data<T>(gu);
  T* dst = data<T>(out);
  at::parallel_for(0, M * pieces, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
      const int64_t m = p / pieces, i0 = p % pieces * PIECE, i1 = std::min(F, i0 + PIECE);
      const T* g = src + m * stride;
      const T* u = g + F;
      T* o = dst + m * F;
      int64_t i = i0;
#if SIMD16
      for (; i + 16 <= i1; i += 16) vstore(o + i, silu_mul16(vload(g + i), vload(u + i)));
#endif
      for (; i < i1; i++) o[i] = st<T>(silu_mul1(ld(g[i]), ld(u[i])));
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gu) {
  TORCH_CHECK(is_act(gu) && gu.dim() >= 1 && gu.size(-1) % 2 == 0 && gu.stride(-1) == 1 &&
              (gu.dim() == 1 || gu.numel() == 0 || gu.is_contiguous() ||
               gu.reshape({-1, gu.size(-1)}).data_ptr() == gu.data_ptr()),
              "silu_mul: gu [..., 2F] bf16 or fp32, its rows evenly spaced");
  auto sizes = gu.sizes().vec();
  sizes.back() /= 2;
  auto out = torch::empty(sizes, gu.options());
  auto rows = gu.reshape({-1, gu.size(-1)});  // a view: rows evenly spaced (checked)
  if (gu.scalar_type() == at::kFloat) silu_mul_t<float>(rows, out);
  else silu_mul_t<uint16_t>(rows, out);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms", &add_rms, "x += y, then the RMS norm of each row (bf16 or fp32)");
  m.def("silu_mul", &silu_mul, "silu(g) · u from gu = [g | u] (bf16 or fp32)");
  m.def("rope_store", &rope_store, "rotary embedding of q and k; k and v into the KV cache (bf16 or fp32)");
}
