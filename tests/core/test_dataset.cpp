#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <vector>

#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/token_file.hpp"

namespace fs = std::filesystem;
using troupe::Dataset;
using troupe::Split;

TEST_CASE("dataset: windows follow the documented formula, targets are inputs shifted", "[dataset]") {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 7 + i / 13) % 251);
  Dataset d = Dataset::from_bytes(bytes, 0.1);
  REQUIRE(d.split_size(Split::train) == 900);
  REQUIRE(d.split_size(Split::val) == 100);
  const int B = 4, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t step : {0, 1, 37, 123456789}) {
    d.get_rows(step, B, T, 0, B, in.data(), tg.data());
    for (int i = 0; i < B; ++i) {
      uint64_t start = static_cast<uint64_t>(((step * B + i) * T) % (900 - T - 1));
      REQUIRE(d.window_start(Split::train, step, B, T, i) == start);
      for (int t = 0; t < T; ++t) {
        REQUIRE(in[static_cast<size_t>(i * T + t)] == bytes[start + static_cast<uint64_t>(t)]);
        REQUIRE(tg[static_cast<size_t>(i * T + t)] == bytes[start + static_cast<uint64_t>(t) + 1]);
      }
    }
  }
  // Validation windows come from the tail only.
  d.get_rows(Split::val, 2, 2, T, 0, 2, in.data(), tg.data());
  uint64_t vs = d.window_start(Split::val, 2, 2, T, 1);
  REQUIRE(in[static_cast<size_t>(T)] == bytes[900 + vs]);
  REQUIRE(d.num_eval_batches(2, T) == (100 - T - 1) / (2 * T));
}

TEST_CASE("dataset: data-parallel ranks' rows concatenate to the global batch", "[dataset]") {
  Dataset d = Dataset::synthetic(3, 5000, 0.1);
  const int B = 8, T = 12;
  std::vector<int32_t> gi(B * T), gt(B * T);
  d.get_rows(5, B, T, 0, B, gi.data(), gt.data());
  for (int dp : {1, 2, 4, 8}) {
    std::vector<int32_t> ci, ct;
    for (int r = 0; r < dp; ++r) {
      int rb = r * B / dp, re = (r + 1) * B / dp;
      std::vector<int32_t> i2((re - rb) * T), t2((re - rb) * T);
      d.get_rows(5, B, T, rb, re, i2.data(), t2.data());
      ci.insert(ci.end(), i2.begin(), i2.end());
      ct.insert(ct.end(), t2.begin(), t2.end());
    }
    REQUIRE(ci == gi);
    REQUIRE(ct == gt);
  }
}

TEST_CASE("dataset: synthetic data is deterministic and structured", "[dataset]") {
  Dataset a = Dataset::synthetic(11, 20000, 0.0);
  Dataset b = Dataset::synthetic(11, 20000, 0.0);
  Dataset c = Dataset::synthetic(12, 20000, 0.0);
  std::vector<uint8_t> va(a.split_data(Split::train), a.split_data(Split::train) + a.size());
  std::vector<uint8_t> vb(b.split_data(Split::train), b.split_data(Split::train) + b.size());
  std::vector<uint8_t> vc(c.split_data(Split::train), c.split_data(Split::train) + c.size());
  REQUIRE(va == vb);
  REQUIRE(va != vc);
  // Empirical conditional entropy H(next | current) is far below ln 256: learnable.
  std::map<int, std::map<int, int>> counts;
  for (size_t i = 0; i + 1 < va.size(); ++i) counts[va[i]][va[i + 1]]++;
  double h = 0;
  for (auto& [cur, nexts] : counts) {
    double tot = 0;
    for (auto& kv : nexts) tot += kv.second;
    for (auto& kv : nexts) h -= kv.second / (va.size() - 1.0) * std::log(kv.second / tot);
  }
  REQUIRE(h < 1.6);
  REQUIRE(h > 0.5);
}

