// The self draft's decoder layers (drafts/lean_whisper.LeanDecoder._layers) in one C++ call: the same operations in
// the same order (ATen's layer_norm, gelu and adds, int8_rows' mm, rows_attention's attend, reached through the
// addresses their modules hand out), so the same bits, without ~25 Python calls a layer (a draft step over three
// windows spent ~1 ms of its 2.6 outside its kernels).
//
// Per layer (x [B, T, d]; q, k, v [B, heads, T, head_dim]; the query scale folded into the weights):
//   x += out(attend(LN1(x)·Wqkv, cache))        k, v written to the cache's slots start … start + T − 1 first
//   x += cross_out(attend(LN2(x)·Wq · Ks, K, V) · Vs)    K, V int8 with per-channel scales Ks, Vs (or as they are)
//   x += fc2(gelu(fc1(LN3(x))))
//
// Then the output layer (head()): z = LN(x)·Wᵀ with W in int4 (an estimate), each row's RESCORED largest z_n recomputed
// from W's int8 rows, s_n · Σ_k w_nk · h_k summed in fp64 in k's order (lean_whisper.rescored, the Python twin: the same
// candidates, each value within an fp32 rounding), written at their token ids in an fp32 row of −inf.

#include <torch/extension.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using Mm = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>,
                             int64_t);
using CrossKV = std::tuple<torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>>;
using Attend = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, double,
                                 bool, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>);

struct Linear {  // int8_rows.Packed and its bias
  torch::Tensor blocks, sums, scales;
  c10::optional<torch::Tensor> bias;
};

struct Norm {
  torch::Tensor weight, bias;
  double eps;
};

struct Head {  // LeanDecoder's output layer: the int4 estimate, the int8 rows candidates are rescored from
  Norm norm;
  Linear estimate;
  torch::Tensor ints, scales;  // [N', d] int8, [N'] fp32
  c10::optional<torch::Tensor> keep;  // [N'] int64: row n's token id (None: n)
  int64_t vocab, rescored;
};

struct Layer {
  Norm norm1, norm2, norm3;
  Linear qkv, out, q, cross_out, fc1, fc2;
};

class Layers {
 public:
  // layers: per layer (norm1, qkv, out, norm2, q, cross_out, norm3, fc1, fc2), a norm as (weight, bias, eps), a
  // linear as (blocks, sums, scales, bias or None)
  // head: (norm, estimate, ints, scales, keep or None, vocab, rescored), its parts as the layers' are
  Layers(pybind11::list layers, pybind11::tuple head, int64_t heads, int64_t head_dim, pybind11::capsule mm,
         pybind11::capsule attend)
      : heads_(heads), head_dim_(head_dim),
        mm_((Mm)PyCapsule_GetPointer(mm.ptr(), "specdec.int8_rows.mm")),
        attend_((Attend)PyCapsule_GetPointer(attend.ptr(), "specdec.rows_attention.attend")) {
    TORCH_CHECK(mm_ && attend_, "lean_layers: not int8_rows' mm or rows_attention's attend");
    auto norm = [](pybind11::handle h) {
      auto t = h.cast<pybind11::tuple>();
      return Norm{t[0].cast<torch::Tensor>(), t[1].cast<torch::Tensor>(), t[2].cast<double>()};
    };
    auto linear = [](pybind11::handle h) {
      auto t = h.cast<pybind11::tuple>();
      c10::optional<torch::Tensor> bias;
      if (!t[3].is_none()) bias = t[3].cast<torch::Tensor>();
      return Linear{t[0].cast<torch::Tensor>(), t[1].cast<torch::Tensor>(), t[2].cast<torch::Tensor>(), bias};
    };
    c10::optional<torch::Tensor> keep;
    if (!head[4].is_none()) keep = head[4].cast<torch::Tensor>();
    head_ = Head{norm(head[0]), linear(head[1]), head[2].cast<torch::Tensor>(), head[3].cast<torch::Tensor>(), keep,
                 head[5].cast<int64_t>(), head[6].cast<int64_t>()};
    const int64_t N = head_.scales.numel();
    const int64_t* ids = keep ? keep->data_ptr<int64_t>() : nullptr;
    for (int64_t n = 0; n < N; n++) {  // runs of consecutive ids
      TORCH_CHECK(!ids || (ids[n] >= 0 && ids[n] < head_.vocab && (n == 0 || ids[n] > ids[n - 1])),
                  "lean_layers: the output layer's token ids must increase within the vocabulary");
      if (n > 0 && (ids ? ids[n] == ids[n - 1] + 1 : true)) runs_.back().second++;
      else runs_.emplace_back(n, 1);
    }
    for (auto h : layers) {
      auto t = h.cast<pybind11::tuple>();
      layers_.push_back(Layer{norm(t[0]), norm(t[3]), norm(t[6]), linear(t[1]), linear(t[2]), linear(t[4]),
                              linear(t[5]), linear(t[7]), linear(t[8])});
    }
  }

