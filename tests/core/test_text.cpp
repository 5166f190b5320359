// UTF-8 checks and repair, JSON that never throws on odd bytes, constant-time equality.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/text.hpp"

using troupe::constant_time_equal;
using troupe::invalid_utf8_at;
using troupe::json_text;
using troupe::sanitize_utf8;
using troupe::valid_utf8;

TEST_CASE("utf8: well-formed text passes, every ill-formed kind is found at its byte", "[core][text]") {
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("plain ascii"));
  CHECK(valid_utf8("\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é, €, an emoji
  CHECK(valid_utf8("\xf4\x8f\xbf\xbf"));                                 // U+10FFFF
  struct Bad {
    std::string bytes;
    size_t at;
  };
  for (const Bad& b :
       {Bad{"\xff", 0}, Bad{"ok\x80", 2}, Bad{"\xc0\xaf", 0}, Bad{"\xc1\xbf", 0}, Bad{"\xe0\x80\xaf", 0},
        Bad{"\xed\xa0\x80", 0}, Bad{"\xf0\x80\x80\xaf", 0}, Bad{"\xf4\x90\x80\x80", 0},
        Bad{"\xf5\x80\x80\x80", 0}, Bad{"ab\xe2\x82", 2}, Bad{"\xc3", 0}, Bad{"x\xf0\x9f\x98", 1}}) {
    INFO("bytes " << nlohmann::json(sanitize_utf8(b.bytes)).dump());
    CHECK(invalid_utf8_at(b.bytes) == b.at);
  }
}

TEST_CASE("utf8: repair replaces each bad byte, keeps the good ones, cuts between characters",
          "[core][text]") {
  CHECK(sanitize_utf8("evil\xff") == "evil\xef\xbf\xbd");
  CHECK(sanitize_utf8("a\xc3\xa9"
                      "b") ==
        "a\xc3\xa9"
        "b");
  CHECK(valid_utf8(sanitize_utf8("\xed\xa0\x80\xc0\xaf\xf4\x90")));
  CHECK(sanitize_utf8("\xc3\xa9\xc3\xa9", 3) == "\xc3\xa9");  // never half a character
  CHECK(sanitize_utf8(std::string(100, 'x'), 10).size() == 10);
}

TEST_CASE("json_text: a string that is not UTF-8 is repaired instead of throwing", "[core][text]") {
  nlohmann::json j = {{"host", "evil\xff"}, {"n", 1}};
  CHECK_THROWS(j.dump());
  std::string out;
  CHECK_NOTHROW(out = json_text(j));
  CHECK(valid_utf8(out));
  CHECK(nlohmann::json::parse(out)["host"] == "evil\xef\xbf\xbd");
}

TEST_CASE("constant_time_equal: equal only for the same bytes and length", "[core][text]") {
  CHECK(constant_time_equal("", ""));
  CHECK(constant_time_equal("s3cret", "s3cret"));
  CHECK_FALSE(constant_time_equal("s3cret", "s3creT"));
  CHECK_FALSE(constant_time_equal("s3cret", "s3cre"));
  CHECK_FALSE(constant_time_equal("s3cre", "s3cret"));
  CHECK_FALSE(constant_time_equal("", "x"));
  CHECK(constant_time_equal(std::string("a\0b", 3), std::string("a\0b", 3)));
  CHECK_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}
