// Shared between the spec's translation units; not part of the public API.
#pragma once

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/spec.hpp"

namespace troupe::spec_detail {

// The YAML spellings of an enum, indexed by the enum's value.
template <class E>
struct EnumNames;
template <>
struct EnumNames<ModelType> {
  static constexpr const char* what = "model type";
  static constexpr std::string_view names[] = {"gpt", "mlp"};
};
template <>
struct EnumNames<DataSource> {
  static constexpr const char* what = "data source";
  static constexpr std::string_view names[] = {"text", "synthetic"};
};
template <>
struct EnumNames<Precision> {
  static constexpr const char* what = "precision";
  static constexpr std::string_view names[] = {"fp32", "bf16", "fp16"};
};
template <>
struct EnumNames<Recompute> {
  static constexpr const char* what = "recompute mode";
  static constexpr std::string_view names[] = {"none", "block"};
};
template <>
struct EnumNames<Schedule> {
  static constexpr const char* what = "pipeline schedule";
  static constexpr std::string_view names[] = {"gpipe", "1f1b", "interleaved"};
};
template <>
struct EnumNames<DeviceKind> {
  static constexpr const char* what = "device kind";
  static constexpr std::string_view names[] = {"cpu", "cuda"};
};
template <>
struct EnumNames<LrSchedule> {
  static constexpr const char* what = "learning-rate schedule";
  static constexpr std::string_view names[] = {"constant", "cosine", "linear"};
};

// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions): "lrr" -> "lr" is 1,
// "n_haeds" -> "n_heads" is 1.
size_t edit_distance(std::string_view a, std::string_view b);

// Validates a parsed document (its root already known to be a mapping) and builds the JobSpec.
// Problems are appended to `out`; the returned spec is meaningful only when none were added.
JobSpec build_spec(const YAML::Node& root, const std::string& file, std::vector<Diagnostic>& out);

}  // namespace troupe::spec_detail
