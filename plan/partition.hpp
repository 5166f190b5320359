// Stage partition: which blocks each (virtual) pipeline stage holds.
//
// Costs are in block-equivalents (multiply-adds per token of one transformer
// block = 1): the embedding rides on the first model chunk, ln_f + the LM head
// (a V x D GEMM over the B*T rows) + softmax/cross-entropy on the last. For a
// GPT-2 small shape (V = 50257, D = 768, T = 1024) the head alone costs ~4.9
// blocks, which is why the last stage gets fewer blocks.
//
// With v virtual stages per pipeline rank there are S = pp * v model chunks;
// local chunk c of pipeline rank p is model chunk k = c * pp + p (Megatron's
// interleaving), so the chunks of one rank are spread along the depth.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/layer_range.hpp"
#include "core/spec.hpp"

namespace troupe::plan {

// What the cost model needs of the model (read from the spec's model section).
struct ModelShape {
  ModelType type = ModelType::gpt;
  int n_layers = 1;
  int d_model = 1;
  int vocab_size = 1;
  int seq_len = 1;
  // The rest is read by the cost model (plan/cost_model.hpp); 0 = the model type's default.
  int n_heads = 0;             // 0: one head per 64 channels
  int n_kv_heads = 0;          // 0: n_heads
  int ffn_hidden = 0;          // 0: 4 d_model (gpt, mlp), 64 * ceil(8 d_model / 3 / 64) (llama)
  bool tie_embeddings = true;  // the LM head reads wte (gpt and mlp always)

  int heads() const { return n_heads > 0 ? n_heads : std::max(1, d_model / 64); }
  int kv_heads() const { return type == ModelType::llama && n_kv_heads > 0 ? n_kv_heads : heads(); }
  int64_t ffn() const;
  bool tied() const { return type != ModelType::llama || tie_embeddings; }
};
ModelShape model_shape(const JobSpec& spec);

struct StageCosts {
  double block = 1.0;      // always 1: the unit
  double embedding = 0.0;  // extra on model chunk 0
  double head = 0.0;       // extra on the last model chunk
};
StageCosts stage_costs(const ModelShape& m);

struct Partition {
  int pp = 1;
  int virtual_stages = 1;
  // Each model chunk's layers (core/layer_range.hpp): blocks, plus the embedding on model
  // chunk 0 and the head on the last.
  std::vector<LayerRange> chunks;  // by model chunk k = c * pp + p, k in [0, pp * v)
  std::vector<double> cost;        // block-equivalents of each model chunk

  int n_chunks() const { return static_cast<int>(chunks.size()); }
  static int model_chunk(int pp, int p, int c) { return c * pp + p; }
  const LayerRange& of(int p, int c) const { return chunks.at(model_chunk(pp, p, c)); }
  double max_cost() const;
};

// Contiguous block ranges for pp * virtual_stages model chunks, each with >= 1
// block, minimising the most expensive chunk (the pipeline's bottleneck), then
// the sum of squared chunk costs (the rest as even as possible); remaining ties
// go to the split that gives earlier chunks more blocks. Deterministic.
// Throws troupe::Error when n_layers < pp * virtual_stages or a size is < 1.
Partition partition_layers(int pp, int virtual_stages, const ModelShape& m);
// The same with explicit costs (tests, planners with measured costs).
Partition partition_layers(int n_layers, int pp, int virtual_stages, const StageCosts& costs);

}  // namespace troupe::plan
