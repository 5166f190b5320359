#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/rng.hpp"

namespace rng = troupe::rng;

TEST_CASE("rng: Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  auto a = rng::philox4x32({0, 0, 0, 0}, {0, 0});
  REQUIRE(a == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  auto b = rng::philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  REQUIRE(b == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  auto c = rng::philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  REQUIRE(c == std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("rng: FNV-1a name hash is stable", "[rng]") {
  REQUIRE(rng::name_hash("") == 0xcbf29ce484222325ull);
  REQUIRE(rng::name_hash("a") == 0xaf63dc4c8601ec8cull);
  REQUIRE(rng::name_hash("wte.weight") != rng::name_hash("wpe.weight"));
}

TEST_CASE("rng: values depend only on (seed, key, index)", "[rng]") {
  const uint64_t key = rng::name_hash("h.0.mlp.c_fc.weight");
  std::vector<float> full(1000), again(1000), part(300);
  rng::fill_normal(full.data(), full.size(), 42, key, 0, 0.0, 1.0);
  rng::fill_normal(again.data(), again.size(), 42, key, 0, 0.0, 1.0);
  rng::fill_normal(part.data(), part.size(), 42, key, 555, 0.0, 1.0);
  REQUIRE(full == again);
  for (size_t i = 0; i < part.size() && 555 + i < full.size(); ++i) REQUIRE(part[i] == full[555 + i]);
  std::vector<float> other_seed(1000), other_key(1000);
  rng::fill_normal(other_seed.data(), 1000, 43, key, 0, 0.0, 1.0);
  rng::fill_normal(other_key.data(), 1000, 42, key + 1, 0, 0.0, 1.0);
  REQUIRE(other_seed != full);
  REQUIRE(other_key != full);
}

TEST_CASE("rng: uniform and normal statistics", "[rng]") {
  const int n = 200000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0, umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    double u = rng::uniform(7, 99, static_cast<uint64_t>(i));
    double z = rng::normal(7, 99, static_cast<uint64_t>(i));
    su += u;
    su2 += u * u;
    sn += z;
    sn2 += z * z;
    umin = std::min(umin, u);
    umax = std::max(umax, u);
  }
  double um = su / n, nm = sn / n;
  REQUIRE(umin >= 0.0);
  REQUIRE(umax < 1.0);
  REQUIRE(std::abs(um - 0.5) < 0.005);
  REQUIRE(std::abs(su2 / n - um * um - 1.0 / 12) < 0.002);
  REQUIRE(std::abs(nm) < 0.01);
  REQUIRE(std::abs(std::sqrt(sn2 / n - nm * nm) - 1.0) < 0.01);
}

TEST_CASE("rng: stream is resumable and below() stays in range", "[rng]") {
  rng::Stream a(5, 6);
  std::vector<uint32_t> first;
  for (int i = 0; i < 7; ++i) first.push_back(a.next_u32());
  rng::Stream b(5, 6, 3);
  for (int i = 3; i < 7; ++i) REQUIRE(b.next_u32() == first[static_cast<size_t>(i)]);
  rng::Stream c(5, 6);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 10000; ++i) {
    uint64_t x = c.below(10);
    REQUIRE(x < 10);
    counts[x]++;
  }
  for (int k : counts) REQUIRE(std::abs(k - 1000) < 150);
  double s = 0;
  for (int i = 0; i < 10000; ++i) s += c.normal();
  REQUIRE(std::abs(s / 10000) < 0.05);
}
