#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/spec.hpp"
#include "tests/core/minimal_spec.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using troupe::JobSpec;
using troupe::load_spec;
using troupe::parse_spec;
using troupe::SpecError;

namespace {

const char* kMinimal = troupe::testing::kMinimalSpec;

// The shipped job specs: every .yaml under configs/ but the hardware profiles (configs/hardware/).
std::vector<fs::path> config_files() {
  std::vector<fs::path> out;
  const fs::path hardware = fs::path(TROUPE_SOURCE_DIR) / "configs" / "hardware";
  for (const auto& e : fs::recursive_directory_iterator(fs::path(TROUPE_SOURCE_DIR) / "configs"))
    if (e.is_regular_file() && e.path().extension() == ".yaml" && e.path().parent_path() != hardware)
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The diagnostics of a spec that must fail; an empty list when it unexpectedly parses.
std::vector<troupe::Diagnostic> errors_of(const std::string& text) {
  try {
    parse_spec(text, "job.yaml");
  } catch (const SpecError& e) {
    return e.diagnostics;
  }
  return {};
}

bool has_error(const std::vector<troupe::Diagnostic>& ds, int line, int col, const std::string& fragment) {
  for (const auto& d : ds)
    if (d.line == line && d.col == col && d.message.find(fragment) != std::string::npos) return true;
  return false;
}

// A scratch directory under the build tree, removed at scope end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::path(TROUPE_BINARY_DIR) / ("spec_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("every shipped config loads and round-trips through to_yaml", "[core][spec]") {
  auto files = config_files();
  REQUIRE(files.size() >= 12);
  for (const auto& f : files) {
    INFO(f.string());
    JobSpec s;
    REQUIRE_NOTHROW(s = load_spec(f.string()));
    CHECK(s.source_file == f.string());
    CHECK_FALSE(s.name.empty());
    std::string y = troupe::to_yaml(s);
    JobSpec back = parse_spec(y, "resolved.yaml");
    CHECK(back == s);
    CHECK(troupe::to_yaml(back) == y);
  }
}

TEST_CASE("the layout configs describe the same tiny model on their layouts", "[core][spec]") {
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "configs" / "layouts";
  struct L {
    const char* file;
    int dp, pp, tp;
    troupe::Schedule sched;
    int vs;
  };
  using S = troupe::Schedule;
  const L layouts[] = {{"tiny_dp1_pp1_tp1", 1, 1, 1, S::one_f_one_b, 1},
                       {"tiny_dp2_pp1_tp1", 2, 1, 1, S::one_f_one_b, 1},
                       {"tiny_dp1_pp2_tp1_gpipe", 1, 2, 1, S::gpipe, 1},
                       {"tiny_dp1_pp2_tp1_1f1b", 1, 2, 1, S::one_f_one_b, 1},
                       {"tiny_dp1_pp2_tp1_interleaved", 1, 2, 1, S::interleaved, 2},
                       {"tiny_dp1_pp1_tp2", 1, 1, 2, S::one_f_one_b, 1},
                       {"tiny_dp2_pp2_tp1", 2, 2, 1, S::one_f_one_b, 1},
                       {"tiny_dp2_pp1_tp2", 2, 1, 2, S::one_f_one_b, 1},
                       {"tiny_dp1_pp2_tp2", 1, 2, 2, S::one_f_one_b, 1},
                       {"tiny_dp2_pp2_tp2", 2, 2, 2, S::one_f_one_b, 1}};
  for (const auto& l : layouts) {
    INFO(l.file);
    JobSpec s = load_spec((dir / (std::string(l.file) + ".yaml")).string());
    CHECK(s.parallel.data == l.dp);
    CHECK(s.parallel.pipeline == l.pp);
    CHECK(s.parallel.tensor == l.tp);
    CHECK(s.parallel.schedule == l.sched);
    CHECK(s.parallel.virtual_stages == l.vs);
    CHECK(s.model.seq_len == 32);
    CHECK(s.model.d_model == 64);
    CHECK(s.model.n_layers == 4);
    CHECK(s.model.n_heads == 4);
    CHECK(s.model.vocab_size == 256);
    CHECK(s.train.global_batch == 8);
    CHECK(s.train.micro_batch == 2);
    CHECK(s.train.steps == 10);
    CHECK(s.train.seed == 0);
    CHECK(s.data.source == troupe::DataSource::synthetic);
  }
}

TEST_CASE("quickstart and mlp configs say what they promise", "[core][spec]") {
  JobSpec q = load_spec(std::string(TROUPE_SOURCE_DIR) + "/configs/quickstart.yaml");
  CHECK(q.model.type == troupe::ModelType::gpt);
  CHECK(q.data.source == troupe::DataSource::text);
  CHECK(q.data.path == "/usr/share/games/fortunes");
  CHECK(q.resources.device == troupe::DeviceKind::cpu);
  CHECK(troupe::layout_devices(q.parallel) == 1);
  CHECK(q.train.eval_every > 0);
  JobSpec m = load_spec(std::string(TROUPE_SOURCE_DIR) + "/configs/mlp.yaml");
  CHECK(m.model.type == troupe::ModelType::mlp);
  CHECK(m.model.n_heads == 0);
  CHECK(m.data.source == troupe::DataSource::synthetic);
}

TEST_CASE("defaults are the documented ones", "[core][spec]") {
  JobSpec s = parse_spec(kMinimal, "min.yaml");
  CHECK(s.name == "tiny");
  CHECK(s.source_file == "min.yaml");
  CHECK(s.model.vocab_size == 256);
  CHECK(s.model.init_from.empty());
  CHECK(s.data.source == troupe::DataSource::text);
  CHECK(s.data.path == "corpus.txt");
  CHECK(s.data.val_fraction == 0.05);
  const auto& t = s.train;
  CHECK(t.micro_batch == 8);  // global_batch / data
  CHECK(t.optimizer.type == "adamw");
  CHECK(t.optimizer.lr == 3e-4);
  CHECK(t.optimizer.beta1 == 0.9);
  CHECK(t.optimizer.beta2 == 0.95);
  CHECK(t.optimizer.eps == 1e-8);
  CHECK(t.optimizer.weight_decay == 0.1);
  CHECK(t.lr_schedule == troupe::LrSchedule::cosine);
  CHECK(t.warmup_steps == 0);
  CHECK(t.min_lr == 0.0);
  CHECK(t.grad_clip == 1.0);
  CHECK(t.precision == troupe::Precision::fp32);
  CHECK(t.recompute == troupe::Recompute::none);
  CHECK(t.seed == 0);
  CHECK(t.eval_every == 0);
  CHECK(t.eval_batches == 4);
  CHECK(t.log_every == 1);
  CHECK(s.parallel.data == 1);
  CHECK(s.parallel.pipeline == 1);
  CHECK(s.parallel.tensor == 1);
  CHECK(s.parallel.schedule == troupe::Schedule::one_f_one_b);
  CHECK(s.parallel.virtual_stages == 1);
  CHECK(s.resources.device == troupe::DeviceKind::cpu);
  CHECK(s.resources.threads_per_worker == 1);
  CHECK(s.resources.placement == troupe::Placement::pack);
  CHECK(s.resources.memory_per_device == 0);
  CHECK(s.checkpoint.dir.empty());
  CHECK(s.checkpoint.every == 0);
  CHECK(s.checkpoint.keep == 3);
  CHECK(s.checkpoint.async);
  CHECK(s.fault.max_restarts == 3);
  CHECK(s.fault.heartbeat == 1s);
  CHECK(s.fault.step_timeout == 0ms);
  CHECK(s.elastic.min_devices == 0);
  CHECK(s.elastic.max_devices == 0);
}

TEST_CASE("micro_batch follows data parallelism, and auto is kept for the planner", "[core][spec]") {
  std::string dp2 = std::string(kMinimal) + "parallel:\n  data: 2\n";
  CHECK(parse_spec(dp2, "a.yaml").train.micro_batch == 4);
  std::string dp_auto = std::string(kMinimal) + "parallel:\n  data: auto\n  pipeline: auto\n  tensor: auto\n";
  JobSpec a = parse_spec(dp_auto, "a.yaml");
  CHECK(a.parallel.data == 0);
  CHECK(a.parallel.pipeline == 0);
  CHECK(a.parallel.tensor == 0);
  CHECK(a.train.micro_batch == 0);
  CHECK_FALSE(troupe::layout_devices(a.parallel).has_value());
  CHECK(parse_spec(troupe::to_yaml(a), "a.yaml") == a);
  std::string micro_auto = std::string(kMinimal);
  micro_auto.replace(micro_auto.find("global_batch: 8"), 15, "global_batch: 8\n  micro_batch: auto");
  CHECK(parse_spec(micro_auto, "a.yaml").train.micro_batch == 0);
}

TEST_CASE("every value written in a spec is read into the struct", "[core][spec]") {
  const char* full = R"(name: full.job_1
model: {type: gpt, vocab_size: 512, seq_len: 64, d_model: 96, n_layers: 6, n_heads: 6, init_from: /ckpt/x}
data: {source: tokens, path: "/data/a b", val_fraction: 0, dtype: uint32, val_path: /data/val.bin, eot: 256,
       tokenizer: /data/tok.json}
train:
  steps: 1000
  global_batch: 24
  micro_batch: 3
  optimizer: {type: adamw, lr: 6e-4, beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0}
  lr_schedule: linear
  warmup_steps: 100
  min_lr: 6e-5
  grad_clip: 0
  precision: bf16
  recompute: block
  seed: 18446744073709551615
  eval_every: 0
  eval_batches: 2
  log_every: 5
parallel: {data: 2, pipeline: 3, tensor: 2, schedule: interleaved, virtual_stages: 2}
resources: {device: cuda, threads_per_worker: 4, memory_per_device: 80GB, placement: spread}
checkpoint: {dir: /ckpt, every: 50, keep: 1, async: false}
fault: {max_restarts: 0, heartbeat: 250ms, step_timeout: 2m}
elastic: {min_devices: 6, max_devices: 24}
)";
  JobSpec s = parse_spec(full, "full.yaml");
  CHECK(s.name == "full.job_1");
  CHECK(s.model.vocab_size == 512);
  CHECK(s.model.n_heads == 6);
  CHECK(s.model.init_from == "/ckpt/x");
  CHECK(s.data.source == troupe::DataSource::tokens);
  CHECK(s.data.path == "/data/a b");
  CHECK(s.data.val_fraction == 0.0);
  CHECK(s.data.dtype == troupe::TokenDType::uint32);
  CHECK(s.data.val_path == "/data/val.bin");
  CHECK(s.data.eot == 256);
  CHECK(s.data.tokenizer == "/data/tok.json");
  CHECK(s.train.micro_batch == 3);
  CHECK(s.train.optimizer.lr == 6e-4);
  CHECK(s.train.optimizer.beta1 == 0.8);
  CHECK(s.train.optimizer.beta2 == 0.99);
  CHECK(s.train.optimizer.eps == 1e-6);
  CHECK(s.train.optimizer.weight_decay == 0.0);
  CHECK(s.train.lr_schedule == troupe::LrSchedule::linear);
  CHECK(s.train.warmup_steps == 100);
  CHECK(s.train.min_lr == 6e-5);
  CHECK(s.train.grad_clip == 0.0);
  CHECK(s.train.precision == troupe::Precision::bf16);
  CHECK(s.train.recompute == troupe::Recompute::full);  // "block": the older spelling of full
  CHECK(s.train.seed == UINT64_MAX);
  CHECK(s.train.eval_batches == 2);
  CHECK(s.train.log_every == 5);
  CHECK(s.parallel.schedule == troupe::Schedule::interleaved);
  CHECK(troupe::layout_devices(s.parallel) == 12);
  CHECK(s.resources.device == troupe::DeviceKind::cuda);
  CHECK(s.resources.threads_per_worker == 4);
  CHECK(s.resources.memory_per_device == 80000000000ull);
  CHECK(s.resources.placement == troupe::Placement::spread);
  CHECK(s.checkpoint.dir == "/ckpt");
  CHECK(s.checkpoint.every == 50);
  CHECK(s.checkpoint.keep == 1);
  CHECK_FALSE(s.checkpoint.async);
  CHECK(s.fault.max_restarts == 0);
  CHECK(s.fault.heartbeat == 250ms);
  CHECK(s.fault.step_timeout == 120s);
  CHECK(s.elastic.min_devices == 6);
  CHECK(s.elastic.max_devices == 24);
  JobSpec back = parse_spec(troupe::to_yaml(s), "back.yaml");
  CHECK(back == s);
  // Strings with quotes, backslashes and control characters survive the round trip.
  s.checkpoint.dir = "we\"ird\\path\twith\nlines: and # marks";
  s.model.init_from = "caf\xc3\xa9";
  CHECK(parse_spec(troupe::to_yaml(s), "back.yaml") == s);
}