TEST_CASE("dataset: directory is read recursively, sorted, skipping binary files and links", "[dataset]") {
  fs::path dir = fs::temp_directory_path() / ("troupe-ds-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "b.txt") << "BBB";
  std::ofstream(dir / "a.txt") << "AAA";
  std::ofstream(dir / "sub" / "c.txt") << "CCC";
  {
    std::ofstream bin(dir / "a.dat", std::ios::binary);
    bin.write("x\0y", 3);
  }
  fs::create_symlink(dir / "a.txt", dir / "a.u8");
  Dataset d = Dataset::from_path(dir.string(), 0.0);
  std::string text(d.split_data(Split::train), d.split_data(Split::train) + d.size());
  REQUIRE(text == "AAABBBCCC");
  REQUIRE(d.files().size() == 3);
  Dataset one = Dataset::from_path((dir / "b.txt").string(), 0.0);
  REQUIRE(one.size() == 3);
  REQUIRE_THROWS_AS(Dataset::from_path((dir / "missing").string(), 0.0), troupe::Error);
  fs::remove_all(dir);

  if (fs::is_directory("/usr/share/games/fortunes")) {
    Dataset f = Dataset::from_path("/usr/share/games/fortunes", 0.05);
    REQUIRE(f.size() > 1'000'000);
    for (const auto& p : f.files()) REQUIRE(fs::path(p).extension() != ".dat");
    const uint8_t* p = f.split_data(Split::train);
    for (size_t i = 0; i < f.size(); ++i) REQUIRE(p[i] != 0);
    REQUIRE(f.split_size(Split::val) == static_cast<size_t>(std::floor(f.size() * 0.05)));
  }
}

// ---- token files

namespace {

// A fresh directory of its own for each test case.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("troupe-tok-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// `ids` as a token file of `width` bytes, little-endian, after an llm.c header when `header`;
// version and count override the header's fields (-1: the right ones).
std::string write_tokens(const std::string& path, const std::vector<uint32_t>& ids, int width, bool header,
                         int32_t version = -1, int64_t count = -1) {
  std::vector<uint8_t> b;
  if (header) {
    put32(b, troupe::TokenFile::kMagic);
    put32(b, static_cast<uint32_t>(version >= 0 ? version : width == 2 ? 1 : 2));
    put32(b, static_cast<uint32_t>(count >= 0 ? count : static_cast<int64_t>(ids.size())));
    b.resize(troupe::TokenFile::kHeaderBytes, 0);
  }
  for (uint32_t v : ids)
    for (int i = 0; i < width; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  write_bytes(path, b);
  return path;
}

std::vector<uint32_t> pattern(size_t n, uint32_t vocab, uint32_t salt = 0) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * 7919u + i / 13 + salt) % vocab);
  return v;
}

