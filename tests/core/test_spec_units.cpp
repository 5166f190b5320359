#include <catch2/catch.hpp>
#include <vector>

#include "core/units.hpp"

using namespace std::chrono_literals;
using troupe::format_duration;
using troupe::format_size;
using troupe::parse_duration;
using troupe::parse_size;

TEST_CASE("durations parse with units and plain seconds", "[core][spec][units]") {
  CHECK(parse_duration("500ms") == 500ms);
  CHECK(parse_duration("30s") == 30s);
  CHECK(parse_duration("1.5s") == 1500ms);
  CHECK(parse_duration("2m") == 120s);
  CHECK(parse_duration("2min") == 120s);
  CHECK(parse_duration("1h") == 3600s);
  CHECK(parse_duration("1d") == 86400s);
  CHECK(parse_duration("2500us") == 3ms);  // rounds to the nearest millisecond
  CHECK(parse_duration("1000us") == 1ms);
  CHECK(parse_duration("3") == 3s);
  CHECK(parse_duration("0.25") == 250ms);
  CHECK(parse_duration(".5s") == 500ms);
  CHECK(parse_duration(" 10 s ") == 10s);
  CHECK(parse_duration("0") == 0ms);
  CHECK(parse_duration("0s") == 0ms);
  CHECK(parse_duration("1e3ms") == 1s);
}

TEST_CASE("bad durations are rejected", "[core][spec][units]") {
  for (const char* bad : {"", "s", "5 parsecs", "-1s", "1.5.2s", "1ss", "1 h m", "abc", "250us", "0.1ms",
                          "1e400s", "10000000000000000d", "nan", "inf", "5e", "1S", "--1"}) {
    INFO(bad);
    CHECK(!parse_duration(bad).has_value());
  }
}

TEST_CASE("sizes parse with binary and decimal units", "[core][spec][units]") {
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("16GiB") == 16ull << 30);
  CHECK(parse_size("512MiB") == 512ull << 20);
  CHECK(parse_size("1.5GB") == 1500000000ull);
  CHECK(parse_size("1.5GiB") == 3ull << 29);
  CHECK(parse_size("64Ki") == 64ull << 10);
  CHECK(parse_size("2G") == 2000000000ull);
  CHECK(parse_size("10kB") == 10000u);
  CHECK(parse_size("1TiB") == 1ull << 40);
  CHECK(parse_size("7B") == 7u);
  CHECK(parse_size(" 8 MiB ") == 8ull << 20);
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("18446744073709551615") == UINT64_MAX);  // exact, not through a double
}

TEST_CASE("bad sizes are rejected", "[core][spec][units]") {
  for (const char* bad : {"", "GiB", "16 parsecs", "-1", "-16GiB", "1.5.5GB", "16gib", "18446744073709551616",
                          "16777216TiB", "1e30", "abc", "12 34", "nan"}) {
    INFO(bad);
    CHECK(!parse_size(bad).has_value());
  }
}

TEST_CASE("formatted durations and sizes are exact and read back", "[core][spec][units]") {
  CHECK(format_duration(0ms) == "0s");
  CHECK(format_duration(1500ms) == "1500ms");
  CHECK(format_duration(30s) == "30s");
  CHECK(format_duration(120s) == "2m");
  CHECK(format_duration(7200s) == "2h");
  CHECK(format_size(0) == "0");
  CHECK(format_size(16ull << 30) == "16GiB");
  CHECK(format_size(1500000000ull) == "1500000000");
  CHECK(format_size(4097) == "4097");
  for (int64_t ms : {0LL, 1LL, 999LL, 1000LL, 61000LL, 3600000LL, 86400000LL * 3, 123456789LL})
    CHECK(parse_duration(format_duration(std::chrono::milliseconds(ms))) == std::chrono::milliseconds(ms));
  for (uint64_t b : std::vector<uint64_t>{0, 1, 1023, 1024, 3ull << 29, 16ull << 30, 5ull << 40, UINT64_MAX})
    CHECK(parse_size(format_size(b)) == b);
}
