#include "core/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/corpus_files.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace troupe {
namespace fs = std::filesystem;

Dataset Dataset::from_bytes(std::vector<uint8_t> bytes, double val_fraction, std::string description) {
  TROUPE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction must be in [0, 1), got ",
               val_fraction);
  Dataset d;
  d.bytes_ = std::move(bytes);
  size_t val = static_cast<size_t>(std::floor(static_cast<double>(d.bytes_.size()) * val_fraction));
  d.train_size_ = d.bytes_.size() - val;
  d.description_ = std::move(description);
  return d;
}

Dataset Dataset::from_path(const std::string& path, double val_fraction) {
  fs::path root(path);
  TROUPE_CHECK(fs::exists(root), "dataset path ", path, " does not exist");
  std::vector<uint8_t> all;
  std::vector<std::string> used;
  for_each_text_file(path, [&](const std::string& file, std::string_view bytes) {
    all.insert(all.end(), bytes.begin(), bytes.end());
    used.push_back(file);
  });
  TROUPE_CHECK(!all.empty(), "dataset path ", path, " holds no text (files with NUL bytes are skipped)");
  Dataset d = from_bytes(std::move(all), val_fraction, path);
  d.files_ = std::move(used);
  return d;
}

Dataset Dataset::synthetic(uint64_t seed, size_t n_bytes, double val_fraction) {
  constexpr int kLetters = 32;
  constexpr int kSucc = 4;
  // Successor table and probabilities are drawn from the seed; a letter's next letter is
  // one of its 4 successors with probabilities 0.55/0.25/0.15/0.05 (entropy ~1.1 nats,
  // far below ln 256, so a model that learns the table shows a clear drop in loss).
  static constexpr double kProb[kSucc] = {0.55, 0.25, 0.15, 0.05};
  rng::Stream s(seed, rng::name_hash("dataset.synthetic"));
  int succ[kLetters][kSucc];
  for (auto& row : succ)
    for (int& x : row) x = static_cast<int>(s.below(kLetters));
  std::vector<uint8_t> bytes(n_bytes);
  int cur = static_cast<int>(s.below(kLetters));
  for (size_t i = 0; i < n_bytes; ++i) {
    bytes[i] = static_cast<uint8_t>('A' + cur);
    double u = s.uniform();
    int k = 0;
    while (k < kSucc - 1 && u >= kProb[k]) u -= kProb[k++];
    cur = succ[cur][k];
  }
  return from_bytes(std::move(bytes), val_fraction, "synthetic(seed=" + std::to_string(seed) + ")");
}

uint64_t Dataset::window_start(Split s, int64_t step, int B, int T, int64_t row) const {
  size_t len = split_size(s);
  TROUPE_CHECK(T > 0 && B > 0, "bad batch shape B=", B, " T=", T);
  TROUPE_CHECK(len > static_cast<size_t>(T) + 1, "split of ", len,
               " bytes is too short for windows of T=", T);
  TROUPE_CHECK(step >= 0 && row >= 0 && row < B, "bad step ", step, " or row ", row);
  uint64_t span = len - static_cast<uint64_t>(T) - 1;
  // (s*B + i)*T reduced in steps so that no realistic step count overflows.
  uint64_t idx = (static_cast<uint64_t>(step) * static_cast<uint64_t>(B) + static_cast<uint64_t>(row)) % span;
  return static_cast<uint64_t>((static_cast<unsigned __int128>(idx) * static_cast<uint64_t>(T)) % span);
}

void Dataset::get_rows(Split s, int64_t step, int B, int T, int row_begin, int row_end, int32_t* inputs,
                       int32_t* targets) const {
  TROUPE_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= B, "rows [", row_begin, ", ", row_end,
               ") outside a batch of ", B);
  TROUPE_CHECK(inputs != nullptr && targets != nullptr, "null output");
  const uint8_t* data = split_data(s);
  for (int r = row_begin; r < row_end; ++r) {
    uint64_t start = window_start(s, step, B, T, r);
    int32_t* in = inputs + static_cast<size_t>(r - row_begin) * T;
    int32_t* tg = targets + static_cast<size_t>(r - row_begin) * T;
    for (int t = 0; t < T; ++t) {
      in[t] = data[start + t];
      tg[t] = data[start + t + 1];
    }
  }
}

int64_t Dataset::num_eval_batches(int B, int T) const {
  size_t len = split_size(Split::val);
  TROUPE_CHECK(len > static_cast<size_t>(T) + 1, "validation split of ", len,
               " bytes is too short for T=", T);
  int64_t n = static_cast<int64_t>((len - static_cast<size_t>(T) - 1) / (static_cast<size_t>(B) * T));
  return std::max<int64_t>(n, 1);
}

}  // namespace troupe
