// The hardware profiles compiled into the binary (configs/hardware/*.yaml; the source is
// generated at build time by plan/embed_hardware.cmake).
#pragma once

#include <string_view>
#include <vector>

namespace troupe::plan {

struct BuiltinHardwareFile {
  const char* name;       // the file name without .yaml: "h100-sxm"
  std::string_view text;  // the file's bytes
};
const std::vector<BuiltinHardwareFile>& builtin_hardware_files();

}  // namespace troupe::plan
