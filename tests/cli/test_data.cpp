// `troupe data tokenize|encode|decode` and `troupe sample --tokenizer` as a user meets
// them: the files written, their llm.c headers, text back byte for byte, exit codes.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/bpe.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;

namespace {

using Result = troupe::testing::CommandResult;

Result cli(const std::string& args) { return troupe::testing::run_troupe(args); }

std::string write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct TokenFile {
  int32_t header[256];
  std::vector<uint32_t> ids;
};

// Reads an llm.c token file of uint16 or uint32 ids, checking its size against the header.
TokenFile read_tokens(const std::string& path) {
  const std::string bytes = read(path);
  REQUIRE(bytes.size() >= 1024);
  TokenFile t;
  std::memcpy(t.header, bytes.data(), sizeof t.header);
  REQUIRE(t.header[0] == 20240520);
  REQUIRE((t.header[1] == 1 || t.header[1] == 2));
  const size_t width = t.header[1] == 1 ? 2 : 4;
  REQUIRE(bytes.size() == 1024 + size_t(t.header[2]) * width);
  for (int i = 3; i < 256; ++i) REQUIRE(t.header[i] == 0);
  for (size_t i = 0; i < size_t(t.header[2]); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 1024 + i * width;
    t.ids.push_back(width == 2
                        ? uint32_t(p[0] | p[1] << 8)
                        : uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
  }
  return t;
}

// Five documents of English-like text (one in a subfolder), plus what tokenize must skip.
std::vector<std::string> make_corpus(const std::string& dir) {
  static const char* kWords[] = {"the",  "quick", "brown", "fox", "jumps", "over", "lazy", "dog",   "naïve",
                                 "café", "42",    "1999",  ",",   ".",     "!\n",  "\n\n", "don't", "\t"};
  std::vector<std::string> docs;
  uint32_t x = 12345;
  for (int d = 0; d < 5; ++d) {
    std::string s;
    for (int i = 0; i < 400; ++i) {
      x = x * 1664525u + 1013904223u;
      if (i) s += ' ';
      s += kWords[(x >> 16) % (sizeof kWords / sizeof *kWords)];
    }
    docs.push_back(s);
  }
  // Sorted by path: a.txt, b.txt, c.txt, sub/d.txt, sub/e.txt.
  const char* names[] = {"a.txt", "b.txt", "c.txt", "sub/d.txt", "sub/e.txt"};
  for (int d = 0; d < 5; ++d) write(dir + "/" + names[d], docs[size_t(d)]);
  write(dir + "/index.dat", std::string("bin\0ary", 7));  // holds a NUL: skipped
  write(dir + "/empty.txt", "");                          // no document
  fs::create_symlink(dir + "/a.txt", dir + "/a.u8");      // an alias: skipped
  return docs;
}

}  // namespace

TEST_CASE("cli: data tokenize writes tokenizer.json and llm.c token files that decode to the corpus",
          "[cli][data]") {
  const std::string dir = troupe::testing::temp_dir("cli_data");
  const std::vector<std::string> docs = make_corpus(dir + "/corpus");
  std::string all;
  for (const auto& d : docs) all += d;

  Result r = cli("data tokenize " + dir + "/corpus --vocab 300 --val-fraction 0.3 --out " + dir + "/out");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("tokenized 5 documents, " + std::to_string(all.size()) + " bytes -> ") !=
        std::string::npos);
  CHECK(r.out.find("bytes/token") != std::string::npos);
  CHECK(r.out.find("encode ") != std::string::npos);
  const auto tok = troupe::bpe::Tokenizer::load(dir + "/out/tokenizer.json");
  CHECK(tok.vocab_size() == 300);

  const TokenFile train = read_tokens(dir + "/out/train.bin");
  const TokenFile val = read_tokens(dir + "/out/val.bin");
  CHECK(train.header[1] == 1);  // 300 ids fit uint16
  // Documents are joined with end-of-text, between documents only.
  std::vector<uint32_t> stream = train.ids;
  stream.insert(stream.end(), val.ids.begin(), val.ids.end());
  CHECK(std::count(stream.begin(), stream.end(), tok.eot()) == 4);
  CHECK(stream.front() != tok.eot());
  CHECK(stream.back() != tok.eot());
  CHECK(tok.decode(stream) == all);

