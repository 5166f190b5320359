// A file of token ids, memory-mapped read-only: llm.c's .bin format or a raw array.
//
// The llm.c format is a header of 256 little-endian int32, then the tokens:
//   header[0] = 20240520 (magic), header[1] = version (1: uint16 tokens, 2: uint32 tokens),
//   header[2] = number of tokens n, the rest 0;   file size = 1024 + n * width.
// A file whose first int32 is not the magic is a raw, headerless array of tokens whose width
// the caller gives (data.dtype). Either way the tokens are little-endian; the mapping is used in
// place (no copy of the data in RAM), so opening a many-GB shard costs a few system calls.
//
// Files are untrusted: every size and header field is checked before the mapping is used, and
// each problem is a troupe::Error whose message starts with the file's path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe {

class TokenFile {
 public:
  static constexpr int32_t kMagic = 20240520;
  static constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

  // Opens and checks `path`. `width` is the token width in bytes the spec asks for: 2 (uint16)
  // or 4 (uint32), or 0 when the spec does not say (a header decides; a raw file is uint16).
  // A header whose version disagrees with a given width is an error.
  static TokenFile open(const std::string& path, int width = 0);

  TokenFile() = default;
  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int width() const { return width_; }                // 2 or 4 bytes per token
  uint64_t size() const { return n_; }                // tokens
  bool has_header() const { return header_; }         // llm.c header present
  uint64_t file_bytes() const { return map_bytes_; }  // the whole file, header included
  const void* data() const { return tokens_; }        // size() tokens of width() bytes
  uint64_t byte_offset(uint64_t i) const { return (header_ ? kHeaderBytes : 0) + i * width_; }

  // Checks every id is < vocab in one pass; throws naming the file, the byte offset of the
  // first bad token, its value and the vocabulary:
  //   "data/train.bin: token 70000 at byte offset 2048 is >= model.vocab_size 4096"
  void scan_ids(int64_t vocab) const;

 private:
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;  // the mapping of the whole file
  uint64_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  uint64_t n_ = 0;
  int width_ = 0;
  bool header_ = false;
};

// The name of a token width as data.dtype spells it: 2 -> "uint16", 4 -> "uint32".
const char* token_dtype_name(int width);

}  // namespace troupe
