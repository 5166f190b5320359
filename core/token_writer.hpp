// Writing token files in llm.c's format (docs/training.md, "Data preparation"):
//
//   int32 header[256], little-endian: [0] = 20240520 (magic), [1] = version
//   (1: uint16 tokens, 2: uint32 tokens), [2] = number of tokens, the rest 0;
//   then the tokens, little-endian.      file size = 1024 + n * width
//
// Reading them is core/token_file.hpp's business (TokenFile::kMagic, kHeaderBytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe {

// The version a vocabulary needs: 1 (uint16) when every id fits 16 bits, else 2.
inline int token_file_version(uint64_t vocab_size) { return vocab_size <= 65536 ? 1 : 2; }

// Writes ids[0..n) to path (through path.tmp and a rename, so a reader never sees half a
// file), as version token_file_version(vocab_size). Every id must be < vocab_size and n
// must fit the header's int32 (troupe::Error otherwise); a failed write throws
// troupe::IoError.
void write_token_file(const std::string& path, const uint32_t* ids, size_t n, uint64_t vocab_size);

}  // namespace troupe
