// `troupe validate` and `troupe run` on data.source tokens: a tiny GPT with a vocabulary of 512
// trains on a generated token file; bad token files are refused at data.path before anything runs.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;

namespace {

using Result = troupe::testing::CommandResult;

Result cli(const std::string& args) { return troupe::testing::run_troupe(args); }

// n uint16 ids after an llm.c header; each id follows from the one before (x -> 5x + 3 mod 512,
// with a break every 97 tokens), so a model learns the sequence quickly.
void write_tokens(const std::string& path, int32_t n, uint16_t first_bad = 0) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  int32_t header[256] = {20240520, 1, n};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  uint32_t x = 1;
  for (int32_t i = 0; i < n; ++i) {
    x = i % 97 == 0 ? static_cast<uint32_t>(i) % 512 : (5 * x + 3) % 512;
    const uint16_t v = i == 1000 && first_bad ? first_bad : static_cast<uint16_t>(x);
    out.write(reinterpret_cast<const char*>(&v), 2);
  }
}

std::string spec_text(const std::string& path) {
  return "name: tokens\n"
         "model: {type: gpt, vocab_size: 512, seq_len: 16, d_model: 32, n_layers: 1, n_heads: 2}\n"
         "data: {source: tokens, path: " +
         path +
         ", eot: 256}\n"
         "train: {steps: 6, global_batch: 4, seed: 1, lr_schedule: constant, optimizer: {lr: 0.01}}\n";
}

std::string write_spec(const std::string& dir, const std::string& data_path) {
  const std::string p = dir + "/tokens.yaml";
  std::ofstream(p) << spec_text(data_path);
  return p;
}

}  // namespace

TEST_CASE("cli: a GPT of vocab 512 trains on a token file through troupe run", "[cli]") {
  const std::string dir = troupe::testing::temp_dir("test_cli_tokens_run");
  write_tokens(dir + "/train.bin", 20000);
  const std::string spec = write_spec(dir, dir + "/train.bin");
  Result v = cli("validate " + spec);
  INFO(v.out);
  REQUIRE(v.code == 0);
  CHECK(v.out.find("source: tokens") != std::string::npos);
  CHECK(v.out.find("eot: 256") != std::string::npos);

  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir + "/runs")) runs.push_back(e.path().string());
  REQUIRE(runs.size() == 1);
  std::ifstream m(runs[0] + "/metrics.jsonl");
  std::vector<double> loss;
  for (std::string line; std::getline(m, line);)
    loss.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  REQUIRE(loss.size() == 6);
  for (double l : loss) CHECK(std::isfinite(l));
  CHECK(std::abs(loss[0] - std::log(512.0)) < 0.5);  // a fresh model: about uniform over 512 ids
  CHECK(loss.back() < loss[0]);
  // Its ids are not bytes, and the spec names no tokenizer: sample refuses, naming the fix.
  Result s = cli("sample --ckpt " + runs[0] + "/ckpt --prompt abc --tokens 3");
  INFO(s.out);
  CHECK(s.code == 2);
  CHECK(s.out.find("vocab_size is 512, not the 256 bytes: give --tokenizer FILE") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: validate and run refuse bad token files at data.path and start nothing", "[cli]") {
  const std::string dir = troupe::testing::temp_dir("test_cli_tokens_bad");
  // A missing file: refused by both, at data.path (line 3, col 30).
  const std::string missing = write_spec(dir, dir + "/none.bin");
  for (const std::string& cmd : {"validate " + missing, "run " + missing + " --runs-dir " + dir + "/runs"}) {
    Result r = cli(cmd);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(missing + ":3:30: error: " + dir + "/none.bin: no such file or directory") !=
          std::string::npos);
    CHECK(r.out.find("hint: ") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir + "/runs"));
  // An id outside the vocabulary: validate scans small files and names the byte offset.
  write_tokens(dir + "/bad.bin", 5000, 600);
  Result b = cli("validate " + write_spec(dir, dir + "/bad.bin"));
  INFO(b.out);
  CHECK(b.code == 2);
  CHECK(b.out.find(dir + "/bad.bin: token 600 at byte offset 3024 is >= model.vocab_size 512") !=
        std::string::npos);
  fs::remove_all(dir);
}
