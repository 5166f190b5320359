// Language-model data: a text corpus as one byte string (vocab 256), or token files
// (core/token_file.hpp) used in place through their memory mappings, split into a training
// head and a validation tail (or, for tokens, a validation split of files of its own).
//
// Batches are a pure function of (step, row): row i of the global batch of step s
// (B rows of T tokens) is the window starting at ((s*B + i)*T) mod (len - T - 1) of the
// split, inputs = the T bytes there, targets = the same window shifted by one. A
// data-parallel rank takes its rows [r*B/dp, (r+1)*B/dp) of that global batch, so
// changing the number of ranks never changes what the model sees. The rule counts tokens, and
// it is the same for bytes and for tokens: a split of several token files (shards) reads as
// their concatenation, so a window may cross from one shard into the next.
//   shards [a0 a1 a2] [b0 b1 b2 b3], T = 3: the window at 1 is inputs a1 a2 b0, targets a2 b0 b1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/token_file.hpp"

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
  // Token files, memory-mapped. Each entry of `train` and `val` is a token file, or a directory
  // whose *.bin files (sorted by path) are the shards; see list_token_files. The training split
  // is the concatenation of the train shards in order. With `val` empty the last val_fraction
  // of it is the validation split; otherwise the validation split is the concatenation of the
  // val shards and val_fraction must be 0. `width` is data.dtype's token width (2, 4, or 0 when
  // not given: see TokenFile::open). Every id is checked < vocab_size once, here.
  static Dataset from_tokens(const std::vector<std::string>& train, const std::vector<std::string>& val,
                             int width, int vocab_size, double val_fraction, std::string description);

  Dataset() = default;
  // Move-only: the runs point into bytes_' buffer and the shards' mappings, which a move keeps.
  Dataset(Dataset&&) = default;
  Dataset& operator=(Dataset&&) = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  uint64_t size() const { return split_size(Split::train) + split_size(Split::val); }  // tokens (bytes)
  uint64_t split_size(Split s) const { return split(s).size; }
  int vocab_size() const { return vocab_; }  // 256 for bytes
  bool is_bytes() const { return shards_.empty(); }
  // The bytes of a split (byte data only; token data has no single array).
  const uint8_t* split_data(Split s) const;
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
  // A contiguous piece of a split: tokens [begin, begin + n) of the split are the n tokens of
  // `width` bytes at `data`. Byte data is one run (or none, for an empty split); token data a
  // run per shard, or part of a shard where the tail split cuts one.
  struct Run {
    const void* data = nullptr;
    int width = 1;
    uint64_t begin = 0, n = 0;
  };
  struct SplitRuns {
    std::vector<Run> runs;  // by begin, ascending
    uint64_t size = 0;
  };
  const SplitRuns& split(Split s) const { return splits_[s == Split::train ? 0 : 1]; }
  // Tokens [pos, pos + count) of split s as int32, into out.
  void gather(Split s, uint64_t pos, uint64_t count, int32_t* out) const;
  const char* unit() const { return is_bytes() ? "bytes" : "tokens"; }
  // Splits `all` (one sequence of runs) into a head of train_size tokens and the rest.
  void cut(const std::vector<Run>& all, uint64_t train_size);

  std::vector<uint8_t> bytes_;
  std::vector<TokenFile> shards_;
  SplitRuns splits_[2];
  int vocab_ = 256;
  std::vector<std::string> files_;
  std::string description_;
};

// The token files `path` names: the file itself, or a directory's *.bin files (regular files or
// links to them, not recursive) sorted by path. Throws naming `path` when it does not exist or
// is a directory without any.
std::vector<std::string> list_token_files(const std::string& path);

}  // namespace troupe
