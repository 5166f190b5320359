#include <catch2/catch.hpp>
#include <cstdint>

#include "core/error.hpp"
#include "core/tensor.hpp"

using troupe::DType;
using troupe::Tensor;

TEST_CASE("tensor: allocation is 64-byte aligned, zeros is zero", "[tensor]") {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::zeros({n, 3});
    REQUIRE(reinterpret_cast<uintptr_t>(t.data()) % Tensor::kAlignment == 0);
    REQUIRE(t.numel() == 3 * n);
    REQUIRE(t.nbytes() == static_cast<size_t>(12 * n));
    REQUIRE(t.owns_storage());
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(t.f32()[i] == 0.0f);
  }
  REQUIRE(troupe::dtype_size(DType::bf16) == 2);
  REQUIRE(troupe::dtype_size(DType::i64) == 8);
  REQUIRE(Tensor::zeros({0}).numel() == 0);
}

TEST_CASE("tensor: slice and reshape are views that keep the buffer alive", "[tensor]") {
  Tensor rows;
  {
    Tensor t = Tensor::empty({4, 3});
    for (int i = 0; i < 12; ++i) t.f32()[i] = static_cast<float>(i);
    rows = t.slice(1, 3);
    Tensor r = t.reshape({2, -1});
    REQUIRE(r.shape() == troupe::Shape{2, 6});
    REQUIRE(r.data() == t.data());
  }
  // the original handle is gone; the view still owns a share of the storage
  REQUIRE(rows.shape() == troupe::Shape{2, 3});
  REQUIRE(rows.f32()[0] == 3.0f);
  REQUIRE(rows.f32()[5] == 8.0f);
  rows.f32()[0] = -1.0f;
  Tensor c = rows.clone();
  rows.f32()[0] = 7.0f;
  REQUIRE(c.f32()[0] == -1.0f);
  REQUIRE(c.data() != rows.data());
}

TEST_CASE("tensor: non-owning view and dtype checks", "[tensor]") {
  int32_t buf[6] = {1, 2, 3, 4, 5, 6};
  Tensor v = Tensor::view_of(buf, {2, 3}, DType::i32);
  REQUIRE_FALSE(v.owns_storage());
  REQUIRE(v.i32()[4] == 5);
  REQUIRE(v.slice(1, 2).i32()[0] == 4);
  REQUIRE_THROWS_AS(v.f32(), troupe::Error);
  REQUIRE_THROWS_AS(v.reshape({4, 2}), troupe::Error);
  REQUIRE_THROWS_AS(v.slice(1, 3), troupe::Error);
  REQUIRE(v.size(-1) == 3);
  Tensor z = Tensor::zeros({6}, DType::i32);
  z.copy_from(v);
  REQUIRE(z.i32()[5] == 6);
  REQUIRE_THROWS_AS(z.copy_from(Tensor::zeros({6})), troupe::Error);
}