TEST_CASE("enum names are the YAML spellings", "[core][spec]") {
  CHECK(std::string(to_string(troupe::Schedule::one_f_one_b)) == "1f1b");
  CHECK(std::string(to_string(troupe::Schedule::gpipe)) == "gpipe");
  CHECK(std::string(to_string(troupe::Schedule::interleaved)) == "interleaved");
  CHECK(std::string(to_string(troupe::ModelType::mlp)) == "mlp");
  CHECK(std::string(to_string(troupe::DataSource::synthetic)) == "synthetic");
  CHECK(std::string(to_string(troupe::Precision::bf16)) == "bf16");
  CHECK(std::string(to_string(troupe::Recompute::full)) == "full");
  CHECK(std::string(to_string(troupe::Recompute::auto_)) == "auto");
  CHECK(std::string(to_string(troupe::DeviceKind::cuda)) == "cuda");
  CHECK(std::string(to_string(troupe::LrSchedule::constant)) == "constant");
}

TEST_CASE("a diagnostic prints like a compiler error with a hint", "[core][spec]") {
  troupe::Diagnostic d{"job.yaml", 12, 9, "unknown key 'lrr' in train.optimizer", "did you mean 'lr'?"};
  CHECK(d.str() == "job.yaml:12:9: error: unknown key 'lrr' in train.optimizer\n  hint: did you mean 'lr'?");
  troupe::Diagnostic whole{"job.yaml", 0, 0, "spec file is a directory", ""};
  CHECK(whole.str() == "job.yaml: error: spec file is a directory");
}

