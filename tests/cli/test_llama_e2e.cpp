// The path a user takes with their own text: tokenize a corpus with troupe's BPE, train a
// llama on the token files with the vocabulary split over two tensor-parallel workers,
// sample from the checkpoint with the job's tokenizer, export it in Hugging Face's layout.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;

namespace {

using Result = troupe::testing::CommandResult;

Result cli(const std::string& args) { return troupe::testing::run_troupe(args); }

}  // namespace

TEST_CASE(
    "cli: tokenize a corpus, train a llama on it with tp 2, sample with its tokenizer, export for Hugging "
    "Face",
    "[cli][llama]") {
  const std::string dir = troupe::testing::temp_dir("test_llama_e2e");
  const std::string corpus = "/usr/share/games/fortunes/computers";
  REQUIRE(fs::exists(corpus));  // Debian's fortunes package (scripts/setup.sh installs it)
  Result tok = cli("data tokenize " + corpus + " --vocab 512 --out " + dir + "/data");
  INFO(tok.out);
  REQUIRE(tok.code == 0);

  const std::string spec = dir + "/llama.yaml";
  std::ofstream(spec)
      << "name: llama-e2e\n"
         "model: {type: llama, vocab_size: 512, seq_len: 32, d_model: 32, n_layers: 2, n_heads: 4,\n"
         "        n_kv_heads: 2, ffn_hidden: 64}\n"
         "data: {source: tokens, path: "
      << dir << "/data/train.bin, val_path: " << dir << "/data/val.bin, eot: 256, tokenizer: " << dir
      << "/data/tokenizer.json}\n"
         "train: {steps: 12, global_batch: 4, seed: 3, lr_schedule: constant, optimizer: {lr: 0.01},\n"
         "        eval_every: 6, eval_batches: 2}\n"
         "parallel: {tensor: 2}\n";
  Result v = cli("validate " + spec);
  INFO(v.out);
  REQUIRE(v.code == 0);
  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir + "/runs")) runs.push_back(e.path().string());
  REQUIRE(runs.size() == 1);
  std::ifstream m(runs[0] + "/metrics.jsonl");
  std::vector<double> loss, val;
  for (std::string line; std::getline(m, line);) {
    const auto j = nlohmann::json::parse(line);
    loss.push_back(j.at("loss").get<double>());
    if (j.contains("val_loss") && !j.at("val_loss").is_null()) val.push_back(j.at("val_loss").get<double>());
  }
  REQUIRE(loss.size() == 12);
  CHECK(std::abs(loss[0] - std::log(512.0)) < 0.5);  // a fresh model: about uniform over 512 ids
  CHECK(loss.back() < loss[0] - 0.5);
  CHECK(val.size() == 2);

  // The checkpoint's spec names the tokenizer: the prompt is encoded and the ids decoded.
  Result s = cli("sample --ckpt " + runs[0] + "/ckpt --prompt \"The computer\" --tokens 16 --seed 1");
  INFO(s.out);
  REQUIRE(s.code == 0);
  const size_t at = s.out.find("The computer");
  REQUIRE(at != std::string::npos);
  // Something was generated after the prompt (sample ends its output with a newline).
  const std::string generated = s.out.substr(at + std::string("The computer").size());
  CHECK(generated.size() > 1);

  Result x = cli("ckpt export " + runs[0] + "/ckpt --format hf --out " + dir + "/hf");
  INFO(x.out);
  REQUIRE(x.code == 0);
  std::ifstream cfg(dir + "/hf/config.json");
  const auto c = nlohmann::json::parse(cfg);
  CHECK(c.at("architectures")[0] == "LlamaForCausalLM");
  CHECK(c.at("num_key_value_heads") == 2);
  CHECK(c.at("vocab_size") == 512);
  CHECK(fs::file_size(dir + "/hf/model.safetensors") > 0);
  fs::remove_all(dir);
}
