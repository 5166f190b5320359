#include "model/param_io.hpp"

#include "core/error.hpp"

namespace troupe::model {

void load_param(const safetensors::Reader& file, Param& p) {
  const safetensors::TensorInfo& info = file.info(p.name);
  TROUPE_CHECK(info.dtype == DType::f32, file.path(), ": ", p.name, " is ", dtype_name(info.dtype),
               ", want f32");
  TROUPE_CHECK(info.shape == p.global_shape, file.path(), ": ", p.name, " has shape ", shape_str(info.shape),
               ", the model wants ", shape_str(p.global_shape));
  char* dst = static_cast<char*>(p.data.data());
  if (p.split_dim < 0) {
    file.read_bytes(p.name, 0, info.nbytes(), dst);
    return;
  }
  // Each piece [offset, offset + length) of dim d: `outer` runs of `length*inner`
  // contiguous floats, landing at local index piece.local_offset of the same dim.
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
    const uint64_t run = static_cast<uint64_t>(q.length) * inner * sizeof(float);
    for (uint64_t o = 0; o < outer; ++o)
      file.read_bytes(p.name, (o * G + static_cast<uint64_t>(q.offset)) * inner * sizeof(float), run,
                      dst + ((o * local + static_cast<uint64_t>(q.local_offset)) * inner) * sizeof(float));
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
