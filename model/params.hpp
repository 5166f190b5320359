// Parameters: names, global shapes, the slice a stage holds, and deterministic init.
//
// Every parameter is defined by (seed, name) as a full tensor of its GLOBAL shape;
// a stage holds a slice of it along split_dim (split_dim = -1: the whole tensor): one
// run of rows/columns [offset, offset + local), or several runs (SlicePiece) laid end
// to end in the local tensor. Tensor-parallel shards are such slices; a shard of
// attn.c_attn is three runs, the q, k and v rows of its heads:
//   D = 16, NH = 4, tp = 2, shard 1 (heads 2, 3) of c_attn.weight (48, 16):
//   global rows [8,16) -> local [0,8) (q), [24,32) -> [8,16) (k), [40,48) -> [16,24) (v).
// init_param fills any slice with exactly the values the same elements have in the
// full tensor, so every layout holds slices of the same model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.hpp"
#include "core/tensor.hpp"
#include "model/config.hpp"

namespace troupe::kernels {
struct Kernels;
}

namespace troupe::model {

// Global indices [offset, offset + length) along split_dim, held at local indices
// [local_offset, local_offset + length).
struct SlicePiece {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t local_offset = 0;
  bool operator==(const SlicePiece& o) const {
    return offset == o.offset && length == o.length && local_offset == o.local_offset;
  }
};

struct ParamSpec {
  std::string name;
  Shape global_shape;
  int split_dim = -1;  // -1: not split
  int64_t offset = 0;  // first index along split_dim held here
  int64_t local = 0;   // extent along split_dim held here (ignored when split_dim == -1)
  // Several runs: their lengths sum to local, local offsets follow each other from 0,
  // offset == pieces[0].offset. Empty: the single run [offset, offset + local).
  std::vector<SlicePiece> pieces;
  bool decay = false;  // weight decay applies (all 2-D parameters, embeddings included)
  // Init: N(0, init_std) when init_std > 0, else the constant init_const.
  double init_std = 0.0;
  float init_const = 0.0f;
  // The LM head's copy of the tied embedding: see Param::tied_copy.
  bool tied_copy = false;

  Shape local_shape() const;  // checks the slice lies inside the global shape
  // The runs along split_dim, in local order ({} when not split).
  std::vector<SlicePiece> slice_pieces() const;
};

// What a parameter of a stage is, plus its storage (views into the stage's flat buffers).
struct Param {
  std::string name;
  Shape global_shape;
  int split_dim = -1;
  int64_t offset = 0;              // first global index along split_dim (pieces[0].offset)
  std::vector<SlicePiece> pieces;  // as ParamSpec::pieces; empty: one run from offset
  bool decay = false;
  // wte.weight held by a stage with the head but not the embedding (the last stage of
  // a pipeline): a copy of the first stage's wte for the tied LM head, not a parameter
  // of its own. Both copies get the same update once their grads are summed
  // (parallel::allreduce_tied_embedding); a global norm counts the weight once and a
  // checkpoint stores it once, from the embedding's stage.
  bool tied_copy = false;
  Tensor data;  // local shape, f32: the master weights the optimizer updates
  Tensor grad;  // same shape as data, f32
  // The weights the products (model::Linear) read, in the store's compute dtype;
  // LayerNorm, embeddings and biases read `data` (model/layers.hpp). With f32 the very
  // tensor `data` (one buffer, no copy); otherwise a view of the same shape into the
  // store's compute buffer, which ParamStore::refresh_compute() rounds from data.
  Tensor compute;