  // The split falls at a document boundary near 70 %: val is whole documents.
  const std::string val_text = tok.decode(val.ids);
  CHECK(val.ids.front() != tok.eot());
  CHECK(train.ids.back() == tok.eot());
  CHECK((val_text == docs[3] + docs[4] || val_text == docs[4] || val_text == docs[2] + docs[3] + docs[4]));
  const double share = double(val.ids.size()) / double(stream.size());
  CHECK(share > 0.1);
  CHECK(share < 0.5);

  // decode writes the text back, byte for byte; --max-tokens stops early.
  Result d = cli("data decode --tokenizer " + dir + "/out/tokenizer.json " + dir + "/out/train.bin");
  REQUIRE(d.code == 0);
  CHECK(d.out == tok.decode(train.ids));
  Result few =
      cli("data decode --tokenizer " + dir + "/out/tokenizer.json " + dir + "/out/train.bin --max-tokens 7");
  REQUIRE(few.code == 0);
  CHECK(few.out == tok.decode(train.ids.data(), 7));

  // encode with the saved tokenizer gives the same stream in one file.
  Result e = cli("data encode --tokenizer " + dir + "/out/tokenizer.json " + dir + "/corpus --out " + dir +
                 "/all.bin");
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(read_tokens(dir + "/all.bin").ids == stream);

  // The same corpus gives the same bytes; a given tokenizer is used, not retrained.
  REQUIRE(
      cli("data tokenize " + dir + "/corpus --vocab 300 --val-fraction 0.3 --out " + dir + "/again").code ==
      0);
  for (const char* f : {"tokenizer.json", "train.bin", "val.bin"})
    CHECK(read(dir + "/out/" + f) == read(dir + "/again/" + f));
  write(dir + "/given/val.bin", "stale");
  Result given = cli("data tokenize " + dir + "/corpus/a.txt --tokenizer " + dir +
                     "/out/tokenizer.json --out " + dir + "/given --val-fraction 0");
  INFO(given.out);
  REQUIRE(given.code == 0);
  CHECK(given.out.find("train skipped (--tokenizer)") != std::string::npos);
  CHECK(read(dir + "/given/tokenizer.json") == read(dir + "/out/tokenizer.json"));
  CHECK_FALSE(fs::exists(dir + "/given/val.bin"));
  // One document: the split falls at the token nearest the point.
  const TokenFile one = read_tokens(dir + "/given/train.bin");
  CHECK(tok.decode(one.ids) == docs[0]);
  REQUIRE(cli("data tokenize " + dir + "/corpus/a.txt --vocab 300 --out " + dir + "/one").code == 0);
  const size_t n_train = read_tokens(dir + "/one/train.bin").ids.size();
  const size_t n_val = read_tokens(dir + "/one/val.bin").ids.size();
  CHECK(n_val == (n_train + n_val) - size_t(0.95 * double(n_train + n_val) + 0.5));
  fs::remove_all(dir);
}

