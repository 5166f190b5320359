#include "core/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_read.hpp"

namespace troupe::safetensors {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, so that a
// corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeader = 100'000'000;
// {"name": {"shape": [..]}}: three levels; metadata values are strings.
constexpr int kMaxHeaderDepth = 4;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FormatError("safetensors " + path + ": " + what);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;  // a write of 0 bytes to a regular file: no room
      throw IoError("write to " + path + " failed: " + std::strerror(err), err);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes at offset or reports how far the file fell short.
void pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error("safetensors " + path + ": read failed: " + std::strerror(errno));
    if (r == 0) fail(path, "unexpected end of file at byte " + std::to_string(offset));
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

}  // namespace

const char* dtype_to_string(DType dt) {
  switch (dt) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::f64:
      return "F64";
  }
  return "?";
}

DType dtype_from_string(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  if (s == "U8") return DType::u8;
  if (s == "F64") return DType::f64;
  throw FormatError("unsupported safetensors dtype \"" + s + "\"");
}

WriteEntry entry(std::string name, const Tensor& t) {
  TROUPE_CHECK(t.device() == Device::cpu, "safetensors writes CPU tensors only: ", name);
  return WriteEntry{std::move(name), t.dtype(), t.shape(), t.data()};
}

uint64_t write(const std::string& path, const std::vector<WriteEntry>& entries, const Metadata& metadata,
               const WriteOptions& options) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& e : entries) {
    TROUPE_CHECK(!e.name.empty() && e.name != "__metadata__", "bad tensor name \"", e.name, "\"");
    TROUPE_CHECK(seen.insert(e.name).second, "duplicate tensor name ", e.name);
    uint64_t n = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    TROUPE_CHECK(e.data != nullptr || n == 0, "null data for ", e.name);
    header[e.name] = {
        {"dtype", dtype_to_string(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t hlen = text.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(hlen >> (8 * i));

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TROUPE_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  try {
    write_all(fd, len_le, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& e : entries) {
      size_t n = static_cast<size_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
      write_all(fd, e.data, n, path);
    }
    if (options.fsync && ::fsync(fd) != 0)
      throw IoError("fsync " + path + ": " + std::strerror(errno), errno);
  } catch (...) {
    // No half-written file stays behind (a full disk keeps whatever room is left).
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw IoError("close " + path + ": " + std::strerror(err), err);
  }
  return 8 + hlen + offset;
}

Reader::Reader(const std::string& path, Links links) : path_(path) {
  try {
    fd_ = open_regular_file(path, "safetensors file", &file_size_, links);
  } catch (const Error& e) {
    throw FormatError(std::string("safetensors ") + e.what());
  }
  try {
    if (file_size_ < 8) fail(path, "file of " + std::to_string(file_size_) + " bytes has no header length");
    unsigned char len_le[8];
    pread_all(fd_, len_le, 8, 0, path);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(len_le[i]) << (8 * i);
    if (hlen > kMaxHeader) fail(path, "header length " + std::to_string(hlen) + " is implausible");
    if (8 + hlen > file_size_)
      fail(path, "truncated: header of " + std::to_string(hlen) + " bytes but file has " +
                     std::to_string(file_size_));
    std::string text(hlen, '\0');
    pread_all(fd_, text.data(), hlen, 8, path);
    data_start_ = 8 + hlen;
    uint64_t buffer_size = file_size_ - data_start_;

    nlohmann::json header;
    try {
      json_read::Limits limits;
      limits.max_bytes = kMaxHeader;
      limits.max_depth = kMaxHeaderDepth;
      header = json_read::parse(text, "header", limits);
    } catch (const Error& e) {
      fail(path, e.what());
    }
    if (!header.is_object()) fail(path, "header is not a JSON object");
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const auto& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path, "__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail(path, "__metadata__." + m.key() + " is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        fail(path, "tensor " + name + " lacks dtype, shape or data_offsets");
      if (!v["dtype"].is_string()) fail(path, "tensor " + name + ": dtype is not a string");
      TensorInfo info;
      info.name = name;
      try {
        info.dtype = dtype_from_string(v["dtype"].get<std::string>());
      } catch (const FormatError& e) {
        fail(path, "tensor " + name + ": " + e.what());
      }
      if (!v["shape"].is_array()) fail(path, "tensor " + name + ": shape is not an array");
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned())
          fail(path, "tensor " + name + ": shape entries must be non-negative integers");
        uint64_t dim = d.get<uint64_t>();
        if (dim != 0 && numel > (uint64_t{1} << 62) / dim) fail(path, "tensor " + name + ": shape overflows");
        numel *= dim;
        info.shape.push_back(static_cast<int64_t>(dim));
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail(path, "tensor " + name + ": data_offsets must be two non-negative integers");
      info.begin = off[0].get<uint64_t>();
      info.end = off[1].get<uint64_t>();
      if (info.end < info.begin) fail(path, "tensor " + name + ": data_offsets end before begin");
      if (info.nbytes() != numel * dtype_size(info.dtype))
        fail(path, "tensor " + name + ": " + std::to_string(info.nbytes()) + " bytes for " +
                       dtype_to_string(info.dtype) + shape_str(info.shape));
      if (info.end > buffer_size)
        fail(path, "truncated: tensor " + name + " ends at byte " + std::to_string(info.end) + " of a " +
                       std::to_string(buffer_size) + "-byte buffer");
      tensors_.push_back(std::move(info));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // The buffer must be tiled exactly: no overlap (two tensors aliasing bytes) and no hole.
    uint64_t expect = 0;
    for (const auto& t : tensors_) {
      if (t.begin < expect) fail(path, "tensor " + t.name + " overlaps the previous tensor");
      if (t.begin > expect) fail(path, "hole in the byte buffer before tensor " + t.name);
      expect = t.end;
    }
    if (expect != buffer_size)
      fail(path, std::to_string(buffer_size - expect) + " trailing bytes after the last tensor");
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

Reader::Reader(Reader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(o.fd_),
      file_size_(o.file_size_),
      data_start_(o.data_start_),
      metadata_(std::move(o.metadata_)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)) {
  o.fd_ = -1;
}

Reader& Reader::operator=(Reader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    file_size_ = o.file_size_;
    data_start_ = o.data_start_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    o.fd_ = -1;
  }
  return *this;
}

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

const TensorInfo& Reader::info(const std::string& name) const {
  auto it = index_.find(name);
  TROUPE_CHECK(it != index_.end(), "safetensors ", path_, ": no tensor named ", name);
  return tensors_[it->second];
}

void Reader::read_bytes(const std::string& name, uint64_t offset, uint64_t nbytes, void* dst) const {
  const TensorInfo& t = info(name);
  TROUPE_CHECK(offset <= t.nbytes() && nbytes <= t.nbytes() - offset, "byte range [", offset, ", ",
               offset + nbytes, ") outside tensor ", name, " of ", t.nbytes(), " bytes");
  if (nbytes == 0) return;
  pread_all(fd_, dst, nbytes, data_start_ + t.begin + offset, path_);
}

Tensor Reader::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  read_bytes(name, 0, t.nbytes(), out.data());
  return out;
}

Tensor Reader::read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const {
  const TensorInfo& t = info(name);
  TROUPE_CHECK(!t.shape.empty(), "read_rows of 0-d tensor ", name);
  TROUPE_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= t.shape[0], "rows [", row_begin, ", ",
               row_end, ") out of range for ", name, shape_str(t.shape));
  Shape shape = t.shape;
  shape[0] = row_end - row_begin;
  uint64_t row_bytes = t.shape[0] == 0 ? 0 : t.nbytes() / static_cast<uint64_t>(t.shape[0]);
  Tensor out = Tensor::empty(shape, t.dtype);
  read_bytes(name, static_cast<uint64_t>(row_begin) * row_bytes, out.nbytes(), out.data());
  return out;
}

}  // namespace troupe::safetensors