  // The runs along split_dim, in local order ({} when not split): what a checkpoint
  // writes with global offsets, and what load_param reads.
  std::vector<SlicePiece> slice_pieces() const;
};

// The parameters of a stage, in a fixed order: wte.weight, wpe.weight (gpt) when the stage
// has the embedding; blocks in layer order; ln_f.{weight,bias} (llama: ln_f.weight) and,
// when the stage has the head but not the embedding, wte.weight (tied LM head, tied_copy)
// last; an untied llama head holds lm_head.weight (V, D) instead.
//
// llama blocks: h.L.ln_1.weight, h.L.attn.c_attn.weight ((NH+2*NKV)*HS, D) rows q|k|v,
// h.L.attn.c_proj.weight (D, NH*HS), h.L.ln_2.weight, h.L.mlp.c_fc.weight (2F, D) rows
// gate|up, h.L.mlp.c_proj.weight (D, F); no biases. Under tensor parallelism a llama
// shard holds its q, k and v heads' rows of c_attn (three pieces), its gate and up rows
// of c_fc (two pieces), the matching columns of both c_proj, and rows
// [t*V/tp, (t+1)*V/tp) of wte and lm_head (vocabulary-parallel).
//
// Tensor shard t of tp (Megatron): attn.c_attn weight and bias hold the q, k and v rows
// of heads [t*NH/tp, (t+1)*NH/tp) (three pieces, local rows q|k|v); mlp.c_fc weight and
// bias hold rows [t*4D/tp, (t+1)*4D/tp); attn.c_proj.weight holds columns
// [t*D/tp, (t+1)*D/tp) and mlp.c_proj.weight columns [t*4D/tp, (t+1)*4D/tp), their biases
// whole. Everything else is whole on every shard. tp = 1: nothing is split.
std::vector<ParamSpec> param_specs(const ModelConfig& cfg, const LayerRange& range,
                                   const TensorShard& shard = {});

// Fills out (local_shape numel floats) with the spec's slice of the full initial tensor.
void init_param(float* out, const ParamSpec& spec, uint64_t seed);

// Parameters of one stage in two flat f32 buffers (values, gradients), each parameter
// starting at a 64-byte boundary; the padding between parameters is zero and stays zero
// under the optimizer, so flat_grads() can be reduced or norm-summed as one buffer.
//
// Master weights and grads are f32 whatever the compute dtype (llm.c's floatX split).
// With compute dtype bf16 or f16 a third flat buffer of that dtype holds the weights
// the layers read (Param::compute), each parameter at the same element offset as in
// the master buffer; with f32 it is the master buffer itself.
//
// The buffers come from `alloc` (the CPU's unless given): on a device, init_param fills a
// host buffer that is then copied over, and refresh_compute rounds with the kernel table's
// to_half (`kernels`, which a non-CPU store needs). Host code reads and writes a parameter
// through download / upload, whatever the device.
class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const std::vector<ParamSpec>& specs, uint64_t seed, DType compute_dtype = DType::f32,
             Allocator& alloc = cpu_allocator(), const kernels::Kernels* kernels = nullptr);

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  Param& get(const std::string& name);  // throws troupe::Error when absent
  const Param& get(const std::string& name) const;
  bool contains(const std::string& name) const;
  const Tensor& flat_params() const { return flat_data_; }
  const Tensor& flat_grads() const { return flat_grad_; }
  // The compute copy of flat_params() (the same tensor when compute_dtype() is f32).
  const Tensor& flat_compute() const { return flat_compute_; }
  DType compute_dtype() const { return flat_compute_.dtype(); }
  int64_t num_params() const { return num_params_; }  // sum of local numel, without padding
  void zero_grads() { flat_grad_.zero_(); }
  // Master -> compute copy after the master weights changed (an optimizer step, a
  // load): rounds to nearest even into bf16 / f16 (core/dtype_convert.hpp). With
  // f32 there is nothing to copy. The constructor leaves the copy fresh.
  void refresh_compute();

  Device device() const { return alloc_->device(); }
  // Host copy of a tensor of this store (a parameter's data or grad), and back.
  void download(const Tensor& t, float* host) const;
  void upload(const Tensor& t, const float* host);

 private:
  Allocator* alloc_ = &cpu_allocator();
  const kernels::Kernels* k_ = nullptr;
  std::vector<Param> params_;
  Tensor flat_data_, flat_grad_, flat_compute_;
  int64_t num_params_ = 0;
};

}  // namespace troupe::model
