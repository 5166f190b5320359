#include "core/token_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/token_file.hpp"

namespace troupe {

namespace {

void put_le(std::vector<uint8_t>& out, uint32_t v, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

[[noreturn]] void io_failed(const std::string& what, int err) {
  throw IoError(what + ": " + std::strerror(err), err);
}

}  // namespace

void write_token_file(const std::string& path, const uint32_t* ids, size_t n, uint64_t vocab_size) {
  require(n <= size_t(std::numeric_limits<int32_t>::max()), "cannot write ", path, ": ", n,
          " tokens are more than a token file's header counts (2^31 - 1); split the corpus");
  const int version = token_file_version(vocab_size);
  const int width = version == 1 ? 2 : 4;
  std::vector<uint8_t> header;
  header.reserve(TokenFile::kHeaderBytes);
  put_le(header, uint32_t(TokenFile::kMagic), 4);
  put_le(header, uint32_t(version), 4);
  put_le(header, uint32_t(n), 4);
  header.resize(TokenFile::kHeaderBytes, 0);

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) io_failed("cannot write " + tmp, errno);
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  // Little-endian whatever the host, in blocks so a corpus is not copied whole.
  std::vector<uint8_t> block;
  constexpr size_t kBlock = size_t(1) << 16;
  for (size_t i = 0; ok && i < n; i += kBlock) {
    block.clear();
    const size_t end = std::min(n, i + kBlock);
    for (size_t k = i; k < end; ++k) {
      if (ids[k] >= vocab_size) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw Error("cannot write " + path + ": token " + std::to_string(k) + " is " +
                    std::to_string(ids[k]) + ", outside the vocabulary of " + std::to_string(vocab_size));
      }
      put_le(block, ids[k], width);
    }
    ok = std::fwrite(block.data(), 1, block.size(), f) == block.size();
  }
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    const int e = ok ? errno : err;
    std::remove(tmp.c_str());
    io_failed("cannot write " + tmp, e);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    io_failed("cannot rename " + tmp + " to " + path, e);
  }
}

}  // namespace troupe
