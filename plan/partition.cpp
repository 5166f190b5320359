#include "plan/partition.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace troupe::plan {

int64_t ModelShape::ffn() const {
  if (ffn_hidden > 0 && type != ModelType::mlp) return ffn_hidden;
  if (type == ModelType::llama) return (int64_t{8} * d_model / 3 + 63) / 64 * 64;
  return 4 * int64_t{d_model};
}

ModelShape model_shape(const JobSpec& spec) {
  ModelShape m{spec.model.type, spec.model.n_layers, spec.model.d_model, spec.model.vocab_size,
               spec.model.seq_len};
  m.n_heads = spec.model.n_heads;
  m.n_kv_heads = spec.model.n_kv_heads;
  m.ffn_hidden = spec.model.ffn_hidden;
  m.tie_embeddings = spec.model.type != ModelType::llama || spec.model.tie_embeddings;
  return m;
}

StageCosts stage_costs(const ModelShape& m) {
  const double D = m.d_model, V = m.vocab_size, T = m.seq_len;
  // Multiply-adds per token. GPT block: q|k|v 3D^2, attention projection D^2, MLP
  // 8D^2, and causal attention scores + weighted sum averaging T/2 keys: T*D.
  // A llama block costs about the same (q and o 2D^2, k|v at most 2D^2, SwiGLU's three
  // D x ~8D/3 products 8D^2). The MLP model's block is the MLP alone.
  const double block = m.type != ModelType::mlp ? 12 * D * D + T * D : 8 * D * D;
  StageCosts c;
  // Embedding: gather + position add forward, scatter-add backward, ~4D per token.
  c.embedding = 4 * D / block;
  // Head: the V x D logits GEMM, softmax + cross-entropy and their gradient (~4V
  // element-wise), ln_f (~8D).
  c.head = (V * D + 4 * V + 8 * D) / block;
  return c;
}

double Partition::max_cost() const {
  return cost.empty() ? 0.0 : *std::max_element(cost.begin(), cost.end());
}

Partition partition_layers(int pp, int virtual_stages, const ModelShape& m) {
  return partition_layers(m.n_layers, pp, virtual_stages, stage_costs(m));
}

Partition partition_layers(int n_layers, int pp, int virtual_stages, const StageCosts& costs) {
  TROUPE_CHECK(pp >= 1 && virtual_stages >= 1, "pipeline ", pp, " and virtual stages ", virtual_stages,
               " must be >= 1");
  const int S = pp * virtual_stages;
  TROUPE_CHECK(n_layers >= S, "a model of ", n_layers, " layers cannot give each of ", S,
               " pipeline stages (pipeline ", pp, " x virtual ", virtual_stages,
               ") a block: use fewer stages or more layers");
  auto chunk_cost = [&](int k, int n) {
    double c = n * costs.block;
    if (k == 0) c += costs.embedding;
    if (k == S - 1) c += costs.head;
    return c;
  };
  // No chunk of an optimal split costs more than the bottleneck of the even split (blocks
  // L/S each, earlier chunks one more), so no chunk holds more than nmax blocks: the loops
  // below stay near L/S blocks a chunk instead of running over all L.
  double even = 0;
  for (int k = 0, j = 0; k < S; ++k) {
    const int n = n_layers / S + (k < n_layers % S ? 1 : 0);
    even = std::max(even, chunk_cost(k, n));
    j += n;
  }
  const int nmax = costs.block > 0 ? std::min(n_layers, int(even / costs.block * (1 + 1e-9)) + 1) : n_layers;
  // Pass 1, best[k][j]: the least bottleneck for chunks k..S-1 over blocks j..L-1.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(n_layers + 1, inf));
  best[S][n_layers] = 0.0;
  for (int k = S - 1; k >= 0; --k)
    for (int j = 0; j <= n_layers; ++j)
      for (int n = 1; n <= nmax && j + n <= n_layers; ++n)
        best[k][j] = std::min(best[k][j], std::max(chunk_cost(k, n), best[k + 1][j + n]));
  const double bottleneck = best[0][0];
  TROUPE_CHECK(bottleneck < inf, "partition: no split of ", n_layers, " layers into ", S, " chunks");
  // Pass 2, sq[k][j]: the least sum of squared chunk costs under that bottleneck,
  // so the chunks that are not the bottleneck are as even as they can be.
  const double cap = bottleneck * (1 + 1e-12);
  std::vector<std::vector<double>> sq(S + 1, std::vector<double>(n_layers + 1, inf));
  sq[S][n_layers] = 0.0;
  for (int k = S - 1; k >= 0; --k)
    for (int j = 0; j <= n_layers; ++j)
      for (int n = 1; n <= nmax && j + n <= n_layers; ++n) {
        const double c = chunk_cost(k, n);
        if (c <= cap) sq[k][j] = std::min(sq[k][j], c * c + sq[k + 1][j + n]);
      }
  Partition p;
  p.pp = pp;
  p.virtual_stages = virtual_stages;
  int j = 0;
  for (int k = 0; k < S; ++k) {
    // The largest block count that reaches the optimum.
    int take = 0;
    for (int n = std::min(nmax, n_layers - j); n >= 1; --n) {
      const double c = chunk_cost(k, n);
      if (c <= cap && c * c + sq[k + 1][j + n] <= sq[k][j] * (1 + 1e-12)) {
        take = n;
        break;
      }
    }
    TROUPE_CHECK(take >= 1, "partition: no split of chunk ", k);
    p.chunks.push_back({j, j + take, k == 0, k == S - 1});
    p.cost.push_back(chunk_cost(k, take));
    j += take;
  }
  TROUPE_CHECK(j == n_layers, "partition covers ", j, " of ", n_layers, " layers");
  return p;
}

}  // namespace troupe::plan
