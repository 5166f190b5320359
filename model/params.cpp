#include "model/params.hpp"

#include <cmath>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace troupe::model {
namespace {

constexpr double kInitStd = 0.02;
constexpr int64_t kAlignFloats = Tensor::kAlignment / sizeof(float);

ParamSpec weight(std::string name, Shape shape, double std) {
  ParamSpec p;
  p.name = std::move(name);
  p.global_shape = std::move(shape);
  p.decay = true;
  p.init_std = std;
  return p;
}

ParamSpec constant(std::string name, int64_t n, float value) {
  ParamSpec p;
  p.name = std::move(name);
  p.global_shape = {n};
  p.init_const = value;
  return p;
}

void add_layernorm(std::vector<ParamSpec>& out, const std::string& prefix, int64_t D) {
  out.push_back(constant(prefix + ".weight", D, 1.0f));
  out.push_back(constant(prefix + ".bias", D, 0.0f));
}

void add_linear(std::vector<ParamSpec>& out, const std::string& prefix, int64_t n_out, int64_t n_in,
                double std) {
  out.push_back(weight(prefix + ".weight", {n_out, n_in}, std));
  out.push_back(constant(prefix + ".bias", n_out, 0.0f));
}

// The pieces must lie inside [0, G) and fill the local indices [0, local) end to end.
void check_pieces(const std::string& name, const std::vector<SlicePiece>& pieces, int64_t G, int64_t local) {
  int64_t at = 0;
  for (const SlicePiece& q : pieces) {
    TROUPE_CHECK(q.length > 0 && q.offset >= 0 && q.offset + q.length <= G, name, ": piece [", q.offset, ", ",
                 q.offset + q.length, ") outside [0, ", G, ")");
    TROUPE_CHECK(q.local_offset == at, name, ": piece at local ", q.local_offset, ", expected ", at,
                 " (pieces are laid end to end)");
    at += q.length;
  }
  TROUPE_CHECK(at == local, name, ": pieces hold ", at, " indices, the slice has ", local);
}

}  // namespace

Shape ParamSpec::local_shape() const {
  Shape s = global_shape;
  if (split_dim >= 0) {
    TROUPE_CHECK(split_dim < static_cast<int>(s.size()), name, ": split_dim ", split_dim, " out of range");
    const int64_t G = s[static_cast<size_t>(split_dim)];
    if (pieces.empty()) {
      TROUPE_CHECK(offset >= 0 && local >= 0 && offset + local <= G, name, ": slice [", offset, ", ",
                   offset + local, ") outside ", shape_str(global_shape));
    } else {
      check_pieces(name, pieces, G, local);
      TROUPE_CHECK(offset == pieces.front().offset, name, ": offset ", offset, " is not the first piece's ",
                   pieces.front().offset);
    }
    s[static_cast<size_t>(split_dim)] = local;
  }
  return s;
}

std::vector<SlicePiece> ParamSpec::slice_pieces() const {
  if (split_dim < 0) return {};
  if (!pieces.empty()) return pieces;
  if (local == 0) return {};
  return {SlicePiece{offset, local, 0}};
}

std::vector<SlicePiece> Param::slice_pieces() const {
  if (split_dim < 0) return {};
  if (!pieces.empty()) return pieces;
  const int64_t local = data.shape().at(static_cast<size_t>(split_dim));
  if (local == 0) return {};
  return {SlicePiece{offset, local, 0}};
}

namespace {

// Rows [t*n/tp, (t+1)*n/tp) of each of `parts` consecutive blocks of n rows (n = rows of
// one block): one piece per block, laid end to end.
void shard_rows(ParamSpec& p, int64_t n, int parts, const TensorShard& shard) {
  const int64_t len = n / shard.size;
  p.split_dim = 0;
  p.local = len * parts;
  for (int i = 0; i < parts; ++i) p.pieces.push_back({i * n + shard.rank * len, len, i * len});
  p.offset = p.pieces.front().offset;
  if (parts == 1) p.pieces.clear();  // one run: the plain (offset, local) form
}

void shard_cols(ParamSpec& p, int64_t n, const TensorShard& shard) {
  const int64_t len = n / shard.size;
  p.split_dim = 1;
  p.local = len;
  p.offset = shard.rank * len;
}

// A llama block: RMSNorm weights, a fused q|k|v projection ((NH + 2 NKV) HS, D), the
// attention output (D, NH HS), a fused gate|up projection (2F, D) and down (D, F); no
// biases. Shard t holds its heads' q rows, its kv heads' k and v rows (three pieces),
// its hidden units' gate and up rows (two pieces), and the matching columns of the
// output projections.
void add_llama_block(std::vector<ParamSpec>& out, const std::string& h, const ModelConfig& cfg,
                     const TensorShard& shard, double proj_std) {
  const int64_t D = cfg.d_model, HS = cfg.head_dim(), Q = int64_t{cfg.n_head} * HS,
                KV = int64_t{cfg.kv_heads()} * HS, F = cfg.ffn();
  out.push_back(constant(h + ".ln_1.weight", D, 1.0f));
  out.push_back(weight(h + ".attn.c_attn.weight", {Q + 2 * KV, D}, kInitStd));
  out.push_back(weight(h + ".attn.c_proj.weight", {D, Q}, proj_std));
  out.push_back(constant(h + ".ln_2.weight", D, 1.0f));
  out.push_back(weight(h + ".mlp.c_fc.weight", {2 * F, D}, kInitStd));
  out.push_back(weight(h + ".mlp.c_proj.weight", {D, F}, proj_std));
  if (shard.size == 1) return;
  const size_t n = out.size();
  ParamSpec& qkv = out[n - 5];
  const int64_t q = Q / shard.size, kv = KV / shard.size;
  qkv.split_dim = 0;
  qkv.local = q + 2 * kv;
  qkv.pieces = {{shard.rank * q, q, 0}, {Q + shard.rank * kv, kv, q}, {Q + KV + shard.rank * kv, kv, q + kv}};
  qkv.offset = qkv.pieces.front().offset;
  shard_cols(out[n - 4], Q, shard);
  shard_rows(out[n - 2], F, 2, shard);  // gate rows, up rows
  shard_cols(out[n - 1], F, shard);
}

}  // namespace

