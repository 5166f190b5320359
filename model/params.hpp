// Parameters: names, global shapes, the slice a stage holds, and deterministic init.
//
// Every parameter is defined by (seed, name) as a full tensor of its GLOBAL shape;
// a stage holds a slice of it: rows/columns [offset, offset + local) along split_dim
// (split_dim = -1: the whole tensor). Tensor-parallel shards are such slices; today
// every slice is full. init_param fills any slice with exactly the values the same
// elements have in the full tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "model/config.hpp"

namespace troupe::model {

struct ParamSpec {
  std::string name;
  Shape global_shape;
  int split_dim = -1;  // -1: not split
  int64_t offset = 0;  // first index along split_dim held here
  int64_t local = 0;   // extent along split_dim held here (ignored when split_dim == -1)
  bool decay = false;  // weight decay applies (all 2-D parameters, embeddings included)
  // Init: N(0, init_std) when init_std > 0, else the constant init_const.
  double init_std = 0.0;
  float init_const = 0.0f;

  Shape local_shape() const;
};

// What a parameter of a stage is, plus its storage (views into the stage's flat buffers).
struct Param {
  std::string name;
  Shape global_shape;
  int split_dim = -1;
  int64_t offset = 0;
  bool decay = false;
  Tensor data;  // local shape, f32
  Tensor grad;  // same shape as data
};

// The parameters of a stage, in a fixed order: wte.weight, wpe.weight (gpt) when the stage
// has the embedding; blocks in layer order; ln_f.{weight,bias} and, when the stage has the
// head but not the embedding, wte.weight (tied LM head) last.
std::vector<ParamSpec> param_specs(const ModelConfig& cfg, const StageRange& range);

// Fills out (local_shape numel floats) with the spec's slice of the full initial tensor.
void init_param(float* out, const ParamSpec& spec, uint64_t seed);

// Parameters of one stage in two flat f32 buffers (values, gradients), each parameter
// starting at a 64-byte boundary; the padding between parameters is zero and stays zero
// under the optimizer, so flat_grads() can be reduced or norm-summed as one buffer.
class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const std::vector<ParamSpec>& specs, uint64_t seed);

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  Param& get(const std::string& name);  // throws troupe::Error when absent
  const Param& get(const std::string& name) const;
  bool contains(const std::string& name) const;
  const Tensor& flat_params() const { return flat_data_; }
  const Tensor& flat_grads() const { return flat_grad_; }
  int64_t num_params() const { return num_params_; }  // sum of local numel, without padding
  void zero_grads() { flat_grad_.zero_(); }

 private:
  std::vector<Param> params_;
  Tensor flat_data_, flat_grad_;
  int64_t num_params_ = 0;
};

}  // namespace troupe::model