TEST_CASE("all errors of a file are reported in one go", "[core][spec]") {
  const char* text = R"(name: three
model:
  type: gpt
  seq_len: 32
  d_model: 64
  n_layers: 4
  n_heads: 4
  dropuot: 0.1
data:
  source: synthetic
train:
  steps: -5
  global_batch: 8
parallel:
  schedule: gpip
)";
  try {
    parse_spec(text, "three.yaml");
    FAIL("spec with three errors parsed");
  } catch (const SpecError& e) {
    REQUIRE(e.diagnostics.size() == 3);
    CHECK(has_error(e.diagnostics, 8, 3, "unknown key 'dropuot'"));
    CHECK(has_error(e.diagnostics, 12, 10, "'train.steps' is out of range"));
    CHECK(has_error(e.diagnostics, 15, 13, "unknown pipeline schedule 'gpip'"));
    std::string all = e.what();
    CHECK(all.find("three.yaml:8:3: error:") != std::string::npos);
    CHECK(all.find("three.yaml:12:10: error:") != std::string::npos);
    CHECK(all.find("three.yaml:15:13: error:") != std::string::npos);
    CHECK(all.find("hint:") != std::string::npos);
  }
}

TEST_CASE("unknown keys get a did-you-mean from the right map", "[core][spec]") {
  auto with = [](const std::string& extra) { return std::string(kMinimal) + extra; };
  auto hint_for = [](const std::vector<troupe::Diagnostic>& ds) { return ds.empty() ? "" : ds.front().hint; };
  CHECK(hint_for(errors_of(with("  optimizer:\n    wieght_decay: 0.1\n"))) == "did you mean 'weight_decay'?");
  CHECK(hint_for(errors_of(with("  golbal_batch: 8\n"))).find("did you mean 'global_batch'?") !=
        std::string::npos);
  CHECK(hint_for(errors_of(with("  max_steps: 8\n"))) == "did you mean 'steps'?");
  CHECK(hint_for(errors_of(with("parallel:\n  tp: 2\n"))) == "did you mean 'tensor'?");
  CHECK(hint_for(errors_of(with("  lr: 0.1\n"))).find("train.optimizer.lr") != std::string::npos);
  CHECK(hint_for(errors_of(with("zzz: 1\n"))).find("known keys at the top level: name, model") !=
        std::string::npos);
}

