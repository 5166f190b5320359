// Hugging Face tokenizer.json support on small tokenizers made here (the released models' files
// are compared with the tokenizers library in tests/tokenizer/): BPE merge order, added and
// special tokens, ignore_merges, decoding, text that is not UTF-8, and every refusal by name and
// JSON path.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.hpp"
#include "core/hf_regex.hpp"
#include "core/hf_tokenizer.hpp"
#include "core/text.hpp"
#include "core/tokenizer.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using json = nlohmann::json;

namespace {

// The ByteLevel alphabet's character for byte b, as UTF-8.
std::string byte_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int extra = 0;
  for (int x = 0; x < b; ++x)
    if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++extra;
  const uint32_t c = printable ? uint32_t(b) : 0x100 + uint32_t(extra);
  if (c < 0x80) return std::string(1, char(c));
  return {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
}

// Ids 0..255 the bytes; then the merges' tokens; then three added tokens.
//   256 "he" (h e), 257 "ll" (l l), 258 "hell" (he ll), 259 "hello" (hell o), 260 "Ġw" (Ġ w),
//   261 "el" (e l, ranked after "l l"), 262 "<|end|>" special, 263 "<|user|>" special,
//   264 "[NS]" not special
json tiny() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string sp = byte_char(' ');
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab[sp + "w"] = 260;
  vocab["el"] = 261;
  json added = json::array();
  auto add = [&](int id, const char* content, bool special) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  };
  json t = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", " ?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", {"h e", "l l", "he ll", "hell o", sp + " w", "e l"}}}}};
  // The library gives an added token that is not in the vocabulary (262 entries) the next id.
  add(262, "<|end|>", true);
  add(263, "<|user|>", true);
  add(264, "[NS]", false);
  t["added_tokens"] = added;
  return t;
}

hf::Tokenizer parse(const json& t, const std::string& config = "") {
  return hf::Tokenizer::parse(t.dump(), config, "tokenizer t/tokenizer.json");
}

