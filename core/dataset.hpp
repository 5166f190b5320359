// Byte-level language-model data: a text corpus as one byte string, split into a
// training head and a validation tail.
//
// Batches are a pure function of (step, row): row i of the global batch of step s
// (B rows of T tokens) is the window starting at ((s*B + i)*T) mod (len - T - 1) of the
// split, inputs = the T bytes there, targets = the same window shifted by one. A
// data-parallel rank takes its rows [r*B/dp, (r+1)*B/dp) of that global batch, so
// changing the number of ranks never changes what the model sees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

enum class Split : uint8_t { train, val };

class Dataset {
 public:
  // A text file, or a directory of text files read recursively in sorted path order.
  // Files containing a NUL byte (binary, e.g. fortune's .dat indexes) and symbolic links
  // (aliases that would duplicate text) are skipped. The last val_fraction of the
  // concatenated bytes is the validation split.
  static Dataset from_path(const std::string& path, double val_fraction);
  // Deterministic bytes from `seed` with learnable structure: a first-order Markov
  // chain over a 32-letter alphabet in which each letter has four likely successors.
  static Dataset synthetic(uint64_t seed, size_t n_bytes, double val_fraction);
  // From bytes in memory (tests, tools).
  static Dataset from_bytes(std::vector<uint8_t> bytes, double val_fraction,
                            std::string description = "bytes");

  size_t size() const { return bytes_.size(); }
  size_t split_size(Split s) const { return s == Split::train ? train_size_ : bytes_.size() - train_size_; }
  const uint8_t* split_data(Split s) const { return bytes_.data() + (s == Split::train ? 0 : train_size_); }
  const std::vector<std::string>& files() const { return files_; }  // files read, in order
  const std::string& description() const { return description_; }

  // Start of window `row` of the global batch of `step` in split s (see the file comment).
  uint64_t window_start(Split s, int64_t step, int B, int T, int64_t row) const;

  // Rows [row_begin, row_end) of the global batch of `step`: inputs and targets are
  // ((row_end - row_begin), T) int32, row-major.
  void get_rows(int64_t step, int B, int T, int row_begin, int row_end, int32_t* inputs,
                int32_t* targets) const {
    get_rows(Split::train, step, B, T, row_begin, row_end, inputs, targets);
  }
  void get_rows(Split s, int64_t step, int B, int T, int row_begin, int row_end, int32_t* inputs,
                int32_t* targets) const;

  // Evaluation batches tile the validation tail: eval batch k is get_rows(Split::val, k, ...).
  // This many batches cover the tail once (at least 1).
  int64_t num_eval_batches(int B, int T) const;

 private:
  std::vector<uint8_t> bytes_;
  size_t train_size_ = 0;
  std::vector<std::string> files_;
  std::string description_;
};

}  // namespace troupe
