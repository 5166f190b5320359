#include <array>
#include <catch2/catch.hpp>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

// out(B,T,C) = wte(V,C)[tokens] + wpe(T,C)[t]; wpe empty = no positions.
std::vector<double> ref_embedding(const std::vector<int32_t>& tokens, const std::vector<double>& wte,
                                  const std::vector<double>& wpe, int B, int T, int C) {
  std::vector<double> out(size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const size_t bt = size_t(b) * T + t;
        out[bt * C + c] = wte[size_t(tokens[bt]) * C + c] + (wpe.empty() ? 0.0 : wpe[size_t(t) * C + c]);
      }
  return out;
}

// {B, T, C, V}
const std::array<std::array<int, 4>, 3> kShapes = {{{2, 5, 7, 11}, {1, 1, 1, 1}, {3, 4, 9, 3}}};

}  // namespace

TEST_CASE("embedding forward matches a double reference", "[kernels][embedding]") {
  for (auto [B, T, C, V] : kShapes)
    for (bool with_wpe : {true, false}) {
      CAPTURE(B, T, C, V, with_wpe);
      const auto tokens = random_tokens(size_t(B) * T, V, 1);
      const auto wte = random_vec(size_t(V) * C, 2), wpe = random_vec(size_t(T) * C, 3);
      std::vector<float> out(size_t(B) * T * C, -7.0f);
      k::embedding_forward(out.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr, B, T, C,
                           V);
      const auto ref =
          ref_embedding(tokens, to_double(wte), with_wpe ? to_double(wpe) : std::vector<double>{}, B, T, C);
      require_close(out, ref, 0.0, 1e-6, "embedding out");
    }
}

TEST_CASE("embedding backward matches finite differences and accumulates", "[kernels][embedding]") {
  for (auto [B, T, C, V] : kShapes)
    for (bool with_wpe : {true, false}) {
      CAPTURE(B, T, C, V, with_wpe);
      auto tokens = random_tokens(size_t(B) * T, V, 21);
      if (tokens.size() > 3) tokens[3] = tokens[0];  // a repeated token sums its rows
      const auto wte = random_vec(size_t(V) * C, 22), wpe = random_vec(size_t(T) * C, 23);
      const auto R = random_vec(size_t(B) * T * C, 24);
      const auto dte = to_double(wte), dpe = with_wpe ? to_double(wpe) : std::vector<double>{};

      const auto g_wte = finite_diff(dte, [&](const std::vector<double>& x) {
        return weighted_sum(ref_embedding(tokens, x, dpe, B, T, C), R);
      });
      std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
      k::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, R.data(), tokens.data(), B, T, C,
                            V);
      require_close(dwte, g_wte, kGradRtol, kGradAtol, "dwte");
      if (with_wpe) {
        const auto g_wpe = finite_diff(dpe, [&](const std::vector<double>& x) {
          return weighted_sum(ref_embedding(tokens, dte, x, B, T, C), R);
        });
        require_close(dwpe, g_wpe, kGradRtol, kGradAtol, "dwpe");
      } else {
        for (float g : dwpe) REQUIRE(g == 0.0f);
      }

      const auto once_te = dwte, once_pe = dwpe;
      k::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, R.data(), tokens.data(), B, T, C,
                            V);
      for (size_t i = 0; i < dwte.size(); ++i) REQUIRE(dwte[i] == Approx(2.0 * once_te[i]).margin(1e-6));
      for (size_t i = 0; i < dwpe.size(); ++i) REQUIRE(dwpe[i] == Approx(2.0 * once_pe[i]).margin(1e-6));
    }
}

TEST_CASE("embedding rejects tokens outside the vocabulary", "[kernels][embedding]") {
  const int B = 1, T = 2, C = 3, V = 4;
  const auto wte = random_vec(size_t(V) * C, 5);
  std::vector<float> out(size_t(B) * T * C), dwte(wte.size());
  for (int32_t bad : {-1, V}) {
    const std::vector<int32_t> tokens = {0, bad};
    REQUIRE_THROWS_AS(k::embedding_forward(out.data(), tokens.data(), wte.data(), nullptr, B, T, C, V),
                      troupe::Error);
    REQUIRE_THROWS_AS(k::embedding_backward(dwte.data(), nullptr, out.data(), tokens.data(), B, T, C, V),
                      troupe::Error);
  }
}