  // x [B, T, d]; keys, values [layers, B, heads, slots, head_dim] (the self-attention cache); holes [B, 1, 1, end]
  // bool or none; cross: per layer (K, V [B, heads, S, head_dim], K's scale [B, heads, 1, head_dim] and V's
  // [B, 1, heads, head_dim], or None: lean_whisper.cross_attention's) -> x after every layer
  torch::Tensor run(torch::Tensor x, torch::Tensor keys, torch::Tensor values, int64_t start,
                    c10::optional<torch::Tensor> holes, std::vector<CrossKV> cross) {
    TORCH_CHECK(cross.size() == layers_.size() && keys.size(0) == (int64_t)layers_.size(),
                "lean_layers: one cache and one cross K/V a layer");
    const int64_t B = x.size(0), T = x.size(1), d = x.size(2), end = start + T;
    for (size_t i = 0; i < layers_.size(); i++) {
      const Layer& p = layers_[i];
      auto h = at::layer_norm(x, {d}, p.norm1.weight, p.norm1.bias, p.norm1.eps);
      auto qkv = linear(h, p.qkv).view({B, T, 3, heads_, head_dim_});
      store(qkv, keys, values, i, start);
      qkv = qkv.permute({2, 0, 3, 1, 4});  // [3, B, heads, T, head_dim]
      auto k_i = keys.select(0, i), v_i = values.select(0, i);  // [B, heads, slots, head_dim]
      auto a = attend_(qkv.select(0, 0), k_i.narrow(2, 0, end), v_i.narrow(2, 0, end), holes, 1.0, true, c10::nullopt,
                       c10::nullopt);
      x = x + linear(a.reshape({B, T, d}), p.out);
      h = at::layer_norm(x, {d}, p.norm2.weight, p.norm2.bias, p.norm2.eps);
      auto q = linear(h, p.q).view({B, T, heads_, head_dim_}).transpose(1, 2);
      const auto& [K, V, ks, vs] = cross[i];
      a = attend_(q, K, V, c10::nullopt, 1.0, false, ks, vs);  // the scales' multiplications inside
      x = x + linear(a.reshape({B, T, d}), p.cross_out);
      h = at::layer_norm(x, {d}, p.norm3.weight, p.norm3.bias, p.norm3.eps);
      x = x + linear(at::gelu(linear(h, p.fc1)), p.fc2);
    }
    return x;
  }

  // x [B, T, d] (the last layer's) -> logits [B, T, vocab] fp32
  torch::Tensor head(torch::Tensor x) {
    const Head& p = head_;
    const int64_t d = x.size(-1);
    auto h = at::layer_norm(x, {d}, p.norm.weight, p.norm.bias, p.norm.eps).contiguous();  // [B, T, d]
    auto z = linear(h, p.estimate).contiguous();  // [B, T, N']
    auto out = at::empty({x.size(0), x.size(1), p.vocab}, z.options().dtype(at::kFloat));
    if (z.scalar_type() == at::kFloat) rescore<float>(h, z, out);
    else {
      TORCH_CHECK(z.scalar_type() == at::kBFloat16, "lean_layers: the draft's activations must be fp32 or bf16");
      rescore<c10::BFloat16>(h, z, out);
    }
    return out;
  }

