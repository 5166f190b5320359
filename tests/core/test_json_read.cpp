// The bounded JSON reader (core/json_read.hpp): depth without recursion, size before parsing,
// memory as charged, duplicate keys, and what it builds compared with nlohmann's own parser.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/json_read.hpp"
#include "core/text.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

std::string refusal(const std::string& text, json_read::Limits limits = {}) {
  try {
    json_read::parse(text, "doc.json", limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("json_read: what it reads equals nlohmann's parse of the same text", "[core][json]") {
  for (
      const char* text :
      {R"({"a": 1, "b": [true, false, null, -3, 18446744073709551615, 1.5e-3, "x\u00e9\n"], "c": {"d": {}}})",
       "[]", "{}", "\"s\"", "0", "-9223372036854775808", "[[[[1]]], {\"k\": [{}]}]"}) {
    INFO(text);
    CHECK(json_read::parse(text, "t") == json::parse(text));
  }
}

TEST_CASE("json_read: nesting past the limit is refused without recursion, a million levels too",
          "[core][json]") {
  json_read::Limits l;
  l.max_depth = 64;
  std::string ok = std::string(64, '[') + std::string(64, ']');
  CHECK(json_read::parse(ok, "t", l).is_array());
  CHECK_THAT(refusal(std::string(65, '[') + std::string(65, ']'), l),
             Catch::Equals("doc.json: JSON nested deeper than 64 levels"));
  // The attack on the coordinator: a million levels, closed or not, objects or arrays.
  l.max_bytes = 64 << 20;
  CHECK_THAT(refusal(std::string(1000000, '[') + std::string(1000000, ']'), l),
             Catch::Contains("nested deeper"));
  std::string objects;
  for (int i = 0; i < 1000000; ++i) objects += "{\"a\":";
  CHECK_THAT(refusal(objects, l), Catch::Contains("nested deeper than 64 levels"));
}

TEST_CASE("json_read: the size is refused before a byte is parsed", "[core][json]") {
  json_read::Limits l;
  l.max_bytes = 100;
  // 20 MB of '[' cost 1.7 GB before this limit existed; here it is one comparison.
  const std::string brackets(20 << 20, '[');
  CHECK_THAT(refusal(brackets, l),
             Catch::Equals("doc.json: is 20971520 bytes of JSON, more than the 100 it may have"));
  const std::string dir = troupe::testing::temp_dir("json_read");
  std::ofstream(dir + "/big.json") << brackets;
  CHECK_THROWS_WITH(json_read::read_file(dir + "/big.json", "manifest", l),
                    Catch::Contains("big.json: is 20971520 bytes; a manifest is at most 100 bytes"));
  REQUIRE(::mkfifo((dir + "/fifo.json").c_str(), 0600) == 0);
  // Opened without blocking on the missing writer, then refused.
  CHECK_THROWS_WITH(json_read::read_file(dir + "/fifo.json", "manifest"),
                    Catch::Contains("not a regular file"));
  std::filesystem::create_symlink(dir + "/big.json", dir + "/link.json");
  CHECK_THROWS_WITH(json_read::read_file(dir + "/link.json", "manifest", {}, Links::refuse),
                    Catch::Contains("link.json: is a symbolic link"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("json_read: memory is charged per node and refused past the factor", "[core][json]") {
  // Nothing but empty objects: ~100 bytes of DOM per 3 bytes of text.
  std::string objects = "[";
  for (int i = 0; i < 200000; ++i) objects += i ? ",{}" : "{}";
  objects += "]";
  json_read::Limits l;
  CHECK_THAT(refusal(objects, l), Catch::Contains("the JSON would take more than"));
  l.memory_factor = 64;
  CHECK(json_read::parse(objects, "t", l).size() == 200000);
  // What troupe's own files look like stays well inside the default.
  std::string manifest = R"({"format": "troupe-checkpoint", "files": [)";
  for (int i = 0; i < 5000; ++i)
    manifest += std::string(i ? "," : "") + R"({"name": "rank)" + std::to_string(i) +
                R"(.safetensors", "size": 123456789, "xxh64": "0123456789abcdef"})";
  manifest += "]}";
  json_read::DomBuilder dom(json_read::dom_budget(manifest.size(), {}));
  json_read::read_events(manifest, "m", {}, dom);
  INFO("charged " << dom.charged() << " bytes for " << manifest.size() << " bytes of text");
  CHECK(dom.charged() < 8 * manifest.size());
}

TEST_CASE("json_read: a key twice in one object is refused, in linear time for many keys", "[core][json]") {
  CHECK_THAT(refusal(R"({"a": 1, "b": 2, "a": 3})"),
             Catch::Contains("the key \"a\" appears twice in one object"));
  CHECK(json_read::parse(R"([{"a": 1}, {"a": 2}])", "t").size() == 2);
  // 200k distinct keys in one object: an ordered map, not a scan per key.
  std::string keys = "{";
  for (int i = 0; i < 200000; ++i) keys += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  keys += "}";
  CHECK(json_read::parse(keys, "t").size() == 200000);
}

TEST_CASE("json_read: bad text is refused by name: syntax, trailing bytes, UTF-8, infinite numbers",
          "[core][json]") {
  CHECK_THAT(refusal("{\"a\": 1,"), Catch::StartsWith("doc.json: not valid JSON (byte"));
  CHECK_THAT(refusal("{} {}"), Catch::Contains("not valid JSON"));
  CHECK_THAT(refusal("\"\xff\""), Catch::Contains("not valid JSON"));
  CHECK_THAT(refusal("[1e999]"), Catch::Contains("number overflow parsing '1e999'"));
  CHECK_THAT(refusal(""), Catch::Contains("not valid JSON"));
  // A message carries no raw bytes of the input that are not UTF-8.
  const std::string msg = refusal("[\"a\", \xc3\x28]");
  CHECK(!msg.empty());
  CHECK(valid_utf8(msg));
}

TEST_CASE("json_read: random damage to a document parses or is refused, nothing else", "[core][json]") {
  const std::string good =
      R"({"format": "troupe-checkpoint", "layout": {"data": 2, "pipeline": 1, "tensor": 1}, "files": [{"name": "a", "size": 1, "xxh64": "00"}], "x": [[1, 2], {"y": null}]})";
  std::mt19937 rng(33);
  json_read::Limits l;
  l.max_depth = 8;
  int parsed = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string t = good;
    for (int k = 0; k < 1 + int(rng() % 4); ++k) {
      const size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0:
          t[at] = static_cast<char>(rng());
          break;
        case 1:
          t.insert(at, std::string(1 + rng() % 12, "[{\"]},:1"[rng() % 8]));
          break;
        default:
          t.erase(at, 1 + rng() % 8);
      }
    }
    try {
      json_read::parse(t, "t", l);
      ++parsed;
    } catch (const Error&) {
      ++refused;  // anything other than troupe::Error fails the test
    }
  }
  // The damage reaches both outcomes (a fuzz that only ever refused would test little).
  CHECK(parsed > 0);
  CHECK(refused > 0);
}
