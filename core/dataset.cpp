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
  const uint64_t n = d.bytes_.size();
  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(n) * val_fraction));
  std::vector<Run> all;
  if (n > 0) all.push_back(Run{d.bytes_.data(), 1, 0, n});
  d.cut(all, n - val);
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

Dataset Dataset::from_tokens(const std::vector<std::string>& train, const std::vector<std::string>& val,
                             int width, int vocab_size, double val_fraction, std::string description) {
  TROUPE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction must be in [0, 1), got ",
               val_fraction);
  TROUPE_CHECK(val.empty() || val_fraction == 0.0,
               "a validation split of files of its own and a val_fraction of ", val_fraction,
               " both ask for validation data");
  TROUPE_CHECK(vocab_size > 0, "vocab_size ", vocab_size, " must be positive");
  TROUPE_CHECK(!train.empty(), "no training token files");
  Dataset d;
  d.vocab_ = vocab_size;
  // Opens every shard of `paths` (each checked once: header, size, ids) and appends it to
  // `runs`, which then continue the same token sequence.
  auto open_all = [&](const std::vector<std::string>& paths, std::vector<Run>& runs) {
    uint64_t at = 0;
    for (const auto& p : paths)
      for (const auto& file : list_token_files(p)) {
        TokenFile f = TokenFile::open(file, width);
        f.scan_ids(vocab_size);
        runs.push_back(Run{f.data(), f.width(), at, f.size()});
        at += f.size();
        d.files_.push_back(file);
        d.shards_.push_back(std::move(f));  // the mapping, and so Run::data, stays where it is
      }
  };
  std::vector<Run> train_runs;
  open_all(train, train_runs);
  uint64_t n = 0;
  for (const auto& r : train_runs) n += r.n;
  if (val.empty()) {
    const uint64_t held = static_cast<uint64_t>(std::floor(static_cast<double>(n) * val_fraction));
    d.cut(train_runs, n - held);
  } else {
    d.cut(train_runs, n);
    SplitRuns& v = d.splits_[1];
    open_all(val, v.runs);
    for (const auto& r : v.runs) v.size += r.n;
  }
  d.description_ = std::move(description);
  return d;
}

void Dataset::cut(const std::vector<Run>& all, uint64_t train_size) {
  splits_[0] = SplitRuns{};
  splits_[1] = SplitRuns{};
  for (const Run& r : all) {
    // The part of r before train_size goes to train, the rest to val (rebased to start at 0).
    const uint64_t head = r.begin >= train_size ? 0 : std::min(r.n, train_size - r.begin);
    if (head > 0) splits_[0].runs.push_back(Run{r.data, r.width, r.begin, head});
    if (head < r.n) {
      const void* rest = static_cast<const char*>(r.data) + head * static_cast<uint64_t>(r.width);
      splits_[1].runs.push_back(Run{rest, r.width, r.begin + head - train_size, r.n - head});
    }
  }
  for (SplitRuns& sp : splits_)
    for (const Run& r : sp.runs) sp.size += r.n;
}

const uint8_t* Dataset::split_data(Split s) const {
  TROUPE_CHECK(is_bytes(), "split_data: ", description_, " is token data, not one byte array");
  return bytes_.data() + (s == Split::train ? 0 : split_size(Split::train));
}

namespace {

// n tokens of type U widened to int32: a loop the compiler vectorizes.
template <class U>
void widen(const void* src, uint64_t n, int32_t* out) {
  const U* p = static_cast<const U*>(src);
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
}

}  // namespace

void Dataset::gather(Split s, uint64_t pos, uint64_t count, int32_t* out) const {
  const std::vector<Run>& runs = split(s).runs;
  // The run holding pos: found once per window, then the window's tokens are copied run by run.
  auto it =
      std::upper_bound(runs.begin(), runs.end(), pos, [](uint64_t p, const Run& r) { return p < r.begin; });
  TROUPE_CHECK(it != runs.begin(), "token ", pos, " before the split's first run");
  --it;
  while (count > 0) {
    TROUPE_CHECK(it != runs.end(), "token ", pos, " past the end of the split");
    const Run& r = *it++;
    const uint64_t off = pos - r.begin;
    const uint64_t k = std::min(count, r.n - off);
    const void* src = static_cast<const char*>(r.data) + off * static_cast<uint64_t>(r.width);
    switch (r.width) {
      case 1:
        widen<uint8_t>(src, k, out);
        break;
      case 2:
        widen<uint16_t>(src, k, out);
        break;
      default:
        widen<uint32_t>(src, k, out);
        break;
    }
    out += k;
    pos += k;
    count -= k;
  }
}

uint64_t Dataset::window_start(Split s, int64_t step, int B, int T, int64_t row) const {
  const uint64_t len = split_size(s);
  TROUPE_CHECK(T > 0 && B > 0, "bad batch shape B=", B, " T=", T);
  TROUPE_CHECK(len > static_cast<uint64_t>(T) + 1, "split of ", len, " ", unit(),
               " is too short for windows of T=", T);
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
  for (int r = row_begin; r < row_end; ++r) {
    const uint64_t start = window_start(s, step, B, T, r);
    gather(s, start, static_cast<uint64_t>(T), inputs + static_cast<size_t>(r - row_begin) * T);
    gather(s, start + 1, static_cast<uint64_t>(T), targets + static_cast<size_t>(r - row_begin) * T);
  }
}

int64_t Dataset::num_eval_batches(int B, int T) const {
  const uint64_t len = split_size(Split::val);
  TROUPE_CHECK(len > static_cast<uint64_t>(T) + 1, "validation split of ", len, " ", unit(),
               " is too short for T=", T);
  int64_t n = static_cast<int64_t>((len - static_cast<uint64_t>(T) - 1) / (static_cast<uint64_t>(B) * T));
  return std::max<int64_t>(n, 1);
}

std::vector<std::string> list_token_files(const std::string& path) {
  const fs::path root(path);
  std::error_code ec;
  require(fs::exists(root, ec), path, ": no such file or directory");
  if (!fs::is_directory(root, ec)) return {path};
  std::vector<std::string> files;
  // Iterated with error codes: a directory that turns unreadable midway is an Error, not a
  // filesystem_error thrown from operator++.
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ignored;  // a broken link is not a shard
    if (it->path().extension() == ".bin" && fs::is_regular_file(it->path(), ignored))
      files.push_back(it->path().string());
  }
  require(!ec, path, ": cannot list the directory: ", ec.message());
  // Directory order is file-system dependent; byte order of paths is not.
  std::sort(files.begin(), files.end());
  require(!files.empty(), path, ": the directory holds no .bin token files");
  return files;
}

}  // namespace troupe