 private:
  // per row of z [R, N'] (h [R, d]): the RESCORED largest (the first of equal values), recomputed; out [R, vocab] fp32
  template <typename T>
  void rescore(const torch::Tensor& h, const torch::Tensor& z, torch::Tensor& out) {
    const Head& p = head_;
    const int64_t N = z.size(-1), d = h.size(-1), R = z.numel() / N, V = p.vocab;
    const int64_t k = std::min<int64_t>(p.rescored, N);
    const T* zp = z.data_ptr<T>();
    const T* hp = h.data_ptr<T>();
    float* op = out.data_ptr<float>();
    const int8_t* w = p.ints.data_ptr<int8_t>();
    const float* s = p.scales.data_ptr<float>();
    const int64_t* ids = p.keep ? p.keep->data_ptr<int64_t>() : nullptr;
    const float minus_inf = -std::numeric_limits<float>::infinity();
    constexpr int64_t C = 32;  // values a chunk: one test against the k-th largest so far, most chunks pass whole
    at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
      std::vector<float> top(k);
      std::vector<int64_t> at(k);
      for (int64_t r = r0; r < r1; r++) {
        const T* zr = zp + r * N;
        float* o = op + r * V;
        int64_t have = 0;  // top[0 … have) descending
        for (int64_t c0 = 0; c0 < N; c0 += C) {
          const int64_t c1 = std::min(N, c0 + C);
          if (have == k && c1 - c0 == C) {
            const float bar = top[k - 1];
            bool above = false;
            for (int64_t n = c0; n < c1; n++) above |= static_cast<float>(zr[n]) > bar;
            if (!above) continue;
          }
          for (int64_t n = c0; n < c1; n++) {
            const float v = static_cast<float>(zr[n]);
            if (have == k && !(v > top[k - 1])) continue;
            int64_t i = have < k ? have++ : k - 1;
            for (; i > 0 && v > top[i - 1]; i--) top[i] = top[i - 1], at[i] = at[i - 1];
            top[i] = v, at[i] = n;
          }
        }
        int64_t next = 0;  // out's next id to write: runs of consecutive ids copied, the gaps −inf
        for (const auto& [n0, len] : runs_) {
          const int64_t id = ids ? ids[n0] : n0;
          std::fill(o + next, o + id, minus_inf);
          for (int64_t n = 0; n < len; n++) o[id + n] = static_cast<float>(zr[n0 + n]);
          next = id + len;
        }
        std::fill(o + next, o + V, minus_inf);
        for (int64_t i = 0; i < have; i++) {
          const int8_t* wn = w + at[i] * d;
          double acc = 0;
          for (int64_t j = 0; j < d; j++) acc += (double)wn[j] * (double)static_cast<float>(hp[r * d + j]);
          o[ids ? ids[at[i]] : at[i]] = (float)acc * s[at[i]];
        }
      }
    });
  }

  // k and v of qkv [B, T, 3, heads, head_dim] (contiguous: the product's output) into layer i's cache slots
  // start … start + T − 1 (keys, values [layers, B, heads, slots, head_dim], contiguous, of qkv's dtype: LeanDecoder's)
  static void store(const torch::Tensor& qkv, torch::Tensor& keys, torch::Tensor& values, int64_t i, int64_t start) {
    const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(3), D = qkv.size(4), slots = keys.size(3);
    TORCH_CHECK(qkv.is_contiguous(), "lean_layers: q, k, v must be contiguous");
    for (const auto* c : {&keys, &values})
      TORCH_CHECK(c->dim() == 5 && c->size(1) == B && c->size(2) == H && c->size(3) == slots && c->size(4) == D &&
                  c->is_contiguous() && c->scalar_type() == qkv.scalar_type() && start >= 0 && start + T <= slots,
                  "lean_layers: the cache must be [layers, B, heads, slots, head_dim], contiguous, in x's dtype");
    const int64_t size = qkv.element_size();
    const char* src = (const char*)qkv.data_ptr();
    char* dst[2] = {(char*)keys.data_ptr(), (char*)values.data_ptr()};
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < 2; c++)
          for (int64_t h = 0; h < H; h++)
            std::memcpy(dst[c] + ((((i * B + b) * H + h) * slots + start + t) * D) * size,
                        src + ((((b * T + t) * 3 + 1 + c) * H + h) * D) * size, D * size);
  }

  torch::Tensor linear(const torch::Tensor& x, const Linear& l) { return mm_(x, l.blocks, l.sums, l.scales, l.bias, 0); }

  int64_t heads_, head_dim_;
  Mm mm_;
  Attend attend_;
  Head head_;
  std::vector<std::pair<int64_t, int64_t>> runs_;  // the output layer's rows as (first row, count): consecutive ids
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Layers>(m, "Layers")
      .def(pybind11::init<pybind11::list, pybind11::tuple, int64_t, int64_t, pybind11::capsule, pybind11::capsule>())
      .def("run", &Layers::run, "x after every layer (the self-attention cache written)")
      .def("head", &Layers::head, "the logits of the last layer's x");
}