TEST_CASE("optimizer betas: a list of beta1 and beta2, read as the two keys and resolved to them",
          "[core][spec]") {
  auto with = [](const std::string& opt) { return std::string(kMinimal) + "  optimizer:\n" + opt; };
  JobSpec s = parse_spec(with("    betas: [0.8, 0.99]\n"), "a.yaml");
  CHECK(s.train.optimizer.beta1 == 0.8);
  CHECK(s.train.optimizer.beta2 == 0.99);
  CHECK(parse_spec(with("    betas:\n      - 0.8\n      - 0.99\n"), "a.yaml") == s);
  CHECK(parse_spec(with("    beta1: 0.8\n    beta2: 0.99\n"), "a.yaml") == s);
  // The resolved form keeps the two keys, and reads back the same.
  const std::string y = troupe::to_yaml(s);
  CHECK(y.find("    beta1: 0.8\n    beta2: 0.99\n") != std::string::npos);
  CHECK(y.find("betas") == std::string::npos);
  CHECK(parse_spec(y, "resolved.yaml") == s);
}

TEST_CASE("optimizer betas: with beta1 or beta2, or not two numbers from 0 up to 1, is an error at it",
          "[core][spec]") {
  // kMinimal has 12 lines; "  optimizer:" is line 13.
  auto with = [](const std::string& opt) { return std::string(kMinimal) + "  optimizer:\n" + opt; };
  auto both = errors_of(with("    beta1: 0.9\n    betas: [0.9, 0.95]\n"));
  REQUIRE(both.size() == 1);
  CHECK(has_error(both, 15, 5, "'train.optimizer.betas' is given together with 'beta1'"));
  CHECK(both[0].hint.find("keep one spelling") != std::string::npos);
  CHECK(has_error(errors_of(with("    betas: [0.9, 0.95]\n    beta1: 0.9\n    beta2: 0.95\n")), 14, 5,
                  "together with 'beta1' and 'beta2'"));
  CHECK(has_error(errors_of(with("    betas: [0.9]\n")), 14, 5,
                  "must be a list of two numbers, got a list of 1"));
  CHECK(has_error(errors_of(with("    betas: [0.9, 0.95, 0.999]\n")), 14, 5, "got a list of 3"));
  CHECK(has_error(errors_of(with("    betas: 0.9\n")), 14, 12, "must be a list of two numbers, got '0.9'"));
  CHECK(has_error(errors_of(with("    betas: {a: 1}\n")), 14, 5, "got a mapping"));
  auto range = errors_of(with("    betas: [-0.1, 1.0]\n"));
  CHECK(has_error(range, 14, 13, "out of range: beta1 -0.1 is not in [0, 1)"));
  CHECK(has_error(range, 14, 19, "out of range: beta2 1.0 is not in [0, 1)"));
  for (const auto& d : range) CHECK(d.hint.find("[0.9, 0.95]") != std::string::npos);
  CHECK(
      has_error(errors_of(with("    betas: [\"0.9\", 0.95]\n")), 14, 13, "its beta1 is the string \"0.9\""));
  CHECK(has_error(errors_of(with("    betas: [0.9, [0.95]]\n")), 14, 18, "its beta2 is a list"));
  // Under train (not train.optimizer) it is an unknown key that points to where it belongs.
  auto misplaced = errors_of(std::string(kMinimal) + "  betas: [0.9, 0.95]\n");
  REQUIRE(misplaced.size() == 1);
  CHECK(misplaced[0].hint.find("'train.optimizer.betas'") != std::string::npos);
}

