// model.rope_scaling: Llama 3.1's llama3 scaling in the spec, read, round-tripped and refused
// at the position of what is wrong.
#include <catch2/catch.hpp>
#include <string>

#include "core/spec.hpp"

using namespace troupe;

namespace {

// A llama spec whose model section ends with `model_line` (line 9).
std::string spec_with(const std::string& model_line) {
  return "name: r\nmodel:\n  type: llama\n  vocab_size: 256\n  seq_len: 16\n  d_model: 32\n  n_layers: 1\n"
         "  n_heads: 4\n" +
         model_line + "data: {source: synthetic}\ntrain: {steps: 1, global_batch: 2}\n";
}

std::vector<Diagnostic> errors_of(const std::string& text) {
  try {
    parse_spec(text, "job.yaml");
  } catch (const SpecError& e) {
    return e.diagnostics;
  }
  return {};
}

bool has_error(const std::vector<Diagnostic>& ds, int line, int col, const std::string& fragment) {
  for (const auto& d : ds)
    if (d.line == line && d.col == col && d.message.find(fragment) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("spec: model.rope_scaling llama3 is read, kept by to_yaml and reaches the model", "[core][spec]") {
  const JobSpec s =
      parse_spec(spec_with("  rope_scaling: {type: llama3, factor: 32, low_freq_factor: 1,\n"
                           "                 high_freq_factor: 4, original_max_position_embeddings: "
                           "8192}\n"),
                 "job.yaml");
  CHECK(s.model.rope_scaling.type == "llama3");
  CHECK(s.model.rope_scaling.factor == 32.0);
  CHECK(s.model.rope_scaling.low_freq_factor == 1.0);
  CHECK(s.model.rope_scaling.high_freq_factor == 4.0);
  CHECK(s.model.rope_scaling.original_max_position_embeddings == 8192);
  const JobSpec again = parse_spec(to_yaml(s), "again.yaml");
  CHECK(again == s);
  // Written empty: no scaling.
  CHECK(parse_spec(spec_with("  rope_scaling: {}\n"), "job.yaml").model.rope_scaling.type.empty());
  CHECK(parse_spec(spec_with(""), "job.yaml").model.rope_scaling.type.empty());
}

TEST_CASE("spec: a wrong model.rope_scaling is an error at its file position", "[core][spec]") {
  // Line 9 holds rope_scaling.
  auto other = errors_of(
      spec_with("  rope_scaling: {type: linear, factor: 2, low_freq_factor: 1, high_freq_factor: 4,\n"
                "                 original_max_position_embeddings: 64}\n"));
  CHECK(has_error(other, 9, 24, "unsupported value 'linear' for 'model.rope_scaling.type'"));
  auto missing = errors_of(spec_with("  rope_scaling: {type: llama3, factor: 8}\n"));
  CHECK(has_error(missing, 9, 3, "missing required key 'model.rope_scaling.low_freq_factor'"));
  CHECK(
      has_error(missing, 9, 3, "missing required key 'model.rope_scaling.original_max_position_embeddings'"));
  auto order = errors_of(
      spec_with("  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1,\n"
                "                 original_max_position_embeddings: 64}\n"));
  CHECK(has_error(order, 9, 81, "high_freq_factor (1) is not above low_freq_factor (4)"));
  auto small = errors_of(
      spec_with("  rope_scaling: {type: llama3, factor: 0.5, low_freq_factor: 1, high_freq_factor: 4,\n"
                "                 original_max_position_embeddings: 64}\n"));
  CHECK(has_error(small, 9, 40, "model.rope_scaling.factor"));
  auto unknown = errors_of(spec_with("  rope_scaling: {type: llama3, factr: 8}\n"));
  CHECK(has_error(unknown, 9, 32, "unknown key 'factr' in model.rope_scaling"));
  // Only a llama reads it.
  const std::string gpt =
      "name: r\nmodel:\n  type: gpt\n  vocab_size: 256\n  seq_len: 16\n  d_model: 32\n  n_layers: 1\n  "
      "n_heads: 4\n"
      "  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4,\n"
      "                 original_max_position_embeddings: 64}\n"
      "data: {source: synthetic}\ntrain: {steps: 1, global_batch: 2}\n";
  auto on_gpt = errors_of(gpt);
  REQUIRE(on_gpt.size() == 1);
  CHECK(has_error(on_gpt, 9, 3, "'model.rope_scaling' applies only to model.type llama"));
}
