// data.source tokens in the spec: its keys, their rules, and the checks of the token files that
// troupe validate, troupe run and the coordinator's submit make before anything starts.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/spec.hpp"
#include "core/token_file.hpp"

namespace fs = std::filesystem;
using troupe::Diagnostic;
using troupe::JobSpec;
using troupe::parse_spec;

namespace {

// `data_lines` is the data section's body; the model's vocabulary is 512.
std::string spec_with(const std::string& data_lines) {
  return "name: tok\n"
         "model: {type: gpt, vocab_size: 512, seq_len: 8, d_model: 16, n_layers: 1, n_heads: 2}\n"
         "data:\n" +
         data_lines +
         "train:\n"
         "  steps: 3\n"
         "  global_batch: 2\n";
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("troupe-specdata-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// n uint16 ids, id i = i % vocab, after an llm.c header when `header`.
std::string write_u16(const std::string& path, size_t n, uint32_t vocab, bool header) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (header) {
    int32_t h[256] = {troupe::TokenFile::kMagic, 1, static_cast<int32_t>(n)};
    out.write(reinterpret_cast<const char*>(h), sizeof h);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t v = static_cast<uint16_t>(i % vocab);
    out.write(reinterpret_cast<const char*>(&v), 2);
  }
  return path;
}

std::vector<Diagnostic> errors_of(const std::string& text) {
  try {
    parse_spec(text, "job.yaml");
  } catch (const troupe::SpecError& e) {
    return e.diagnostics;
  }
  return {};
}

}  // namespace

TEST_CASE("spec data: tokens reads every key, and its resolved form reads back the same", "[core][spec]") {
  const JobSpec s = parse_spec(spec_with("  source: tokens\n  path: shards/\n  dtype: uint32\n  eot: 256\n"
                                         "  tokenizer: tok.json\n"),
                               "job.yaml");
  CHECK(s.data.source == troupe::DataSource::tokens);
  CHECK(s.data.path == "shards/");
  CHECK(s.data.dtype == troupe::TokenDType::uint32);
  CHECK(s.data.eot == 256);
  CHECK(s.data.tokenizer == "tok.json");
  CHECK(s.data.val_fraction == 0.05);
  CHECK(s.data.val_path.empty());
  CHECK(parse_spec(troupe::to_yaml(s), "back.yaml") == s);

  // Not given, dtype and eot stay unset through the round trip: a header still decides the width.
  const JobSpec bare = parse_spec(spec_with("  source: tokens\n  path: train.bin\n"), "job.yaml");
  CHECK_FALSE(bare.data.dtype.has_value());
  CHECK(bare.data.eot == -1);
  const std::string y = troupe::to_yaml(bare);
  CHECK(y.find("dtype:") == std::string::npos);
  CHECK(y.find("eot:") == std::string::npos);
  CHECK(parse_spec(y, "back.yaml") == bare);

  // val_path is the validation split: no tail is held out, and val_fraction 0 may say so.
  for (const char* extra : {"", "  val_fraction: 0\n"}) {
    const JobSpec v = parse_spec(
        spec_with(std::string("  source: tokens\n  path: train.bin\n  val_path: val.bin\n") + extra),
        "job.yaml");
    CHECK(v.data.val_path == "val.bin");
    CHECK(v.data.val_fraction == 0.0);
    CHECK(parse_spec(troupe::to_yaml(v), "back.yaml") == v);
  }
  // With val_path, evaluation has a split although val_fraction is 0.
  CHECK_NOTHROW(parse_spec(
      spec_with("  source: tokens\n  path: t.bin\n  val_path: v.bin\n") + "  eval_every: 2\n", "job.yaml"));
}

TEST_CASE("spec data: keys of token data are refused for text and synthetic, and the byte vocab is 256",
          "[core][spec]") {
  for (const char* key : {"dtype: uint16", "val_path: v.bin", "eot: 1", "tokenizer: t.json"}) {
    INFO(key);
    const auto ds = errors_of(spec_with(std::string("  source: synthetic\n  ") + key + "\n"));
    REQUIRE(ds.size() == 2);  // the key, and vocab 512 for bytes
    const std::string name = std::string(key).substr(0, std::string(key).find(':'));
    CHECK(ds[1].str() == "job.yaml:5:3: error: 'data." + name +
                             "' applies only to data.source tokens\n"
                             "  hint: delete it, or set data.source: tokens (token files; see "
                             "docs/training.md#token-data)");
  }
  const auto vocab = errors_of(spec_with("  source: text\n  path: corpus.txt\n"));
  REQUIRE(vocab.size() == 1);
  CHECK(
      vocab[0].str() ==
      "job.yaml:2:32: error: model.vocab_size is 512 but data.source text is bytes: byte-level text has 256 "
      "ids\n  hint: set model.vocab_size: 256 or use data.source: tokens");
  // The eot id is a token of the model's vocabulary.
  const auto eot = errors_of(spec_with("  source: tokens\n  path: t.bin\n  eot: 600\n"));
  REQUIRE(eot.size() == 1);
  CHECK(eot[0].line == 6);
  CHECK(eot[0].message == "data.eot (600) is not below model.vocab_size (512)");
  CHECK(errors_of(spec_with("  source: tokens\n  path: t.bin\n  eot: 511\n")).empty());
  // Both ways of choosing the validation split: the message says which to delete.
  const auto both =
      errors_of(spec_with("  source: tokens\n  path: t.bin\n  val_path: v.bin\n  val_fraction: 0.1\n"));
  REQUIRE(both.size() == 1);
  CHECK(both[0].line == 7);
  CHECK(both[0].hint.find("delete val_fraction") != std::string::npos);
  CHECK(both[0].hint.find("or delete val_path") != std::string::npos);
}

TEST_CASE(
    "spec data: token files that cannot be read are refused at data.path before troupe validate or run "
    "starts",
    "[core][spec]") {
  TempDir dir("files");
  auto spec_of = [&](const std::string& data_lines) { return parse_spec(spec_with(data_lines), "job.yaml"); };
  write_u16(dir / "ok.bin", 100, 512, true);
  const JobSpec good = spec_of("  source: tokens\n  path: " + dir.path.string() + "\n");
  CHECK(troupe::runnable_issues(good).empty());
  CHECK(troupe::token_file_issues(good, troupe::kValidateScanBytes).empty());

  // Missing, an empty directory, a size that is not whole tokens: at data.path (line 4, col 9).
  fs::create_directories(dir.path / "empty");
  std::ofstream(dir / "odd.bin", std::ios::binary) << "abc";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir / "missing.bin", dir / "missing.bin: no such file or directory"},
      {dir / "empty", dir / "empty: the directory holds no .bin token files"},
      {dir / "odd.bin", dir / "odd.bin: 3 bytes is not a whole number of uint16 tokens"},
  };
  for (const auto& [path, message] : cases) {
    INFO(path);
    const JobSpec s = spec_of("  source: tokens\n  path: " + path + "\n");  // parse_spec opens no file
    CHECK(troupe::runnable_issues(s).empty());  // troupe plan and submit do not read the data
    const auto issues = troupe::token_file_issues(s, 0);
    REQUIRE(issues.size() == 1);
    CHECK(issues[0].file == "job.yaml");
    CHECK(issues[0].line == 5);
    CHECK(issues[0].col == 9);
    CHECK(issues[0].message == message);
    CHECK_FALSE(issues[0].hint.empty());
    CHECK_THROWS_AS(troupe::require_startable(s), troupe::SpecError);
  }
  // A header that disagrees with data.dtype: the hint says to delete dtype.
  const auto dtype = troupe::token_file_issues(
      spec_of("  source: tokens\n  path: " + dir / "ok.bin" + "\n  dtype: uint32\n"), 0);
  REQUIRE(dtype.size() == 1);
  CHECK(dtype[0].message ==
        dir / "ok.bin: the header says uint16 tokens (version 1) but data.dtype is uint32");
  CHECK(dtype[0].hint.rfind("delete data.dtype", 0) == 0);
  // The validation files' problems are at data.val_path.
  const auto val = troupe::token_file_issues(
      spec_of("  source: tokens\n  path: " + dir / "ok.bin" + "\n  val_path: " + dir / "nope" + "\n"), 0);
  REQUIRE(val.size() == 1);
  CHECK(val[0].line == 6);
  CHECK(val[0].message == dir / "nope: no such file or directory");
  // Text data is not opened before the run, as before.
  CHECK(troupe::token_file_issues(
            parse_spec("name: t\nmodel: {type: gpt, seq_len: 8, d_model: 16, n_layers: 1, n_heads: 2}\n"
                       "data: {path: /no/such/corpus.txt}\ntrain: {steps: 1, global_batch: 2}\n",
                       "job.yaml"),
            troupe::kValidateScanBytes)
            .empty());
}