TEST_CASE("null sections take their defaults, but required keys are still required", "[core][spec]") {
  JobSpec s = parse_spec(std::string(kMinimal) + "parallel:\ncheckpoint:\n", "a.yaml");
  CHECK(s.parallel.data == 1);
  auto ds = errors_of("name: x\nmodel:\ndata:\n  source: synthetic\ntrain:\n  steps: 1\n  global_batch: 1\n");
  CHECK(has_error(ds, 2, 1, "missing required key 'model.type'"));
  CHECK(has_error(ds, 2, 1, "missing required key 'model.seq_len'"));
}

TEST_CASE("a rejected value does not cascade into rule errors", "[core][spec]") {
  // n_heads is wrong, so neither d_model % n_heads nor n_heads % tensor is reported again.
  std::string text = kMinimal;
  text.replace(text.find("n_heads: 4"), 10, "n_heads: four");
  auto ds = errors_of(text + "parallel:\n  tensor: 3\n");
  CHECK(has_error(ds, 7, 12, "must be an integer"));
  for (const auto& d : ds) CHECK(d.message.find("n_heads (") == std::string::npos);
}

TEST_CASE("file problems are clean SpecErrors", "[core][spec]") {
  TempDir tmp;
  auto expect_file_error = [](const std::string& path, const std::string& fragment) {
    try {
      load_spec(path);
      FAIL("loaded " << path);
    } catch (const SpecError& e) {
      REQUIRE(e.diagnostics.size() == 1);
      CHECK(e.diagnostics[0].file == path);
      CHECK(e.diagnostics[0].line == 0);
      INFO(e.what());
      CHECK(e.diagnostics[0].message.find(fragment) != std::string::npos);
    }
  };
  expect_file_error((tmp.path / "missing.yaml").string(), "cannot open spec file");
  expect_file_error(tmp.path.string(), "is a directory");
  expect_file_error("/dev/null", "not a regular file");

  // 50 MB: refused from its size alone, before anything is read.
  fs::path big = tmp.path / "big.yaml";
  {
    std::ofstream out(big, std::ios::binary);
    std::string line = "# padding padding padding padding padding padding padding padding padding\n";
    for (size_t written = 0; written < 50000000; written += line.size()) out << line;
  }
  expect_file_error(big.string(), "spec file is 50 MB; a job spec is at most 1 MiB");

  fs::path empty = tmp.path / "empty.yaml";
  std::ofstream(empty).close();
  try {
    load_spec(empty.string());
    FAIL("loaded an empty file");
  } catch (const SpecError& e) {
    REQUIRE(e.diagnostics.size() == 1);
    CHECK(e.diagnostics[0].message == "spec file is empty");
  }
  // parse_spec applies the same size limit to text it is handed.
  try {
    parse_spec(std::string(troupe::kMaxSpecBytes + 1, '#'), "huge.yaml");
    FAIL("parsed a text over the limit");
  } catch (const SpecError& e) {
    CHECK(e.diagnostics.at(0).message.find("at most 1 MiB") != std::string::npos);
  }
}

TEST_CASE("a spec written into a file loads the same as its text", "[core][spec]") {
  TempDir tmp;
  fs::path p = tmp.path / "job.yaml";
  std::ofstream(p) << kMinimal;
  JobSpec from_file = load_spec(p.string());
  JobSpec from_text = parse_spec(kMinimal, p.string());
  CHECK(from_file == from_text);
  CHECK(from_file.source_file == p.string());
}

TEST_CASE("pathological keys and values are reported shortened", "[core][spec]") {
  std::string key(1000, 'k');  // YAML caps implicit keys at 1024 characters
  auto ds = errors_of(std::string(kMinimal) + key + ": 1\n");
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].message.find("unknown key 'kkkk") != std::string::npos);
  CHECK(ds[0].message.find("...") != std::string::npos);
  CHECK(ds[0].message.size() < 200);
  std::string text = kMinimal;
  text.replace(text.find("steps: 10"), 9, "steps: " + std::string(300000, '9'));
  ds = errors_of(text);
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].message.find("'train.steps' is out of range") != std::string::npos);
  CHECK(ds[0].message.size() < 200);
}
