// Byte-level BPE: a tokenizer troupe trains, saves and loads itself.
//
// Ids 0..255 are the bytes, id 256 (kEot) is the end-of-text token "<|endoftext|>", and
// merge i (0-based) makes id 257 + i from a pair of existing ids. Every byte string
// encodes (no unknown token), and decode(encode(s)) == s for any bytes: invalid UTF-8
// and NULs included.
//
// Text is first cut into chunks by the "troupe-v1" pre-tokenizer, and merges never cross
// a chunk boundary, so a token never spans a word and the space before the next one:
//
//   "Hello,  world 42!\n"  ->  "Hello" "," " " " world" " " "42" "!" "\n"
//
//   * a run of letters, with an optional leading space; bytes >= 0x80 count as letters,
//     so a UTF-8 word stays one chunk;
//   * a run of digits;
//   * a run of other bytes (punctuation, control bytes), with an optional leading space;
//   * a run of whitespace (space \t \n \v \f \r); when it is longer than one byte and
//     its last byte is a space that a letter or punctuation run follows, that space is
//     left to lead the next chunk (the spirit of GPT-2's `\s+(?!\S)`);
//   * no chunk is longer than kMaxChunk (256) bytes: a longer run is cut into pieces of
//     that size, so text without spaces (CJK, base64) costs what spaced text costs.
//
// The file format (written by save(), refused by load() when anything is off):
//
//   {"type": "troupe-bpe", "version": 1, "vocab_size": N, "eot": 256,
//    "pretokenizer": "troupe-v1", "merges": [[a, b], ...]}      N = 257 + len(merges)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe::bpe {

inline constexpr uint32_t kEot = 256;         // "<|endoftext|>"
inline constexpr uint32_t kFirstMerge = 257;  // id of merge 0
inline constexpr const char* kPretokenizer = "troupe-v1";
inline constexpr size_t kMaxFileBytes = size_t(64) << 20;  // load() refuses larger files
inline constexpr int64_t kMaxVocab = int64_t(1) << 24;     // as model.vocab_size
inline constexpr size_t kMaxChunk = 256;                   // bytes of one pre-tokenizer chunk at most

// The chunks of `text` under "troupe-v1" (see the file comment), as views into it, in
// order; their concatenation is `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

// Training progress: merges made so far and the number asked for.
using Progress = std::function<void(int64_t merges_done, int64_t merges_wanted)>;

class Tokenizer {
 public:
  // The bytes and the end-of-text token, no merges (vocab_size 257).
  Tokenizer();

  // Learns vocab_size - 257 merges from the documents (each one is pre-tokenized on its
  // own; nothing crosses a document). Each step merges the most frequent adjacent pair,
  // the smallest (a, b) among equal counts, so the result is a pure function of the
  // documents: the same corpus gives byte-identical JSON. When the corpus runs out of
  // pairs first, the vocabulary is smaller than asked. vocab_size must be in
  // [257, 2^32]. `cb`, when set, is called every 256 merges and at the end.
  static Tokenizer train(const std::vector<std::string_view>& documents, int64_t vocab_size,
                         const Progress& cb = {});

  // Reads a tokenizer JSON file. A file that is too large, not JSON, of another type,
  // version or pre-tokenizer, or whose merges use ids that do not exist yet (or the eot
  // id), repeat a pair, or disagree with vocab_size throws troupe::Error
  // "tokenizer FILE: what is wrong".
  static Tokenizer load(const std::string& json_path);
  // Writes the JSON (one merge a line) to path.tmp, then renames it over path, so a
  // reader never sees half a file. Throws troupe::IoError when the write fails.
  void save(const std::string& path) const;
  std::string to_json() const;

  // The ids of `text`; never contains kEot (the caller joins documents with it).
  // Safe to call from several threads at once.
  std::vector<uint32_t> encode(std::string_view text) const;
  // The bytes of ids[0..n). kEot decodes to nothing (it separates documents, it is not
  // text); an id >= vocab_size() throws troupe::Error naming it and its position.
  std::string decode(const uint32_t* ids, size_t n) const;
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }

  int vocab_size() const { return int(kFirstMerge + merges_.size()); }
  uint32_t eot() const { return kEot; }
  struct Pair {
    uint32_t a, b;
  };
  const std::vector<Pair>& merges() const { return merges_; }
  // The bytes of one id ("" for kEot).
  std::string_view token_bytes(uint32_t id) const;

 private:
  explicit Tokenizer(std::vector<Pair> merges);  // merges already checked
  void encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const;

  std::vector<Pair> merges_;
  // (a << 32 | b) -> merge index: what encode looks up for each adjacent pair.
  std::unordered_map<uint64_t, uint32_t> rank_;
  // Token bytes: id i is bytes_[offsets_[i], offsets_[i + 1]).
  std::string bytes_;
  std::vector<size_t> offsets_;
};

}  // namespace troupe::bpe