TEST_CASE("cli: data refuses bad usage and bad input files with exit code 2", "[cli][data]") {
  const std::string dir = troupe::testing::temp_dir("cli_data_bad");
  write(dir + "/corpus/a.txt", "hello world, hello tokens\n");
  const std::string corpus = dir + "/corpus";
  const std::string out = " --out " + dir + "/out";
  CHECK(cli("data").code == 2);
  CHECK(cli("data tokenize " + corpus + " --vocab 256" + out).code == 2);
  CHECK(cli("data tokenize " + corpus + " --vocab 4294967297" + out).code == 2);
  CHECK(cli("data tokenize " + corpus + " --vocab -5" + out).code == 2);
  CHECK(cli("data tokenize " + corpus + out).code == 2);  // neither --vocab nor --tokenizer
  CHECK(cli("data tokenize " + corpus + " --vocab 300 --val-fraction 1" + out).code == 2);
  Result missing = cli("data tokenize " + dir + "/nope --vocab 300" + out);
  CHECK(missing.code == 2);
  CHECK(missing.out.find("corpus path " + dir + "/nope does not exist") != std::string::npos);
  write(dir + "/bin/x.dat", std::string("\0", 1));
  CHECK(cli("data tokenize " + dir + "/bin --vocab 300" + out).out.find("holds no text") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/out"));

  REQUIRE(cli("data tokenize " + corpus + " --vocab 270" + out).code == 0);
  const std::string tok = dir + "/out/tokenizer.json";
  CHECK(cli("data tokenize " + corpus + " --vocab 300 --tokenizer " + tok + out).code == 2);
  write(dir + "/bad.json", R"({"type": "troupe-bpe", "version": 9})");
  Result bad_tok = cli("data decode --tokenizer " + dir + "/bad.json " + dir + "/out/train.bin");
  CHECK(bad_tok.code == 2);
  CHECK(bad_tok.out.find("tokenizer " + dir + "/bad.json: ") != std::string::npos);
  CHECK(cli("data encode --tokenizer " + dir + "/bad.json " + corpus + " --out " + dir + "/x.bin").code == 2);

  // A token file cut short, one with ids past the vocabulary, a raw file of odd size.
  std::string bin = read(dir + "/out/train.bin");
  write(dir + "/short.bin", bin.substr(0, bin.size() - 1));
  Result cut = cli("data decode --tokenizer " + tok + " " + dir + "/short.bin");
  CHECK(cut.code == 2);
  CHECK(cut.out.find("but the file has") != std::string::npos);
  bin[1024] = '\xff';
  bin[1025] = '\x7f';
  write(dir + "/big_id.bin", bin);
  Result big = cli("data decode --tokenizer " + tok + " " + dir + "/big_id.bin");
  CHECK(big.code == 2);
  CHECK(big.out.find("token 0 is 32767, outside the tokenizer's vocabulary of 270") != std::string::npos);
  write(dir + "/raw.bin", std::string("abc", 3));
  CHECK(cli("data decode --tokenizer " + tok + " " + dir + "/raw.bin").code == 2);
  write(dir + "/raw2.bin", std::string("a\0b\0", 4));
  Result raw = cli("data decode --tokenizer " + tok + " " + dir + "/raw2.bin");
  CHECK(raw.code == 0);
  CHECK(raw.out == "ab");
  CHECK(cli("data decode --tokenizer " + tok + " " + dir + "/out/train.bin --dtype uint32").code == 2);
  CHECK(cli("data decode --tokenizer " + tok + " " + dir + "/nope.bin").code == 2);
  fs::remove_all(dir);
}

TEST_CASE("cli: sample --tokenizer encodes the prompt and decodes what the model generates", "[cli][data]") {
  const std::string dir = troupe::testing::temp_dir("cli_data_sample");
  std::string text(50, ' ');
  for (int i = 0; i < 20; ++i) text += "the cat sat on the mat, the cat sat on the hat\n";
  write(dir + "/corpus.txt", text);
  REQUIRE(
      cli("data tokenize " + dir + "/corpus.txt --vocab 290 --val-fraction 0 --out " + dir + "/tok").code ==
      0);
  // A model with more ids than the tokenizer (a padded vocabulary), trained on its tokens.
  write(dir + "/tiny.yaml",
        "name: tiny\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2, vocab_size: 300}\n"
        "data: {source: tokens, path: " +
            dir +
            "/tok/train.bin, val_fraction: 0}\ntrain: {steps: 2, global_batch: 4, seed: 1}\n"
            "checkpoint: {every: 2}\n");
  Result r = cli("run " + dir + "/tiny.yaml --runs-dir " + dir + "/runs -q");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::string run;
  for (const auto& e : fs::directory_iterator(dir + "/runs")) run = e.path().string();
  const std::string args = "sample --ckpt " + run + "/ckpt --tokenizer " + dir +
                           "/tok/tokenizer.json --prompt 'the cat' --tokens 20 --seed 3";
  Result s = cli(args);
  INFO(s.out);
  REQUIRE(s.code == 0);
  CHECK(s.out.rfind("the cat", 0) == 0);
  CHECK(cli(args).out == s.out);
  // A tokenizer with more ids than the model has is refused.
  std::vector<std::string> docs = make_corpus(dir + "/big_corpus");
  const auto big_tok = troupe::bpe::Tokenizer::train({docs[0], docs[1]}, 310);
  REQUIRE(big_tok.vocab_size() == 310);
  big_tok.save(dir + "/big.json");
  Result big = cli("sample --ckpt " + run + "/ckpt --tokenizer " + dir + "/big.json --tokens 3");
  CHECK(big.code == 2);
  CHECK(big.out.find("has 310 tokens, more than the model's vocab_size of 300") != std::string::npos);
  // --special reads special tokens in the prompt: troupe's BPE has none to read.
  Result special = cli(args + " --special");
  CHECK(special.code == 2);
  CHECK(special.out.find("--special needs a Hugging Face tokenizer") != std::string::npos);
  fs::remove_all(dir);
}
