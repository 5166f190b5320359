// safetensors files (https://github.com/huggingface/safetensors, format only):
//
//   u64 little-endian N | N bytes of JSON header, padded with spaces to a multiple of 8 |
//   byte buffer
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)}
// (offsets relative to the byte buffer) and may hold "__metadata__": a string->string map.
// The reader validates the whole header up front (offsets inside the buffer, sizes that
// match dtype x shape, no overlaps or holes, no truncation) and then reads single tensors,
// rows of a tensor or any byte range with pread, never the whole file: a checkpoint
// loader reads only the slices its shard needs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/tensor.hpp"

namespace troupe::safetensors {

// A malformed, truncated or inconsistent file; what() names the file and the problem.
class FormatError : public Error {
 public:
  using Error::Error;
};

// "F32", "F64", "BF16", "F16", "I32", "I64", "U8" <-> DType.
const char* dtype_to_string(DType dt);
DType dtype_from_string(const std::string& s);  // throws FormatError on unknown names

using Metadata = std::map<std::string, std::string>;

// One tensor to write: raw bytes of dtype x shape (row-major, contiguous).
struct WriteEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;
};
WriteEntry entry(std::string name, const Tensor& t);

struct WriteOptions {
  bool fsync = false;  // fsync the file before returning (durable checkpoints)
};

// Writes `entries` in the given order (names must be unique, "__metadata__" is reserved).
// Returns the file size in bytes. Throws troupe::Error on I/O failure.
uint64_t write(const std::string& path, const std::vector<WriteEntry>& entries, const Metadata& metadata = {},
               const WriteOptions& options = {});

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the byte buffer
  uint64_t nbytes() const { return end - begin; }
};

class Reader {
 public:
  // Opens and validates; throws FormatError. The file is opened as a regular file only (a FIFO
  // is refused, never waited on), and with Links::refuse never through a symbolic link (a
  // checkpoint's shards); its header goes through core/json_read's limits.
  explicit Reader(const std::string& path, Links links = Links::follow);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&& other) noexcept;

  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return metadata_; }
  // Names in file (offset) order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  uint64_t data_start() const { return data_start_; }  // absolute file offset of the byte buffer
  uint64_t file_size() const { return file_size_; }

  // Whole tensor into a new CPU tensor.
  Tensor read(const std::string& name) const;
  // Rows [row_begin, row_end) along dim 0 into a new tensor of shape (rows, ...).
  Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  // `nbytes` bytes starting `offset` bytes into the tensor's data, into dst.
  void read_bytes(const std::string& name, uint64_t offset, uint64_t nbytes, void* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, data_start_ = 0;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;  // sorted by begin
  std::map<std::string, size_t> index_;
};

}  // namespace troupe::safetensors
