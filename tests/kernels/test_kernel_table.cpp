// kernels::cpu_kernels(): every entry is set, names the CPU, and is the very function
// of kernels/cpu/kernels.hpp (so a call through the table gives the direct call's bits).
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using troupe::kernels::Kernels;
using namespace troupe::kernels::test;

TEST_CASE("kernel table: the CPU table holds the CPU kernels", "[kernels][table]") {
  const Kernels& t = troupe::kernels::cpu_kernels();
  CHECK(&t == &troupe::kernels::cpu_kernels());
  CHECK(std::string(t.name) == "cpu");
  CHECK(t.device == troupe::Device::cpu);
  CHECK(t.linear_forward == &k::linear_forward);
  CHECK(t.linear_backward == &k::linear_backward);
  CHECK(t.embedding_forward == &k::embedding_forward);
  CHECK(t.embedding_backward == &k::embedding_backward);
  CHECK(t.layernorm_forward == &k::layernorm_forward);
  CHECK(t.layernorm_backward == &k::layernorm_backward);
  CHECK(t.attention_forward == &k::attention_forward);
  CHECK(t.attention_backward == &k::attention_backward);
  CHECK(t.attention_forward_h == &k::attention_forward_h);
  CHECK(t.attention_backward_h == &k::attention_backward_h);
  CHECK(t.layernorm_forward_h == &k::layernorm_forward_h);
  CHECK(t.rmsnorm_forward_h == &k::rmsnorm_forward_h);
  CHECK(t.gelu_forward_h == &k::gelu_forward_h);
  CHECK(t.swiglu_forward_h == &k::swiglu_forward_h);
  CHECK(t.gelu_forward == &k::gelu_forward);
  CHECK(t.gelu_backward == &k::gelu_backward);
  CHECK(t.gelu_backward_inplace == &k::gelu_backward_inplace);
  CHECK(t.residual_forward == &k::residual_forward);
  CHECK(t.add_inplace == &k::add_inplace);
  CHECK(t.scale_inplace == &k::scale_inplace);
  CHECK(t.cross_entropy == &k::cross_entropy);
  CHECK(t.adamw_update == &k::adamw_update);
  CHECK(t.sum_squares == &k::sum_squares);
}

TEST_CASE("kernel table: a linear layer through the table equals the direct call bit for bit",
          "[kernels][table]") {
  const Kernels& t = troupe::kernels::cpu_kernels();
  const int N = 9, IC = 33, OC = 17;
  const auto x = random_vec(size_t(N) * IC, 1), w = random_vec(size_t(OC) * IC, 2), b = random_vec(OC, 3);
  const auto dy = random_vec(size_t(N) * OC, 4);
  std::vector<float> y1(size_t(N) * OC), y2(y1.size());
  k::linear_forward(y1.data(), x.data(), w.data(), b.data(), N, IC, OC);
  t.linear_forward(y2.data(), x.data(), w.data(), b.data(), N, IC, OC);
  CHECK(y1 == y2);
  std::vector<float> dx1(x.size()), dx2(x.size()), dw1(w.size()), dw2(w.size()), db1(b.size()), db2(b.size());
  k::linear_backward(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), N, IC, OC,
                     k::Out::overwrite);
  t.linear_backward(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), N, IC, OC,
                    troupe::kernels::Out::overwrite);
  CHECK(dx1 == dx2);
  CHECK(dw1 == dw2);
  CHECK(db1 == db2);
}
