// The self draft's decoder layers (drafts/lean_whisper.LeanDecoder._layers) in one C++ call: the same operations in
// the same order (ATen's layer_norm, gelu and adds, int8_rows' mm, rows_attention's attend, reached through the
// addresses their modules hand out), so the same bits, without ~25 Python calls a layer (a draft step over three
// windows spent ~1 ms of its 2.6 outside its kernels).
//
// Per layer (x [B, T, d]; q, k, v [B, heads, T, head_dim]; the query scale folded into the weights):
//   x += out(attend(LN1(x)·Wqkv, cache))        k, v written to the cache's slots start … start + T − 1 first
//   x += cross_out(attend(LN2(x)·Wq · Ks, K, V) · Vs)    K, V int8 with per-channel scales Ks, Vs (or as they are)
//   x += fc2(gelu(fc1(LN3(x))))

#include <torch/extension.h>

#include <tuple>
#include <vector>

namespace {

using Mm = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>,
                             int64_t);
using CrossKV = std::tuple<torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>>;
using Attend = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, double,
                                 bool);

struct Linear {  // int8_rows.Packed and its bias
  torch::Tensor blocks, sums, scales;
  c10::optional<torch::Tensor> bias;
};

struct Norm {
  torch::Tensor weight, bias;
  double eps;
};

struct Layer {
  Norm norm1, norm2, norm3;
  Linear qkv, out, q, cross_out, fc1, fc2;
};

class Layers {
 public:
  // layers: per layer (norm1, qkv, out, norm2, q, cross_out, norm3, fc1, fc2), a norm as (weight, bias, eps), a
  // linear as (blocks, sums, scales, bias or None)
  Layers(pybind11::list layers, int64_t heads, int64_t head_dim, pybind11::capsule mm, pybind11::capsule attend)
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
      auto qkv = linear(h, p.qkv).view({B, T, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
      auto k_i = keys.select(0, i), v_i = values.select(0, i);  // [B, heads, slots, head_dim]
      k_i.narrow(2, start, T).copy_(qkv.select(0, 1));
      v_i.narrow(2, start, T).copy_(qkv.select(0, 2));
      auto a = attend_(qkv.select(0, 0), k_i.narrow(2, 0, end), v_i.narrow(2, 0, end), holes, 1.0, true);
      x = x + linear(a.reshape({B, T, d}), p.out);
      h = at::layer_norm(x, {d}, p.norm2.weight, p.norm2.bias, p.norm2.eps);
      auto q = linear(h, p.q).view({B, T, heads_, head_dim_}).transpose(1, 2);
      const auto& [K, V, ks, vs] = cross[i];
      if (ks) a = (attend_(q * *ks, K, V, c10::nullopt, 1.0, false) * *vs).to(q.scalar_type());
      else a = attend_(q, K, V, c10::nullopt, 1.0, false);
      x = x + linear(a.reshape({B, T, d}), p.cross_out);
      h = at::layer_norm(x, {d}, p.norm3.weight, p.norm3.bias, p.norm3.eps);
      x = x + linear(at::gelu(linear(h, p.fc1)), p.fc2);
    }
    return x;
  }

 private:
  torch::Tensor linear(const torch::Tensor& x, const Linear& l) { return mm_(x, l.blocks, l.sums, l.scales, l.bias, 0); }

  int64_t heads_, head_dim_;
  Mm mm_;
  Attend attend_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Layers>(m, "Layers")
      .def(pybind11::init<pybind11::list, int64_t, int64_t, pybind11::capsule, pybind11::capsule>())
      .def("run", &Layers::run, "x after every layer (the self-attention cache written)");
}
