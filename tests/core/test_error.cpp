#include <catch2/catch.hpp>

#include "core/error.hpp"

TEST_CASE("TROUPE_CHECK throws with file, line and message", "[core]") {
  REQUIRE_NOTHROW([] { TROUPE_CHECK(1 + 1 == 2); }());
  try {
    int n = 3;
    TROUPE_CHECK(n == 4, "n was ", n);
    FAIL("no throw");
  } catch (const troupe::Error& e) {
    std::string s = e.what();
    CHECK(s.find("test_error.cpp:") != std::string::npos);
    CHECK(s.find("n == 4") != std::string::npos);
    CHECK(s.find("n was 3") != std::string::npos);
  }
}
