// `troupe data` with a Hugging Face tokenizer.json (a small one made here; the released models'
// are compared with the tokenizers library in tests/tokenizer/): documents framed with the
// tokenizer config's bos and eos, special tokens read from text only with --special, the
// tokenizer copied beside the token files, refusals with exit code 2.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

troupe::testing::CommandResult cli(const std::string& args) { return troupe::testing::run_troupe(args); }

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A byte-level BPE: ids 0..255 the bytes (GPT-2's alphabet), 256 "hi" (merge "h i"), 257
// "<|bos|>" and 258 "<|eos|>" (special).
json tokenizer() {
  json vocab = json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t c = printable ? uint32_t(b) : 0x100 + uint32_t(extra++);
    vocab[c < 0x80 ? std::string(1, char(c)) : std::string{char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))}] =
        b;
  }
  vocab["hi"] = 256;
  json added = json::array();
  for (auto [id, text] : {std::pair<int, const char*>{257, "<|bos|>"}, {258, "<|eos|>"}})
    added.push_back({{"id", id},
                     {"content", text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h i"}}}}};
}

std::vector<uint32_t> token_ids(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 1024);
  std::vector<uint32_t> ids((bytes.size() - 1024) / 2);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = uint8_t(bytes[1024 + 2 * i]) | uint32_t(uint8_t(bytes[1024 + 2 * i + 1])) << 8;
  return ids;
}

}  // namespace

TEST_CASE("cli: data tokenize with a Hugging Face tokenizer frames documents with its bos and eos",
          "[cli][data]") {
  const std::string dir = troupe::testing::temp_dir("data_hf");
  write(dir + "/tok/tokenizer.json", tokenizer().dump());
  write(dir + "/tok/tokenizer_config.json", R"({"bos_token": "<|bos|>", "eos_token": "<|eos|>"})");
  write(dir + "/corpus/a.txt", "hi<|eos|>");
  write(dir + "/corpus/b.txt", "hi \xff");  // not UTF-8: read as "hi \uFFFD"
  auto r = cli("data tokenize " + dir + "/corpus --tokenizer " + dir + "/tok/tokenizer.json --out " + dir +
               "/out --val-fraction 0");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("1 document(s) hold bytes that are not UTF-8") != std::string::npos);
  const uint32_t lt = '<', bar = '|', e = 'e', o = 'o', s = 's', gt = '>', sp = ' ';
  // Plain text: "<|eos|>" is text; each document is <|bos|> ... <|eos|>.
  CHECK(token_ids(dir + "/out/train.bin") ==
        std::vector<uint32_t>{257, 256, lt, bar, e, o, s, bar, gt, 258, 257, 256, sp, 0xEF, 0xBF, 0xBD, 258});
  CHECK(fs::exists(dir + "/out/tokenizer.json"));
  CHECK(fs::exists(dir + "/out/tokenizer_config.json"));
  // --special: the written special token is its id.
  r = cli("data encode --tokenizer " + dir + "/out/tokenizer.json " + dir + "/corpus/a.txt --out " + dir +
          "/a.bin --special");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(token_ids(dir + "/a.bin") == std::vector<uint32_t>{257, 256, 258, 258});
  r = cli("data decode --tokenizer " + dir + "/out/tokenizer.json " + dir + "/a.bin");
  CHECK(r.code == 0);
  CHECK(r.out.find("<|bos|>hi<|eos|><|eos|>") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: data refuses what a Hugging Face tokenizer cannot do, by name, with exit code 2",
          "[cli][data]") {
  const std::string dir = troupe::testing::temp_dir("data_hf_bad");
  write(dir + "/corpus/a.txt", "some text");
  json bad = tokenizer();
  bad["normalizer"] = {{"type", "NFKC"}};
  write(dir + "/nfkc/tokenizer.json", bad.dump());
  auto r =
      cli("data tokenize " + dir + "/corpus --tokenizer " + dir + "/nfkc/tokenizer.json --out " + dir + "/o");
  CHECK(r.code == 2);
  CHECK(r.out.find("normalizer: type \"NFKC\" is not supported") != std::string::npos);
  r = cli("data tokenize " + dir + "/corpus --vocab 300 --special --out " + dir + "/o");
  CHECK(r.code == 2);
  CHECK(r.out.find("--special: troupe's own BPE has no special tokens") != std::string::npos);
  fs::remove_all(dir);
}
