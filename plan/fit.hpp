// Whether a job can fit any device at all, before anything is allocated: the least memory one
// device needs for the model's parameter state under the most splitting the spec allows,
// against the largest device a hardware profile knows. `troupe validate`, `troupe run` and the
// coordinator's submit refuse a job that fits none (a d_model 65536 x 4096-layer model on one
// device needs petabytes; before, `run` found out in the allocator).
#pragma once

#include <string>

#include "core/spec.hpp"

namespace troupe::plan {

struct FitFloor {
  double params = 0;           // the model's parameters
  int pipeline = 1;            // the most pipeline stages the spec allows (its own, or n_layers for auto)
  int tensor = 1;              // the most tensor shards (its own, or 4096 for auto)
  int data = 1;                // the data-parallel degree ZeRO may shard over (its own, or 65536 for auto)
  double bytes_per_param = 0;  // weights, gradients and AdamW state on a device, after ZeRO and offload
  double bytes = 0;            // per device: params / (pipeline * tensor) * bytes_per_param
};
// A lower bound: no layout the spec allows puts less parameter state on its busiest device
// (activations, the process and the allocator come on top).
FitFloor fit_floor(const JobSpec& spec);

// The largest device memory among the hardware profiles troupe knows: the built-in ones, the
// calibrated ones in hardware_dir(), the one the spec names, and resources.memory_per_device.
// *name gets the profile's name.
uint64_t largest_known_memory(const JobSpec& spec, std::string* name);

// Throws SpecError naming the parameter count, the bytes per device and the largest device
// when fit_floor(spec).bytes exceeds it.
void require_fits_hardware(const JobSpec& spec);

}  // namespace troupe::plan