// The windows of the documented formula over `seq`, the split as one array in memory: what a
// dataset of token files must serve, whatever the shards.
void require_windows(const Dataset& d, Split s, const std::vector<uint32_t>& seq, int B, int T,
                     std::initializer_list<int64_t> steps) {
  REQUIRE(d.split_size(s) == seq.size());
  std::vector<int32_t> in(static_cast<size_t>(B * T)), tg(in.size());
  for (int64_t step : steps) {
    d.get_rows(s, step, B, T, 0, B, in.data(), tg.data());
    for (int i = 0; i < B; ++i) {
      const uint64_t span = seq.size() - static_cast<uint64_t>(T) - 1;
      const uint64_t start = (static_cast<uint64_t>(step * B + i) % span) * static_cast<uint64_t>(T) % span;
      REQUIRE(d.window_start(s, step, B, T, i) == start);
      for (int t = 0; t < T; ++t) {
        INFO("step " << step << " row " << i << " t " << t);
        REQUIRE(in[static_cast<size_t>(i * T + t)] == static_cast<int32_t>(seq[start + t]));
        REQUIRE(tg[static_cast<size_t>(i * T + t)] == static_cast<int32_t>(seq[start + t + 1]));
      }
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const troupe::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("dataset: uint16 and uint32 token files, with and without a header, serve their windows",
          "[dataset]") {
  TempDir dir("widths");
  for (int width : {2, 4}) {
    for (bool header : {false, true}) {
      INFO("width " << width << " header " << header);
      const uint32_t vocab = width == 2 ? 60000 : 100000;  // uint32 ids above 65535 survive
      const std::vector<uint32_t> ids = pattern(3000, vocab);
      const std::string f = write_tokens(dir / "t.bin", ids, width, header);
      // A header gives the width; a raw file needs it unless it is uint16.
      for (int asked : {0, width}) {
        if (asked == 0 && width == 4 && !header) continue;
        Dataset d = Dataset::from_tokens({f}, {}, asked, static_cast<int>(vocab), 0.1, "t");
        CHECK_FALSE(d.is_bytes());
        CHECK(d.vocab_size() == static_cast<int>(vocab));
        CHECK(d.size() == 3000);
        CHECK(d.files() == std::vector<std::string>{f});
        const std::vector<uint32_t> train(ids.begin(), ids.begin() + 2700),
            val(ids.begin() + 2700, ids.end());
        require_windows(d, Split::train, train, 4, 16, {0, 1, 37, 123456789});
        require_windows(d, Split::val, val, 2, 16, {0, 3});
        CHECK(d.num_eval_batches(2, 16) == (300 - 16 - 1) / (2 * 16));
        // A move keeps the mapping where the windows point.
        Dataset moved = std::move(d);
        require_windows(moved, Split::train, train, 4, 16, {5});
      }
    }
  }
  // Bytes keep their vocabulary of 256.
  Dataset b = Dataset::from_bytes(std::vector<uint8_t>(100, 'a'), 0.1);
  CHECK(b.is_bytes());
  CHECK(b.vocab_size() == 256);
}

TEST_CASE("dataset: shards read as their concatenation, windows crossing from one into the next",
          "[dataset]") {
  TempDir dir("shards");
  const std::vector<uint32_t> all = pattern(1000, 5000, 3);
  // Shards of 7, 500 and 493 tokens, one with a header; listed in path order whatever the names'
  // creation order, and files that are not .bin are not shards.
  write_tokens(dir / "02.bin", {all.begin() + 507, all.end()}, 2, false);
  write_tokens(dir / "00.bin", {all.begin(), all.begin() + 7}, 2, false);
  write_tokens(dir / "01.bin", {all.begin() + 7, all.begin() + 507}, 2, true);
  write_bytes(dir / "notes.txt", {'h', 'i'});
  Dataset d = Dataset::from_tokens({dir.path.string()}, {}, 0, 5000, 0.0, "shards");
  CHECK(d.files() == std::vector<std::string>{dir / "00.bin", dir / "01.bin", dir / "02.bin"});
  const int B = 4, T = 16;
  // Window 0 starts in the 7-token shard and ends in the next: inputs all[0..16), targets all[1..17).
  std::vector<int32_t> in(B * T), tg(B * T);
  d.get_rows(0, B, T, 0, 1, in.data(), tg.data());
  for (int t = 0; t < T; ++t) {
    REQUIRE(in[t] == static_cast<int32_t>(all[t]));
    REQUIRE(tg[t] == static_cast<int32_t>(all[t + 1]));
  }
  // Every window of many steps equals the window of the array built in memory, the ones crossing
  // 7 and 507 included.
  std::vector<int64_t> steps;
  for (int64_t s = 0; s < 64; ++s) steps.push_back(s);
  for (int64_t s : steps) require_windows(d, Split::train, all, B, T, {s});
  // Explicit files in the order given work the same as the directory.
  Dataset e = Dataset::from_tokens({dir / "00.bin", dir / "01.bin", dir / "02.bin"}, {}, 0, 5000, 0, "x");
  require_windows(e, Split::train, all, B, T, {1, 9, 31});
}

TEST_CASE("dataset: token splits: the tail of the shards, or val files of their own", "[dataset]") {
  TempDir dir("splits");
  const std::vector<uint32_t> all = pattern(1000, 700);
  write_tokens(dir / "a.bin", {all.begin(), all.begin() + 600}, 2, true);
  write_tokens(dir / "b.bin", {all.begin() + 600, all.end()}, 2, false);
  // val_fraction 0.25 holds out the last 250 tokens: the tail cuts a.bin at 750 - 600 = 150 into b.bin.
  const std::vector<std::string> shards{dir / "a.bin", dir / "b.bin"};
  Dataset tail = Dataset::from_tokens(shards, {}, 2, 700, 0.25, "tail");
  require_windows(tail, Split::train, {all.begin(), all.begin() + 750}, 2, 8, {0, 1, 17, 999});
  require_windows(tail, Split::val, {all.begin() + 750, all.end()}, 2, 8, {0, 1, 5});
  // And a cut inside the first shard (val 0.5: 500 tokens, a.bin's last 100 and all of b.bin).
  Dataset half = Dataset::from_tokens(shards, {}, 2, 700, 0.5, "half");
  require_windows(half, Split::val, {all.begin() + 500, all.end()}, 2, 8, {0, 3, 11});

  const std::vector<uint32_t> v = pattern(300, 700, 99);
  write_tokens(dir / "val.bin", v, 4, true);
  Dataset sep = Dataset::from_tokens(shards, {dir / "val.bin"}, 0, 700, 0.0, "sep");
  require_windows(sep, Split::train, all, 2, 8, {0, 4, 63});
  require_windows(sep, Split::val, v, 2, 8, {0, 2});
  CHECK(sep.num_eval_batches(2, 8) == (300 - 8 - 1) / 16);
  CHECK(sep.size() == 1300);
  CHECK(sep.files().back() == dir / "val.bin");
}

TEST_CASE("dataset: bad token files are refused naming the file, and the offset of a bad id", "[dataset]") {
  TempDir dir("bad");
  using Catch::Matchers::Equals;
  const std::vector<uint32_t> ok = pattern(100, 256);
  auto open = [](const std::string& p, int width = 0, int vocab = 4096) {
    return [=] { Dataset::from_tokens({p}, {}, width, vocab, 0.0, "bad"); };
  };
  // A raw file's size must be whole tokens.
  write_bytes(dir / "odd.bin", std::vector<uint8_t>(1001, 1));
  CHECK(error_of(open(dir / "odd.bin")) ==
        dir / "odd.bin" + ": 1001 bytes is not a whole number of uint16 tokens");
  write_bytes(dir / "six.bin", std::vector<uint8_t>(6, 1));
  CHECK(error_of(open(dir / "six.bin", 4)) ==
        dir / "six.bin" + ": 6 bytes is not a whole number of uint32 tokens");
  // Headers: the count must match the size, the version be 1 or 2 and agree with data.dtype.
  write_tokens(dir / "count.bin", ok, 2, true, -1, 101);
  CHECK(error_of(open(dir / "count.bin")) ==
        dir / "count.bin" +
            ": the header says 101 uint16 tokens (1226 bytes with the header) but the file has " +
            "1224 bytes");
  write_tokens(dir / "version.bin", ok, 2, true, 3);
  CHECK(error_of(open(dir / "version.bin")) ==
        dir / "version.bin" + ": header version 3 is not 1 (uint16 tokens) or 2 (uint32 tokens)");
  write_tokens(dir / "wide.bin", ok, 4, true);
  CHECK(error_of(open(dir / "wide.bin", 2)) ==
        dir / "wide.bin" + ": the header says uint32 tokens (version 2) but data.dtype is uint16");
  write_tokens(dir / "negative.bin", ok, 2, true, -1, 0xffffffffu);
  CHECK(error_of(open(dir / "negative.bin")) == dir / "negative.bin" + ": header token count -1 is negative");
  std::vector<uint8_t> short_header;  // the magic, then too little
  put32(short_header, troupe::TokenFile::kMagic);
  put32(short_header, 1);
  write_bytes(dir / "short.bin", short_header);
  CHECK(error_of(open(dir / "short.bin")) ==
        dir / "short.bin" + ": 8 bytes is shorter than the 1024-byte header its magic number announces");
  write_tokens(dir / "none.bin", {}, 2, true);
  CHECK(error_of(open(dir / "none.bin")) == dir / "none.bin" + ": the header says 0 tokens (no tokens)");
  write_bytes(dir / "empty.bin", {});
  CHECK(error_of(open(dir / "empty.bin")) == dir / "empty.bin" + ": the file is empty (no tokens)");
  // Ids: the first one >= vocab, by its byte offset in the file.
  std::vector<uint32_t> bad(1000, 3);
  bad[512] = 70000;  // byte offset 1024 + 4 * 512 = 3072
  bad[900] = 80000;
  write_tokens(dir / "ids.bin", bad, 4, true);
  CHECK(error_of(open(dir / "ids.bin", 0)) ==
        dir / "ids.bin" + ": token 70000 at byte offset 3072 is >= model.vocab_size 4096");
  std::vector<uint32_t> raw = ok;
  raw[3] = 4096;
  write_tokens(dir / "raw.bin", raw, 2, false);
  CHECK(error_of(open(dir / "raw.bin")) ==
        dir / "raw.bin" + ": token 4096 at byte offset 6 is >= model.vocab_size 4096");
  CHECK_NOTHROW(open(dir / "raw.bin", 2, 4097)());
  // Bad ids in the validation files are found too.
  write_tokens(dir / "good.bin", ok, 2, false);
  CHECK(error_of([&] { Dataset::from_tokens({dir / "good.bin"}, {dir / "raw.bin"}, 0, 4096, 0, "v"); }) ==
        dir / "raw.bin" + ": token 4096 at byte offset 6 is >= model.vocab_size 4096");
  // Paths: missing, an empty directory, a directory without .bin files.
  CHECK(error_of(open(dir / "missing.bin")) == dir / "missing.bin" + ": no such file or directory");
  fs::create_directories(dir.path / "empty");
  CHECK(error_of(open(dir / "empty")) == dir / "empty" + ": the directory holds no .bin token files");
  write_bytes(dir / "empty/readme.txt", {'x'});
  CHECK(error_of(open(dir / "empty")) == dir / "empty" + ": the directory holds no .bin token files");
}
