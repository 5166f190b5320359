#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "model/sample.hpp"

using namespace troupe;

TEST_CASE("sample: greedy, top-k and frequencies follow the softmax", "[model][sample]") {
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  rng::Stream s(1, 2);
  REQUIRE(model::sample_token(logits.data(), 5, 0.0f, 0, s) == 1);  // first of the tied maxima
  REQUIRE(s.position() == 0);
  for (int i = 0; i < 200; ++i) {
    int32_t t = model::sample_token(logits.data(), 5, 1.0f, 2, s);
    REQUIRE((t == 1 || t == 3));
  }
  // Frequencies with temperature 1 over all tokens: p(2) = e^1 / (1 + 2e^2 + e + e^-1).
  std::vector<int> counts(5, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i)
    counts[static_cast<size_t>(model::sample_token(logits.data(), 5, 1.0f, 0, s))]++;
  double z = 1 + 2 * std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  REQUIRE(std::abs(counts[2] / double(n) - std::exp(1.0) / z) < 0.01);
  REQUIRE(std::abs(counts[4] / double(n) - std::exp(-1.0) / z) < 0.01);
  rng::Stream a(9, 9), b(9, 9);
  for (int i = 0; i < 50; ++i)
    REQUIRE(model::sample_token(logits.data(), 5, 0.8f, 0, a) ==
            model::sample_token(logits.data(), 5, 0.8f, 0, b));
}