std::vector<ParamSpec> param_specs(const ModelConfig& cfg, const LayerRange& range,
                                   const TensorShard& shard) {
  cfg.validate();
  shard.validate(cfg);
  TROUPE_CHECK(0 <= range.first && range.first <= range.last && range.last <= cfg.n_layer, "stage layers [",
               range.first, ", ", range.last, ") outside a model of ", cfg.n_layer, " layers");
  const int64_t V = cfg.vocab_size, D = cfg.d_model, T = cfg.seq_len, F = cfg.ffn();
  // GPT-2: residual output projections scaled by 1/sqrt(2L) so the residual stream's
  // variance does not grow with depth.
  const double proj_std = kInitStd / std::sqrt(2.0 * std::max(cfg.n_layer, 1));
  std::vector<ParamSpec> out;
  // Vocabulary rows of this shard (llama under tensor parallelism), else whole.
  auto vocab_rows = [&](ParamSpec p) {
    if (cfg.vocab_parallel() && shard.size > 1) shard_rows(p, V, 1, shard);
    return p;
  };
  if (range.has_embedding) {
    out.push_back(vocab_rows(weight("wte.weight", {V, D}, kInitStd)));
    if (cfg.kind == ModelKind::gpt) out.push_back(weight("wpe.weight", {T, D}, kInitStd));
  }
  for (int l = range.first; l < range.last; ++l) {
    const std::string h = "h." + std::to_string(l);
    if (cfg.kind == ModelKind::llama) {
      add_llama_block(out, h, cfg, shard, proj_std);
      continue;
    }
    if (cfg.kind == ModelKind::gpt) {
      add_layernorm(out, h + ".ln_1", D);
      add_linear(out, h + ".attn.c_attn", 3 * D, D, kInitStd);
      add_linear(out, h + ".attn.c_proj", D, D, proj_std);
      if (shard.size > 1) {
        const size_t n = out.size();
        shard_rows(out[n - 4], D, 3, shard);  // c_attn.weight: q|k|v rows of this shard's heads
        shard_rows(out[n - 3], D, 3, shard);  // c_attn.bias
        shard_cols(out[n - 2], D, shard);     // c_proj.weight: the columns that read those heads
      }
    }
    add_layernorm(out, h + ".ln_2", D);
    add_linear(out, h + ".mlp.c_fc", F, D, kInitStd);
    add_linear(out, h + ".mlp.c_proj", D, F, proj_std);
    if (shard.size > 1) {
      const size_t n = out.size();
      shard_rows(out[n - 4], F, 1, shard);  // c_fc.weight
      shard_rows(out[n - 3], F, 1, shard);  // c_fc.bias
      shard_cols(out[n - 2], F, shard);     // c_proj.weight
    }
  }
  if (range.has_head) {
    if (cfg.kind == ModelKind::llama)
      out.push_back(constant("ln_f.weight", D, 1.0f));
    else
      add_layernorm(out, "ln_f", D);
    if (!cfg.tied_head()) {
      out.push_back(vocab_rows(weight("lm_head.weight", {V, D}, kInitStd)));
    } else if (!range.has_embedding) {
      out.push_back(vocab_rows(weight("wte.weight", {V, D}, kInitStd)));
      out.back().tied_copy = true;  // the LM head's copy of the first stage's wte
    }
  }
  return out;
}

