// The small operations around a Llama-shaped decoder layer's products, on bf16 activations, fused: a residual add
// and the RMS norm after it, and the rotary embedding of q and k with k and v stored into the KV cache. The torch
// ops they replace and the Python entry points are in layer_ops.py; decoding/llama_like.py calls them.
//
// Every bf16 operation is computed in fp32 and rounded to bf16 to nearest, ties to even, as torch's bf16 ops on a
// CPU are, so that:
//   add_rms   s = x + y                                    (one bf16 add, torch's bits)
//             r = Σ s_i² in fp32: 16 lanes, lane l summing i ≡ l (mod 16) in order, then (a_l + a_l+8), + 4,
//                 + 2, + 1, then the d mod 16 last terms in order           (torch sums in an order of its own:
//                 this is the one place the result is not transformers' bits)
//             h = bf16(s · (1 / sqrt(r / d + eps)))  out = bf16(w · h)   (transformers' RMS norm otherwise)
//   rope      q' = bf16(bf16(q · cos) + bf16(rot(q) · sin)), rot(q) = (−q[D/2:], q[:D/2]), k' alike (torch's bits)
// Each row computes alone: the same bits whatever the number of rows or threads. Compiled with -ffp-contract=off.

#include <torch/extension.h>

#include <cmath>
#include <cstring>

namespace {

inline float f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t bf16(float f) { return c10::BFloat16(f).x; }  // torch's rounding (nearest, ties to even)

inline uint16_t* bits(const torch::Tensor& t) { return (uint16_t*)t.data_ptr<at::BFloat16>(); }

// x [..., d] bf16 contiguous (updated to x + y where y is given), y like x or undefined, w [d] bf16
// -> the RMS norm of each row, like x
torch::Tensor add_rms(torch::Tensor x, c10::optional<torch::Tensor> y, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() >= 1, "add_rms: x [..., d] bf16");
  const int64_t d = x.size(-1), M = d ? x.numel() / d : 0;
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.numel() == d, "add_rms: w [d] bf16");
  const bool add = y && y->defined();
  if (add) TORCH_CHECK(y->scalar_type() == at::kBFloat16 && y->is_contiguous() && y->sizes() == x.sizes(),
                       "add_rms: y like x");
  auto out = torch::empty_like(x);
  uint16_t* xs = bits(x);
  const uint16_t* ys = add ? bits(*y) : nullptr;
  const uint16_t* ws = bits(w);
  uint16_t* os = bits(out);
  const float e = (float)eps;
  const int64_t D16 = d / 16 * 16;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    std::vector<float> s(d);
    for (int64_t m = m0; m < m1; m++) {
      uint16_t* xr = xs + m * d;
      for (int64_t i = 0; i < d; i++) {
        if (add) xr[i] = bf16(f32(xr[i]) + f32(ys[m * d + i]));
        s[i] = f32(xr[i]);
      }
      float lanes[16] = {0.f};
      for (int64_t i0 = 0; i0 < D16; i0 += 16)
        for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + s[i0 + l] * s[i0 + l];
      for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) lanes[l] = lanes[l] + lanes[l + h];
      float r = lanes[0];
      for (int64_t i = D16; i < d; i++) r = r + s[i] * s[i];
      const float inv = 1.f / std::sqrt(r / (float)d + e);
      for (int64_t i = 0; i < d; i++) os[m * d + i] = bf16(f32(ws[i]) * f32(bf16(s[i] * inv)));
    }
  });
  return out;
}

// q [B, T, H, D], k, v [B, T, KVH, D] bf16 (any strides but the last), cos, sin [B, T, D] bf16 contiguous; keys,
// values [B, KVH, S, D] bf16 contiguous caches: rotated k and v go to slots start .. start + T -> rotated q
// [B, H, T, D] contiguous
torch::Tensor rope_store(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cos, torch::Tensor sin,
                         torch::Tensor keys, torch::Tensor values, int64_t start) {
  for (auto* t : {&q, &k, &v, &cos, &sin, &keys, &values})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->stride(-1) == 1, "rope_store: bf16, the last dim contiguous");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), KVH = k.size(2), S = keys.size(2);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && k.size(0) == B && k.size(1) == T &&
              k.size(3) == D && D % 2 == 0, "rope_store: q [B, T, H, D], k, v [B, T, KVH, D]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.numel() == B * T * D,
              "rope_store: cos, sin [B, T, D]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() && keys.size(0) == B &&
              keys.size(1) == KVH && keys.size(3) == D && start >= 0 && start + T <= S,
              "rope_store: caches [B, KVH, S, D] with room for slots start .. start + T");
  auto out = torch::empty({B, H, T, D}, q.options());
  const uint16_t *cs = bits(cos), *sn = bits(sin), *vs = bits(v);
  uint16_t *qo = bits(out), *ko = bits(keys), *vo = bits(values);
  const uint16_t *qs = bits(q), *ks = bits(k);
  const int64_t half = D / 2;
  auto rotate = [&](const uint16_t* x, const uint16_t* c, const uint16_t* s, uint16_t* o) {
    for (int64_t i = 0; i < half; i++)
      o[i] = bf16(f32(bf16(f32(x[i]) * f32(c[i]))) + f32(bf16(-f32(x[i + half]) * f32(s[i]))));
    for (int64_t i = half; i < D; i++)
      o[i] = bf16(f32(bf16(f32(x[i]) * f32(c[i]))) + f32(bf16(f32(x[i - half]) * f32(s[i]))));
  };
  at::parallel_for(0, B * T, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t b = r / T, t = r % T;
      const uint16_t* c = cs + (b * T + t) * D;
      const uint16_t* s = sn + (b * T + t) * D;
      for (int64_t h = 0; h < H; h++)
        rotate(qs + b * q.stride(0) + t * q.stride(1) + h * q.stride(2), c, s, qo + ((b * H + h) * T + t) * D);
      for (int64_t h = 0; h < KVH; h++) {
        const int64_t slot = ((b * KVH + h) * S + start + t) * D;
        rotate(ks + b * k.stride(0) + t * k.stride(1) + h * k.stride(2), c, s, ko + slot);
        std::memcpy(vo + slot, vs + b * v.stride(0) + t * v.stride(1) + h * v.stride(2), D * sizeof(uint16_t));
      }
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms", &add_rms, "x += y, then the RMS norm of each row (bf16)");
  m.def("rope_store", &rope_store, "rotary embedding of q and k; k and v into the KV cache (bf16)");
}
