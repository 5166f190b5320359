// model::rope_inv_freq: the rotary frequencies of Llama 3.1's llama3 scaling.
#include <catch2/catch.hpp>
#include <cmath>

#include "model/config.hpp"

using namespace troupe;

TEST_CASE("rope_inv_freq: llama3 scaling keeps high frequencies, slows low ones by factor, blends between",
          "[core][spec]") {
  // HS 16, theta 500: wavelengths 6.3, 13.6, 29.6, 64.6, ...; original 32, low 1, high 4: pair 0
  // is above 32/4 in frequency (kept), pairs 1 and 2 between, pairs 3.. below 32/1 (divided).
  model::RopeScaling s;
  s.llama3 = true;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_positions = 32;
  const std::vector<float> plain = model::rope_inv_freq(16, 500.0, {});
  const std::vector<float> scaled = model::rope_inv_freq(16, 500.0, s);
  REQUIRE(plain.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(plain[size_t(i)] == Approx(std::pow(500.0, -2.0 * i / 16)).epsilon(1e-6));
  CHECK(scaled[0] == plain[0]);
  for (int i = 3; i < 8; ++i) CHECK(scaled[size_t(i)] == plain[size_t(i)] / 8.0f);
  for (int i = 1; i <= 2; ++i) {
    const double w = 2 * M_PI / plain[size_t(i)];
    const double smooth = (32 / w - 1) / 3;
    CHECK(scaled[size_t(i)] ==
          Approx((1 - smooth) * plain[size_t(i)] / 8 + smooth * plain[size_t(i)]).epsilon(1e-6));
    CHECK(scaled[size_t(i)] < plain[size_t(i)]);
    CHECK(scaled[size_t(i)] > plain[size_t(i)] / 8);
  }
}
