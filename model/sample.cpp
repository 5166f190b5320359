#include "model/sample.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"

namespace troupe::model {

int32_t sample_token(const float* logits, int V, float temperature, int top_k, rng::Stream& stream) {
  TROUPE_CHECK(logits != nullptr && V > 0, "sample_token needs logits");
  if (temperature <= 0.0f) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // Stable order (value desc, index asc) so that ties never depend on the sort's internals.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t k = top_k > 0 ? std::min<size_t>(static_cast<size_t>(top_k), order.size()) : order.size();
  std::vector<double> p(k);
  const double mx = logits[order[0]];
  double z = 0;
  for (size_t i = 0; i < k; ++i) z += (p[i] = std::exp((logits[order[i]] - mx) / temperature));
  double u = stream.uniform() * z;
  for (size_t i = 0; i < k; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[k - 1];
}

}  // namespace troupe::model