uint32_t b(char c) { return static_cast<unsigned char>(c); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("hf tokenizer: BPE merges by rank, leftmost first, within the pre-tokenizer's pieces",
          "[core][hf]") {
  const hf::Tokenizer t = parse(tiny());
  CHECK(t.vocab_size() == 265);
  // "hello" -> h e l l o: "h e" (rank 0) and "l l" (rank 1) before "e l" (rank 5), then "he ll",
  // then "hell o". " world" is its own piece: "Ġ w" then the rest as bytes.
  CHECK(t.encode("hello world") == std::vector<uint32_t>{259, 260, b('o'), b('r'), b('l'), b('d')});
  // "ell": "l l" outranks "e l"; the pieces never merge across "!".
  CHECK(t.encode("ell") == std::vector<uint32_t>{b('e'), 257});
  CHECK(t.encode("hel!lo") == std::vector<uint32_t>{256, b('l'), b('!'), b('l'), b('o')});
  CHECK(t.encode("") == std::vector<uint32_t>{});
  CHECK(t.pre_tokenize("hi  there 42") ==
        std::vector<std::string>{"hi", byte_char(' ') + byte_char(' '), "there", byte_char(' '), "4", "2"});
}

TEST_CASE("hf tokenizer: ignore_merges takes a piece that is a token whole", "[core][hf]") {
  json j = tiny();
  j["model"]["vocab"]["xyz"] = 265;  // a token no merge makes
  j["added_tokens"] = json::array();
  CHECK(parse(j).encode("xyz") == std::vector<uint32_t>{b('x'), b('y'), b('z')});
  j["model"]["ignore_merges"] = true;
  CHECK(parse(j).encode("xyz") == std::vector<uint32_t>{265});
  CHECK(parse(j).encode("hello") == std::vector<uint32_t>{259});
}

TEST_CASE("hf tokenizer: special tokens only when asked, other added tokens always, never split",
          "[core][hf]") {
  const hf::Tokenizer t = parse(tiny());
  const std::string text = "hi<|end|>[NS]<|user|>";
  const std::vector<uint32_t> plain = t.encode(text);
  for (uint32_t id : plain) CHECK((id != 262 && id != 263));
  CHECK(std::count(plain.begin(), plain.end(), 264u) == 1);  // "[NS]" is not special: always its id
  CHECK(t.decode(plain.data(), plain.size()) == text);
  const std::vector<uint32_t> special = t.encode(text, true);
  CHECK(special == std::vector<uint32_t>{b('h'), b('i'), 262, 264, 263});
  CHECK(t.decode(special.data(), special.size()) == text);
  CHECK(t.decode(special.data(), special.size(), /*skip_special=*/true) == "hi[NS]");
  CHECK(t.is_special(262));
  CHECK_FALSE(t.is_special(264));
  // Leftmost-longest: of two added tokens at the same place the longer wins.
  json j = tiny();
  j["added_tokens"].push_back({{"id", 265},
                               {"content", "<|end|>!"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", true}});
  CHECK(parse(j).encode("a<|end|>!b<|end|>", true) == std::vector<uint32_t>{b('a'), 265, b('b'), 262});
}

TEST_CASE("hf tokenizer: decode gives back any UTF-8 text, ids without a token are refused", "[core][hf]") {
  const hf::Tokenizer t = parse(tiny());
  std::mt19937 rng(5);
  const std::vector<std::string> parts = {"hello", " world", "  ", "\t", "\n", "é",
                                          "日本",  "🙂",   "'s", "42", "!?"};
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0; k < 8; ++k) s += parts[rng() % parts.size()];
    const std::vector<uint32_t> ids = t.encode(s);
    CHECK(t.decode(ids.data(), ids.size()) == s);
  }
  const uint32_t bad[] = {b('a'), 900};
  CHECK_THAT(error_of([&] { t.decode(bad, 2); }), Catch::Contains("token id 900 at position 1 has no token"));
  CHECK_FALSE(t.has_token(900));
  CHECK(t.token_bytes(259) == "hello");
  CHECK(t.token_bytes(260) == " w");
  CHECK(t.token_id("<|user|>") == 263u);
}

TEST_CASE("hf tokenizer: text that is not UTF-8 reads as Python's errors='replace' reads it", "[core][hf]") {
  // The Unicode Standard's example (section 3.9, table 3-8): each maximal subpart is one U+FFFD.
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(replace_invalid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a" + fffd + fffd + fffd + "b" + fffd + "c" + fffd + fffd + "d");
  CHECK(replace_invalid_utf8("a\xE2\x82"
                             "b") == "a" + fffd + "b");               // truncated: one subpart
  CHECK(replace_invalid_utf8("\xF0\x80x") == fffd + fffd + "x");      // 0x80 cannot follow 0xF0
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == fffd + fffd + fffd);  // a surrogate
  CHECK(replace_invalid_utf8("\xC0\xAF") == fffd + fffd);             // overlong
  CHECK(replace_invalid_utf8("ok é 日本") == "ok é 日本");
  const hf::Tokenizer t = parse(tiny());
  CHECK(t.encode("caf\xE9 x") == t.encode("caf" + fffd + " x"));
}

TEST_CASE("hf tokenizer: an Encoder across texts gives what encode gives text by text", "[core][hf]") {
  const hf::Tokenizer t = parse(tiny());
  hf::Encoder e(t);
  for (const std::string s :
       {"hello world", "hello hello", "<|end|>hello", "日本 hello", "ell ell", "world"}) {
    std::vector<uint32_t> got;
    e.encode(s, true, got);
    CHECK(got == t.encode(s, true));
  }
}

TEST_CASE("hf tokenizer: tokenizer_config.json gives bos, eos and add_bos_token", "[core][hf]") {
  const hf::Tokenizer t = parse(tiny(), R"({"bos_token": "<|user|>", "eos_token": {"content": "<|end|>"}})");
  CHECK(t.bos() == 263u);
  CHECK(t.eos() == 262u);
  CHECK(t.add_bos());
  CHECK_FALSE(parse(tiny(), R"({"bos_token": "<|user|>", "add_bos_token": false})").add_bos());
  CHECK_FALSE(parse(tiny()).eos());
  CHECK_THAT(
      error_of([&] { parse(tiny(), R"({"eos_token": "<|nope|>"})"); }),
      Catch::Contains("t/tokenizer_config.json: eos_token: \"<|nope|>\" is not a token of the tokenizer"));
}

TEST_CASE("hf tokenizer: what is not read faithfully is refused by name and JSON path", "[core][hf]") {
  struct Case {
    std::function<void(json&)> change;
    const char* says;
  };
  const std::string sp = byte_char(' ');
  const std::vector<Case> cases = {
      {[](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer: type \"NFC\" is not supported (troupe reads tokenizers without a normalizer)"},
      {[](json& j) { j["model"]["type"] = "Unigram"; }, "model.type: \"Unigram\" is not supported"},
      {[](json& j) { j["model"]["dropout"] = 0.1; },
       "model.dropout: is 0.1: BPE dropout makes encoding random"},
      {[](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix: is \"##\""},
      {[](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback: is true"},
      {[](json& j) { j["model"]["foo"] = 1; }, "model.foo: is not a key this troupe reads"},
      {[](json& j) { j["foo"] = 1; }, "foo: is not a key this troupe reads"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type: \"Whitespace\" is not supported (troupe reads Split, ByteLevel and Sequence"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?<=a)b"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: regex \"(?<=a)b\": a lookbehind at offset 0 is not "
       "supported"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
       "pre_tokenizer.pretokenizers[0].behavior: \"Sideways\" is not a split behaviour"},
      {[](json& j) { j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0]; },
       "pre_tokenizer: has no ByteLevel step: not a byte-level BPE"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"].push_back(j["pre_tokenizer"]["pretokenizers"][0]); },
       "pre_tokenizer.pretokenizers[2]: a Split after ByteLevel is not supported"},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer: is null"},
      {[](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type: \"WordPiece\" is not supported"},
      {[](json& j) { j["decoder"] = nullptr; }, "decoder: is null"},
      {[](json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "added_tokens[0].lstrip: is true: an added token that strips spaces on its left is not supported"},
      {[](json& j) { j["added_tokens"][1]["single_word"] = true; }, "added_tokens[1].single_word: is true"},
      {[](json& j) { j["added_tokens"][0]["id"] = 999; },
       "added_tokens[0].id: is 999, but the tokenizers library gives \"<|end|>\" id 262"},
      {[](json& j) { j["added_tokens"][1]["content"] = "<|end|>"; },
       "added_tokens[1]: repeats the added token"},
      {[](json& j) { j["model"]["merges"][0] = "z9 e"; },
       "model.merges[0]: uses \"z9\", which is not in model.vocab"},
      {[](json& j) { j["model"]["merges"][0] = "e h"; },
       "model.merges[0]: makes \"eh\", which is not in model.vocab"},
      {[](json& j) { j["model"]["merges"][1] = "l l l"; }, "model.merges[1]: is \"l l l\", not two tokens"},
      {[](json& j) { j["model"]["merges"][1] = json::array({"l"}); }, "model.merges[1]: is [\"l\"], neither"},
      {[&](json& j) { j["model"]["vocab"].erase(sp); },
       "model.vocab: has no token for the byte-level character"},
      {[](json& j) { j["model"]["vocab"]["dup"] = 5; }, "is also given to"},
      {[](json& j) { j["model"]["vocab"]["big"] = 1 << 24; }, "not a token id in [0, 2^24)"},
      {[](json& j) { j["model"]["vocab"]["far"] = 1 << 23; },
       "model.vocab[\"far\"]: id 8388608 is far beyond the 263"},
      {[](json& j) {
         json seq = j["pre_tokenizer"]["pretokenizers"][0];
         for (int i = 0; i < 70; ++i)
           j["pre_tokenizer"]["pretokenizers"].insert(j["pre_tokenizer"]["pretokenizers"].begin(), seq);
       },
       "pre_tokenizer: has 72 steps, more than the 64"},
  };
  for (const Case& c : cases) {
    json j = tiny();
    c.change(j);
    INFO(c.says);
    CHECK_THAT(error_of([&] { parse(j); }),
               Catch::StartsWith("tokenizer t/tokenizer.json: ") && Catch::Contains(c.says));
  }
  CHECK_THAT(error_of([] { hf::Tokenizer::parse("{\"model\": ", "", "tokenizer x"); }),
             Catch::Contains("not JSON"));
  CHECK_THAT(error_of([] {
               hf::Tokenizer::parse(std::string(100, '[') + std::string(100, ']'), "", "tokenizer x");
             }),
             Catch::Contains("nests deeper than a tokenizer does"));
}

TEST_CASE("hf regex: unsupported constructs are refused by name and offset", "[core][hf]") {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"(?<=a)b", "a lookbehind at offset 0"},
      {"x(?<!a)b", "a lookbehind at offset 1"},
      {"(?>a)", "an atomic group"},
      {"(?<n>a)", "a named group"},
      {"a++", "a possessive quantifier at offset 2"},
      {"^a", "the anchor '^'"},
      {"a$", "the anchor '$'"},
      {"\\bx", "the escape '\\b'"},
      {"(a*)*", "a repetition of something that can match the empty string"},
      {"a?", "can match the empty string"},
      {"[[a]]", "a nested class"},
      {"\\pL", "a \\p or \\P without braces"},
      {"\\p{Greek}", "the property \\p{Greek}"},
      {"(?i:é)", "a non-ASCII character under (?i)"},
      {"(?i:\\p{Lu})", "a \\p property under (?i)"},
      {"a{2,1}", "a count {n,m} with m < n"},
      {"a{1001}", "a count above 1000"},
      {"(a", "a '(' without its ')'"},
      {"a)", "an unmatched ')'"},
      {"a(?i)b", "an isolated (?i) or (?-i) after the start of its group"},
      {"(?x)a", "the group construct '(?x'"},
      {"*a", "a quantifier with nothing to repeat"},
      {"a**", "a quantifier after a quantifier"},
      {"[a", "a '[' without its ']'"},
  };
  for (const auto& [pattern, says] : cases) {
    INFO(pattern);
    CHECK_THAT(error_of([&] { hf::Regex r(pattern); }),
               Catch::Contains(says) && Catch::Contains("is not supported"));
  }
  // A pattern that backtracks exponentially is stopped, not run for hours.
  const hf::Regex slow("(?:a|a)+b");
  CHECK_THAT(error_of([&] { slow.find_all(std::string(60, 'a')); }), Catch::Contains("backtracking steps"));
  CHECK_THAT(error_of([&] { hf::Regex("a").find_all("\xff"); }), Catch::Contains("not UTF-8"));
  // What it does support, as Oniguruma matches it (tests/tokenizer compares with the library).
  const auto m = hf::Regex("\\s+(?!\\S)|\\s+|\\p{L}+").find_all("ab  \tc ");
  CHECK(m == std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}, {4, 5}, {5, 6}, {6, 7}});
}

TEST_CASE("tokenizer files: troupe's and Hugging Face's are told apart and frame documents as each expects",
          "[core][hf]") {
  const std::string dir = testing::temp_dir("hf_tokenizer_files");
  std::filesystem::create_directories(dir + "/hf");
  std::ofstream(dir + "/hf/tokenizer.json") << tiny().dump();
  std::ofstream(dir + "/hf/tokenizer_config.json") << R"({"bos_token": "<|user|>", "eos_token": "<|end|>"})";
  const auto hft = load_tokenizer(dir + "/hf/tokenizer.json");
  CHECK(std::string(hft->format()) == "huggingface");
  CHECK(hft->document_start() == 263u);
  CHECK(hft->end_of_text() == 262u);
  const std::vector<uint32_t> ids = encode_documents(*hft, {"hello", "hello world"}, false);
  CHECK(ids == std::vector<uint32_t>{263, 259, 262, 263, 259, 260, b('o'), b('r'), b('l'), b('d'), 262});
  hft->save_into(dir);
  CHECK(std::string(load_tokenizer(dir + "/tokenizer.json")->format()) == "huggingface");
  CHECK(std::filesystem::exists(dir + "/tokenizer_config.json"));

  std::ofstream(dir + "/troupe.json")
      << R"({"type": "troupe-bpe", "version": 1, "vocab_size": 257, "eot": 256,
    "pretokenizer": "troupe-v1", "merges": []})";
  const auto own = load_tokenizer(dir + "/troupe.json");
  CHECK(std::string(own->format()) == "troupe-bpe");
  CHECK(encode_documents(*own, {"ab", "c"}, false) == std::vector<uint32_t>{b('a'), b('b'), 256, b('c')});
  CHECK_FALSE(hf::looks_like_hf_tokenizer(R"({"type": "troupe-bpe", "merges": [{"model": 1}]})"));
  CHECK(hf::looks_like_hf_tokenizer(R"({"version": "1.0", "model" : {}})"));
  std::filesystem::remove_all(dir);
}
