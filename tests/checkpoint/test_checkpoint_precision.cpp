// Checkpoints of mixed-precision runs (ranks as threads over the `local` backend): a
// bf16 run resumes bit for bit; an fp16 overflow on one rank skips the step on all
// of them, halves the loss scale, leaves the state untouched, and the scaler state
// resumes bit for bit; a checkpoint of any precision and layout loads into any other;
// export rounds the f32 masters to bf16 on request.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/dtype_convert.hpp"
#include "core/safetensors.hpp"
#include "core/spec.hpp"
#include "tests/support/local_ranks.hpp"
#include "tests/support/support.hpp"
#include "worker/engine.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

constexpr int kSteps = 8;

JobSpec spec_in(const std::string& precision) {
  return parse_spec(
      "name: p\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4}\n"
      "data: {source: synthetic}\n"
      "train: {steps: " +
          std::to_string(kSteps) +
          ", global_batch: 8, micro_batch: 2, seed: 5, warmup_steps: 2, precision: " + precision +
          ", optimizer: {lr: 0.003}}\ncheckpoint: {keep: 5}\n",
      "p.yaml");
}

std::string temp_dir(const std::string& name) { return testing::temp_dir("test_ckpt_precision_" + name); }

// Every rank's reports; fails the test when a rank threw.
std::vector<std::vector<StepReport>> run(const JobSpec& spec, Layout l, const std::string& resume,
                                         int64_t stop, const std::string& root = "") {
  testing::LayoutRun out = testing::run_layout(spec, l, resume, stop, root);
  for (int r = 0; r < l.world(); ++r) {
    INFO("layout " << l.str() << " rank " << r);
    REQUIRE(out.errors[size_t(r)] == "");
  }
  return out.reports;
}

// Every tensor of two checkpoints (parameters and both AdamW moments), byte for byte.
void require_same_tensors(const std::string& a, const std::string& b) {
  const checkpoint::Manifest ma = checkpoint::verify(a), mb = checkpoint::verify(b);
  const auto names = checkpoint::tensor_names(a, ma);
  REQUIRE(names == checkpoint::tensor_names(b, mb));
  for (const auto& n : names) {
    INFO(n);
    Tensor ta = checkpoint::read_full(a, ma, n), tb = checkpoint::read_full(b, mb, n);
    REQUIRE(ta.nbytes() == tb.nbytes());
    REQUIRE(std::memcmp(ta.data(), tb.data(), ta.nbytes()) == 0);
  }
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

}  // namespace

TEST_CASE("mixed precision: a bf16 run resumes bit for bit under the same layout", "[checkpoint][half]") {
  const JobSpec spec = spec_in("bf16");
  for (Layout l : {Layout{1, 1, 1}, Layout{2, 2, 2}}) {
    INFO("layout " << l.str());
    const auto ref = run(spec, l, "", kSteps)[0];
    const std::string root = temp_dir("bf16_" + l.str());
    run(spec, l, "", 3, root);
    const auto rest = run(spec, l, root, kSteps)[0];
    REQUIRE(rest.size() == size_t(kSteps - 3));
    for (size_t i = 0; i < rest.size(); ++i) {
      REQUIRE(rest[i].loss == ref[3 + i].loss);
      REQUIRE(rest[i].grad_norm == ref[3 + i].grad_norm);
    }
    // The checkpoint keeps the f32 masters, not their bf16 copy.
    const checkpoint::Manifest m = checkpoint::verify(root + "/step_000003");
    CHECK(checkpoint::read_full(root + "/step_000003", m, "h.0.mlp.c_fc.weight").dtype() == DType::f32);
    fs::remove_all(root);
  }
}

TEST_CASE(
    "fp16: an overflow on one rank skips the step on every rank, halves the scale, and resumes bit for bit",
    "[checkpoint][half]") {
  const JobSpec spec = spec_in("fp16");
  const Layout l{2, 1, 2};
  const std::string root = temp_dir("fp16");
  const ScopedEnv fault("TROUPE_INJECT_OVERFLOW", "2:1");  // rank 1 (data 0, tensor 1) at step 2
  const auto ref = run(spec, l, "", kSteps);
  for (int r = 0; r < l.world(); ++r) {
    INFO("rank " << r);
    REQUIRE(ref[size_t(r)].size() == size_t(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s);
      const StepReport& x = ref[size_t(r)][size_t(s)];
      CHECK(x.skipped == (s == 2));
      CHECK(x.loss_scale == (s <= 2 ? 65536.0 : 32768.0));
      CHECK(std::isfinite(x.loss));
      CHECK(std::isfinite(x.grad_norm) == (s != 2));
    }
  }
  CHECK(ref[0].back().loss < ref[0].front().loss);  // training went on

  // The skipped step changed nothing: the state after step 2 is the state before it.
  run(spec, l, "", 2, root);
  run(spec, l, root, 3, root);
  require_same_tensors(root + "/step_000002", root + "/step_000003");
  const checkpoint::Manifest m = checkpoint::verify(root + "/step_000003");
  CHECK(m.loss_scale.at("scale").get<double>() == 32768.0);
  CHECK(m.loss_scale.at("skipped_steps").get<int64_t>() == 1);
  CHECK(m.loss_scale.at("clean_steps").get<int64_t>() == 0);
  // Resumed after the skip, the run continues bit for bit (scale, and AdamW's step count).
  const auto rest = run(spec, l, root + "/step_000003", kSteps);
  REQUIRE(rest[0].size() == size_t(kSteps - 3));
  for (size_t i = 0; i < rest[0].size(); ++i) {
    REQUIRE(rest[0][i].loss == ref[0][3 + i].loss);
    REQUIRE(rest[0][i].grad_norm == ref[0][3 + i].grad_norm);
    REQUIRE(rest[0][i].loss_scale == ref[0][3 + i].loss_scale);
  }
  fs::remove_all(root);
}

