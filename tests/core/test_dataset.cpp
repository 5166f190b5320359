#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/dataset.hpp"
#include "core/error.hpp"

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
