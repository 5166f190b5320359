#include "core/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "core/hostile_file.hpp"

namespace troupe {

// The tokens are used in place, so the host must read little-endian integers as the file stores them.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read in place: little-endian only");

namespace {

// The largest id among n tokens: a branch-free reduction the compiler vectorizes.
template <class U>
U max_of(const U* p, size_t n) {
  U m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  return m;
}

// The index of the first id >= vocab, or n: max_of over blocks first, so that the common case
// (every id fits) is one vectorized pass and only a bad block is searched token by token.
template <class U>
uint64_t first_bad(const U* p, uint64_t n, uint64_t vocab) {
  constexpr uint64_t kBlock = 1 << 16;
  for (uint64_t b = 0; b < n; b += kBlock) {
    const uint64_t len = std::min(kBlock, n - b);
    if (max_of(p + b, static_cast<size_t>(len)) < vocab) continue;
    for (uint64_t i = b; i < b + len; ++i)
      if (p[i] >= vocab) return i;
  }
  return n;
}

}  // namespace

const char* token_dtype_name(int width) { return width == 4 ? "uint32" : "uint16"; }

TokenFile TokenFile::open(const std::string& path, int width) {
  TROUPE_CHECK(width == 0 || width == 2 || width == 4, "token width ", width, " is not 2 or 4");
  TokenFile f;
  f.path_ = path;
  uint64_t bytes = 0;
  const int fd = open_regular_file(path, "token file", &bytes);
  if (bytes == 0) {
    ::close(fd);
    require(false, path, ": the file is empty (no tokens)");
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file's pages reachable on its own
  require(m != MAP_FAILED, path, ": cannot map ", bytes, " bytes: ", std::strerror(map_errno));
  f.map_ = m;
  f.map_bytes_ = bytes;

  // From here `f` owns the mapping: a failed check below unmaps it on the way out.
  int32_t magic = 0;
  if (bytes >= sizeof magic) std::memcpy(&magic, m, sizeof magic);
  if (magic == kMagic) {
    require(bytes >= kHeaderBytes, path, ": ", bytes, " bytes is shorter than the ", kHeaderBytes,
            "-byte header its magic number announces");
    int32_t header[3];
    std::memcpy(header, m, sizeof header);
    const int32_t version = header[1];
    require(version == 1 || version == 2, path, ": header version ", version,
            " is not 1 (uint16 tokens) or 2 (uint32 tokens)");
    const int hw = version == 1 ? 2 : 4;
    require(width == 0 || width == hw, path, ": the header says ", token_dtype_name(hw), " tokens (version ",
            version, ") but data.dtype is ", token_dtype_name(width));
    require(header[2] >= 0, path, ": header token count ", header[2], " is negative");
    const uint64_t n = static_cast<uint64_t>(header[2]);
    const uint64_t want = kHeaderBytes + n * static_cast<uint64_t>(hw);
    require(want == bytes, path, ": the header says ", n, " ", token_dtype_name(hw), " tokens (", want,
            " bytes with the header) but the file has ", bytes, " bytes");
    require(n > 0, path, ": the header says 0 tokens (no tokens)");
    f.header_ = true;
    f.width_ = hw;
    f.n_ = n;
    f.tokens_ = static_cast<const char*>(m) + kHeaderBytes;
  } else {
    const int w = width == 0 ? 2 : width;
    require(bytes % static_cast<uint64_t>(w) == 0, path, ": ", bytes, " bytes is not a whole number of ",
            token_dtype_name(w), " tokens");
    f.width_ = w;
    f.n_ = bytes / static_cast<uint64_t>(w);
    f.tokens_ = m;
  }
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  map_ = std::exchange(o.map_, nullptr);
  map_bytes_ = std::exchange(o.map_bytes_, 0);
  tokens_ = std::exchange(o.tokens_, nullptr);
  n_ = std::exchange(o.n_, 0);
  width_ = std::exchange(o.width_, 0);
  header_ = std::exchange(o.header_, false);
  return *this;
}

TokenFile::~TokenFile() { release(); }

void TokenFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_bytes_));
  map_ = nullptr;
}

void TokenFile::scan_ids(int64_t vocab) const {
  TROUPE_CHECK(vocab > 0, "vocab ", vocab, " must be positive");
  const uint64_t v = static_cast<uint64_t>(vocab);
  uint64_t bad = n_;
  uint64_t value = 0;
  if (width_ == 2) {
    const auto* p = static_cast<const uint16_t*>(tokens_);
    bad = first_bad(p, n_, v);
    if (bad < n_) value = p[bad];
  } else {
    const auto* p = static_cast<const uint32_t*>(tokens_);
    bad = first_bad(p, n_, v);
    if (bad < n_) value = p[bad];
  }
  require(bad == n_, path_, ": token ", value, " at byte offset ", byte_offset(bad),
          " is >= model.vocab_size ", vocab);
}

}  // namespace troupe