TEST_CASE("fp16: a manifest with a bad loss_scale is refused with its name, not trusted",
          "[checkpoint][half]") {
  const JobSpec spec = spec_in("fp16");
  const std::string root = temp_dir("bad_scale");
  run(spec, {}, "", 2, root);
  const std::string dir = root + "/step_000002", manifest = dir + "/manifest.json";
  std::ifstream in(manifest);
  const nlohmann::json good = nlohmann::json::parse(in);
  REQUIRE(good.contains("loss_scale"));
  const std::vector<std::pair<nlohmann::json, std::string>> bad_ones = {
      {{{"scale", -4.0}, {"clean_steps", 0}, {"skipped_steps", 0}}, "positive finite"},
      {{{"scale", 0.0}, {"clean_steps", 0}, {"skipped_steps", 0}}, "positive finite"},
      {{{"scale", 1024.0}, {"clean_steps", -1}, {"skipped_steps", 0}}, "counts >= 0"},
      {{{"scale", "big"}, {"clean_steps", 0}, {"skipped_steps", 0}}, "malformed loss_scale"},
      {{{"scale", 1024.0}}, "malformed loss_scale"},
      {nlohmann::json::array({1, 2}), "loss_scale is [1,2], not an object"}};
  for (const auto& [bad, says] : bad_ones) {
    INFO(bad.dump());
    nlohmann::json j = good;
    j["loss_scale"] = bad;
    std::ofstream(manifest, std::ios::trunc) << j.dump();
    EngineAssignment a;
    a.resume_from = dir;
    CHECK_THROWS_WITH(Engine(spec, a), Catch::Contains(says));
  }
  fs::remove_all(root);
}

TEST_CASE("mixed precision: a checkpoint of any precision and layout loads into any other",
          "[checkpoint][half]") {
  struct Case {
    std::string from;
    Layout saved;
    std::string to;
    Layout resumed;
  };
  const std::vector<Case> cases = {{"fp32", {2, 1, 1}, "bf16", {1, 2, 2}},
                                   {"bf16", {1, 1, 2}, "fp32", {2, 2, 1}},
                                   {"fp16", {1, 2, 1}, "bf16", {2, 1, 2}},
                                   {"bf16", {2, 2, 2}, "fp16", {1, 1, 1}}};
  for (const Case& c : cases) {
    INFO(c.from << " " << c.saved.str() << " -> " << c.to << " " << c.resumed.str());
    const auto ref = run(spec_in(c.to), {}, "", kSteps)[0];  // the target precision, uninterrupted
    const std::string root = temp_dir(c.from + "_" + c.to);
    run(spec_in(c.from), c.saved, "", 4, root);
    const auto rest = run(spec_in(c.to), c.resumed, root, kSteps)[0];
    REQUIRE(rest.size() == size_t(kSteps - 4));
    // Four steps in another precision move the masters by rounding noise only.
    for (size_t i = 0; i < rest.size(); ++i)
      CHECK(std::abs(rest[i].loss - ref[4 + i].loss) < 1e-2 * ref[4 + i].loss);
    fs::remove_all(root);
  }
}

TEST_CASE("export: --dtype bf16 writes the f32 masters rounded to nearest even",
          "[checkpoint][half][export]") {
  const std::string root = temp_dir("export");
  run(spec_in("bf16"), {1, 2, 2}, "", 2, root);
  const std::string f32 = root + "/f32.safetensors", bf16 = root + "/bf16.safetensors";
  const size_t n = checkpoint::export_model(root + "/step_000002", f32);
  REQUIRE(checkpoint::export_model(root + "/step_000002", bf16, DType::bf16) == n);
  safetensors::Reader a(f32), b(bf16);
  REQUIRE(a.names() == b.names());
  for (const auto& name : a.names()) {
    INFO(name);
    Tensor full = a.read(name), narrow = b.read(name);
    REQUIRE(full.dtype() == DType::f32);
    REQUIRE(narrow.dtype() == DType::bf16);
    REQUIRE(narrow.shape() == full.shape());
    for (int64_t i = 0; i < full.numel(); ++i) REQUIRE(narrow.h16()[i] == f32_to_bf16(full.f32()[i]));
  }
  CHECK(fs::file_size(bf16) < fs::file_size(f32) * 6 / 10);
  CHECK_THROWS_AS(checkpoint::export_model(root + "/step_000002", root + "/x.safetensors", DType::i32),
                  Error);
  fs::remove_all(root);
}
