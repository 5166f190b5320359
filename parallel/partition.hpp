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

#include <vector>

#include "model/config.hpp"

namespace troupe::parallel {

struct StageCosts {
  double block = 1.0;      // always 1: the unit
  double embedding = 0.0;  // extra on model chunk 0
  double head = 0.0;       // extra on the last model chunk
};
StageCosts stage_costs(const model::ModelConfig& cfg);

struct Partition {
  int pp = 1;
  int virtual_stages = 1;
  std::vector<model::StageRange> chunks;  // by model chunk k = c * pp + p, k in [0, pp * v)
  std::vector<double> cost;               // block-equivalents of each model chunk

  int n_chunks() const { return static_cast<int>(chunks.size()); }
  static int model_chunk(int pp, int p, int c) { return c * pp + p; }
  const model::StageRange& of(int p, int c) const { return chunks.at(model_chunk(pp, p, c)); }
  double max_cost() const;
};

// Contiguous block ranges for pp * virtual_stages model chunks, each with >= 1
// block, minimising the most expensive chunk (the pipeline's bottleneck), then
// the sum of squared chunk costs (the rest as even as possible); remaining ties
// go to the split that gives earlier chunks more blocks. Deterministic.
// Throws troupe::Error when n_layers < pp * virtual_stages or a size is < 1.
Partition partition_layers(int n_layers, int pp, int virtual_stages, const model::ModelConfig& cfg);
// The same with explicit costs (tests, planners with measured costs).
Partition partition_layers(int n_layers, int pp, int virtual_stages, const StageCosts& costs);

}  // namespace troupe::parallel
