// fp16 dynamic loss scaling, GradScaler's rule: 2^16 to start, x0.5 and a skipped step
// on any inf/NaN, x2 after 2000 clean steps in a row; off in fp32 and bf16.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "parallel/loss_scale.hpp"

using troupe::parallel::LossScaler;
using troupe::parallel::LossScaleState;

TEST_CASE("loss scale: halves and skips on an overflow, doubles after 2000 clean steps", "[parallel][half]") {
  LossScaler s(true);
  CHECK(s.scale() == 65536.0);
  CHECK(s.update(false));
  CHECK(s.state().clean_steps == 1);
  CHECK_FALSE(s.update(true));  // skipped
  CHECK(s.scale() == 32768.0);
  CHECK(s.state().clean_steps == 0);
  CHECK(s.state().skipped_steps == 1);
  for (int i = 0; i < 1999; ++i) REQUIRE(s.update(false));
  CHECK(s.scale() == 32768.0);  // 1999 clean steps: not yet
  CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);  // the 2000th
  CHECK(s.state().clean_steps == 0);
  CHECK(s.state().skipped_steps == 1);
  // Overflows in a row keep halving.
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 16384.0);
  CHECK(s.state().skipped_steps == 3);
}

TEST_CASE("loss scale: disabled it scales by 1 and never skips, but keeps a restored skip count",
          "[parallel][half]") {
  LossScaler s(false);
  CHECK(s.scale() == 1.0);
  CHECK(s.update(true));
  CHECK(s.state().skipped_steps == 0);
  s.restore(LossScaleState{1024.0, 7, 2});  // an fp16 checkpoint resumed in bf16
  CHECK(s.scale() == 1.0);
  CHECK(s.state().skipped_steps == 2);
}

TEST_CASE("loss scale: a restored state must be a positive finite scale and counts >= 0",
          "[parallel][half]") {
  LossScaler s(true);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")})
    CHECK_THROWS_AS(s.restore(LossScaleState{bad, 0, 0}), troupe::Error);
  CHECK_THROWS_AS(s.restore(LossScaleState{2.0, -1, 0}), troupe::Error);
  CHECK_THROWS_AS(s.restore(LossScaleState{2.0, 0, -1}), troupe::Error);
  s.restore(LossScaleState{2.0, 5, 1});
  CHECK(s.scale() == 2.0);
}