void init_param(float* out, const ParamSpec& spec, uint64_t seed) {
  Shape local = spec.local_shape();
  int64_t n = shape_numel(local);
  if (spec.init_std <= 0.0) {
    for (int64_t i = 0; i < n; ++i) out[i] = spec.init_const;
    return;
  }
  const uint64_t key = rng::name_hash(spec.name);
  if (spec.split_dim < 0 || n == 0) {
    rng::fill_normal(out, static_cast<size_t>(n), seed, key, 0, 0.0, spec.init_std);
    return;
  }
  // local index (o, piece.local_offset + j, k) -> global index (o, piece.offset + j, k)
  // around the split dim.
  const size_t d = static_cast<size_t>(spec.split_dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= spec.global_shape[i];
  for (size_t i = d + 1; i < spec.global_shape.size(); ++i) inner *= spec.global_shape[i];
  const int64_t G = spec.global_shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (const SlicePiece& q : spec.slice_pieces())
      for (int64_t j = 0; j < q.length; ++j) {
        uint64_t g = static_cast<uint64_t>((o * G + q.offset + j) * inner);
        rng::fill_normal(out + (o * spec.local + q.local_offset + j) * inner, static_cast<size_t>(inner),
                         seed, key, g, 0.0, spec.init_std);
      }
}

ParamStore::ParamStore(const std::vector<ParamSpec>& specs, uint64_t seed, DType compute_dtype,
                       Allocator& alloc, const kernels::Kernels* kernels)
    : alloc_(&alloc), k_(kernels) {
  TROUPE_CHECK(alloc.device() == Device::cpu || (kernels != nullptr && kernels->device == alloc.device()),
               "a parameter store on ", device_name(alloc.device()), " needs that device's kernels");
  TROUPE_CHECK(compute_dtype == DType::f32 || compute_dtype == DType::bf16 || compute_dtype == DType::f16,
               "parameters compute in f32, bf16 or f16, not ", dtype_name(compute_dtype));
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& s : specs) {
    offsets.push_back(total);
    int64_t n = shape_numel(s.local_shape());
    num_params_ += n;
    total += (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  flat_data_ = Tensor::zeros({total}, DType::f32, alloc);
  flat_grad_ = Tensor::zeros({total}, DType::f32, alloc);
  flat_compute_ = compute_dtype == DType::f32 ? flat_data_ : Tensor::zeros({total}, compute_dtype, alloc);
  std::vector<float> host;  // a device store's initial values, one parameter at a time
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    TROUPE_CHECK(!contains(s.name), "duplicate parameter ", s.name);
    Shape local = s.local_shape();
    int64_t n = shape_numel(local);
    Param p;
    p.name = s.name;
    p.global_shape = s.global_shape;
    p.split_dim = s.split_dim;
    p.offset = s.offset;
    p.pieces = s.pieces;
    p.decay = s.decay;
    p.tied_copy = s.tied_copy;
    p.data = flat_data_.slice(offsets[i], offsets[i] + n).reshape(local);
    p.grad = flat_grad_.slice(offsets[i], offsets[i] + n).reshape(local);
    p.compute =
        compute_dtype == DType::f32 ? p.data : flat_compute_.slice(offsets[i], offsets[i] + n).reshape(local);
    if (device() == Device::cpu) {
      init_param(p.data.f32(), s, seed);
    } else {
      host.assign(static_cast<size_t>(n), 0.0f);
      init_param(host.data(), s, seed);
      upload(p.data, host.data());
    }
    params_.push_back(std::move(p));
  }
  refresh_compute();
}

void ParamStore::refresh_compute() {
  if (flat_compute_.data() == flat_data_.data()) return;  // f32: the compute copy is the master
  // One pass over the whole buffer: the zero padding converts to zero. The table's to_half
  // gives dtype_convert's bits, vectorised.
  const kernels::Kernels& k = k_ != nullptr ? *k_ : kernels::cpu_kernels();
  k.to_half(flat_compute_.dtype(), flat_compute_.h16(), flat_data_.f32(),
            static_cast<size_t>(flat_data_.numel()));
}

void ParamStore::download(const Tensor& t, float* host) const {
  TROUPE_CHECK(t.dtype() == DType::f32 && t.device() == device(), "download of a ", dtype_name(t.dtype()),
               " tensor on ", device_name(t.device()), " from a store of f32 on ", device_name(device()));
  alloc_->copy_to_host(host, t.data(), t.nbytes());
}

void ParamStore::upload(const Tensor& t, const float* host) {
  TROUPE_CHECK(t.dtype() == DType::f32 && t.device() == device(), "upload into a ", dtype_name(t.dtype()),
               " tensor on ", device_name(t.device()), " of a store of f32 on ", device_name(device()));
  alloc_->copy_from_host(t.data(), host, t.nbytes());
}

bool ParamStore::contains(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return true;
  return false;
}

Param& ParamStore::get(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  TROUPE_CHECK(false, "no parameter named ", name);
  return params_.front();
}

const Param& ParamStore::get(const std::string& name) const {
  return const_cast<ParamStore*>(this)->get(name);
}

}  // namespace troupe::model
