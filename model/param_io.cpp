#include "model/param_io.hpp"

#include "core/dtype_convert.hpp"
#include "core/error.hpp"

namespace troupe::model {

void load_param(const safetensors::Reader& file, Param& p) {
  const safetensors::TensorInfo& info = file.info(p.name);
  TROUPE_CHECK(is_floating(info.dtype), file.path(), ": ", p.name, " is ", dtype_name(info.dtype),
               "; parameters load from f32, or from bf16, f16 or f64 converted to f32");
  TROUPE_CHECK(info.shape == p.global_shape, file.path(), ": ", p.name, " has shape ", shape_str(info.shape),
               ", the model wants ", shape_str(p.global_shape));
  float* dst = p.data.f32();
  const uint64_t esz = dtype_size(info.dtype);
  std::vector<char> staging;
  // n elements from element `first` of the stored tensor into out, converted to f32.
  auto read_run = [&](uint64_t first, uint64_t n, float* out) {
    if (info.dtype == DType::f32) return file.read_bytes(p.name, first * esz, n * esz, out);
    staging.resize(n * esz);
    file.read_bytes(p.name, first * esz, n * esz, staging.data());
    convert(info.dtype, staging.data(), DType::f32, out, n);
  };
  if (p.split_dim < 0) {
    read_run(0, static_cast<uint64_t>(shape_numel(info.shape)), dst);
    return;
  }
  // Each piece [offset, offset + length) of dim d: `outer` runs of `length*inner`
  // contiguous elements, landing at local index piece.local_offset of the same dim.
  const size_t d = static_cast<size_t>(p.split_dim);
  TROUPE_CHECK(d < p.global_shape.size() && p.data.ndim() == static_cast<int>(p.global_shape.size()), p.name,
               ": split_dim out of range");
  uint64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= static_cast<uint64_t>(p.global_shape[i]);
  for (size_t i = d + 1; i < p.global_shape.size(); ++i) inner *= static_cast<uint64_t>(p.global_shape[i]);
  const uint64_t G = static_cast<uint64_t>(p.global_shape[d]);
  const uint64_t local = static_cast<uint64_t>(p.data.shape()[d]);
  for (const SlicePiece& q : p.slice_pieces()) {
    TROUPE_CHECK(q.offset >= 0 && q.length >= 0 && static_cast<uint64_t>(q.offset + q.length) <= G &&
                     static_cast<uint64_t>(q.local_offset + q.length) <= local,
                 p.name, ": piece [", q.offset, ", ", q.offset + q.length, ") at local ", q.local_offset,
                 " outside ", shape_str(p.global_shape), " / local ", shape_str(p.data.shape()));
    const uint64_t run = static_cast<uint64_t>(q.length) * inner;
    for (uint64_t o = 0; o < outer; ++o)
      read_run((o * G + static_cast<uint64_t>(q.offset)) * inner, run,
               dst + (o * local + static_cast<uint64_t>(q.local_offset)) * inner);
  }
}

void load_params(const safetensors::Reader& file, std::vector<Param>& params) {
  for (Param& p : params) load_param(file, p);
}

void save_params(const std::string& path, const std::vector<Param>& params, const safetensors::Metadata& meta,
                 bool fsync) {
  std::vector<safetensors::WriteEntry> entries;
  for (const Param& p : params) {
    TROUPE_CHECK(p.data.shape() == p.global_shape, "save_params writes whole parameters; ", p.name,
                 " is a slice ", shape_str(p.data.shape()), " of ", shape_str(p.global_shape));
    entries.push_back(safetensors::entry(p.name, p.data));
  }
  safetensors::write(path, entries, meta, {fsync});
}

}  // namespace troupe::model