TEST_CASE("spec data: ids >= model.vocab_size are found by the scan of small files, not by the cheap checks",
          "[core][spec]") {
  TempDir dir("ids");
  write_u16(dir / "a.bin", 100, 512, false);
  write_u16(dir / "b.bin", 1000, 600, true);  // ids 512..599 from id 512 on, at 1024 + 2 * 512
  const JobSpec s =
      parse_spec(spec_with("  source: tokens\n  path: " + dir.path.string() + "\n"), "job.yaml");
  CHECK(troupe::runnable_issues(s).empty());
  const auto issues = troupe::token_file_issues(s, troupe::kValidateScanBytes);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 5);
  CHECK(issues[0].message == dir / "b.bin: token 512 at byte offset 2048 is >= model.vocab_size 512");
  CHECK(issues[0].hint.find("model.vocab_size") != std::string::npos);
  // Files over the limit in all are left to the engine's open, which scans every id.
  CHECK(troupe::token_file_issues(s, 1000).empty());
}

TEST_CASE("spec data: with evaluation on, a validation split shorter than one window is refused at its key",
          "[core][spec]") {
  TempDir dir("short_val");
  write_u16(dir / "train.bin", 1000, 512, true);
  write_u16(dir / "val.bin", 6, 512, true);  // seq_len 8: a window is 9 tokens
  auto with_eval = [](std::string text) {
    return text.replace(text.find("  steps: 3\n"), 11, "  steps: 3\n  eval_every: 1\n");
  };
  const JobSpec files = parse_spec(with_eval(spec_with("  source: tokens\n  path: " + dir / "train.bin" +
                                                       "\n  val_path: " + dir / "val.bin" + "\n")),
                                   "job.yaml");
  auto issues = troupe::token_file_issues(files, 0);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 6);  // data.val_path
  CHECK(issues[0].message ==
        "the validation split holds 6 tokens, too few for one window of seq_len + 1 = 9");
  // The tail of 1000 tokens at val_fraction 0.005 is 5 tokens: at data.val_fraction.
  const JobSpec tail = parse_spec(
      with_eval(spec_with("  source: tokens\n  path: " + dir / "train.bin" + "\n  val_fraction: 0.005\n")),
      "job.yaml");
  issues = troupe::token_file_issues(tail, 0);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 6);
  CHECK(issues[0].message.find("holds 5 tokens") != std::string::npos);
  // Without evaluation the split is not read.
  CHECK(troupe::token_file_issues(parse_spec(spec_with("  source: tokens\n  path: " + dir / "train.bin" +
                                                       "\n  val_path: " + dir / "val.bin" + "\n"),
                                             "job.yaml"),
                                  0)
            .empty());
}

TEST_CASE("spec data: a FIFO at data.path is refused as not a regular file, without blocking",
          "[core][spec]") {
  TempDir dir("fifo");
  const std::string fifo = dir / "pipe.bin";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto issues = troupe::token_file_issues(
      parse_spec(spec_with("  source: tokens\n  path: " + fifo + "\n"), "job.yaml"), 0);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].message == fifo + ": not a regular file");
}
