// Parameters <-> safetensors. A file holds tensors of GLOBAL shape under the parameter
// names; a stage (or a tensor-parallel shard) reads just the slice each Param holds,
// with byte-range reads, whatever layout wrote the file.
#pragma once

#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "model/params.hpp"

namespace troupe::model {

// Fills p.data with its slice (split_dim and p.slice_pieces(), local shape) of the file's
// tensor `p.name`, which must have shape p.global_shape. Reads only the bytes of the
// slice. F32 is read as is; BF16, F16 and F64 are converted to f32 (core/dtype_convert.hpp).
// The compute copy is the caller's to refresh (ParamStore::refresh_compute).
void load_param(const safetensors::Reader& file, Param& p);
void load_params(const safetensors::Reader& file, std::vector<Param>& params);

// Writes full (unsplit) parameters as one safetensors file: a PyTorch state_dict layout
// (names, shapes, F32) that torch / safetensors load directly. Slices are refused.
void save_params(const std::string& path, const std::vector<Param>& params,
                 const safetensors::Metadata& meta = {}, bool fsync = false);

}  // namespace troupe::model
