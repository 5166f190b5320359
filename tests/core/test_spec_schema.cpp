// The schema is the section tables: every key they declare is read and checked, every other key is
// refused with a did-you-mean, and the names borrowed from other frameworks point at declared keys.
#include <algorithm>
#include <catch2/catch.hpp>
#include <stdexcept>

#include "core/spec_internal.hpp"
#include "tests/core/minimal_spec.hpp"

using troupe::Diagnostic;
using troupe::SpecError;
namespace sd = troupe::spec_detail;

namespace {

const char* kMinimal = troupe::testing::kMinimalSpec;

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  for (size_t b = 0; !path.empty();) {
    size_t e = path.find('.', b);
    parts.push_back(path.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return parts;
}

// kMinimal with `key` of section `path` set to `value` (the section is created when absent).
std::string with_key(const std::string& path, const std::string& key, const YAML::Node& value) {
  YAML::Node root = YAML::Load(kMinimal);
  YAML::Node at = root;
  for (const auto& part : split_path(path)) {
    // A Node's operator= writes through to the node it refers to; reset() moves the handle.
    YAML::Node next = at[part];
    at.reset(next);
  }
  at[key] = value;
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::vector<Diagnostic> errors_of(const std::string& text) {
  try {
    troupe::parse_spec(text, "job.yaml");
  } catch (const SpecError& e) {
    return e.diagnostics;
  }
  return {};
}

std::string all_of(const std::vector<Diagnostic>& ds) {
  std::string s;
  for (const auto& d : ds) s += d.str() + "\n";
  return s;
}

bool is_section(const std::string& path) { return sd::schema().count(path) > 0; }

}  // namespace

TEST_CASE("schema: the tables declare every section of the spec, with its keys in order", "[core][spec]") {
  const auto& s = sd::schema();
  CHECK(s.at("") == std::vector<std::string>{"name", "model", "data", "train", "parallel", "resources",
                                             "checkpoint", "fault", "elastic"});
  CHECK(s.count("train.optimizer") == 1);
  // The order is the one hints list keys in.
  CHECK(s.at("data") ==
        std::vector<std::string>{"source", "path", "val_fraction", "dtype", "val_path", "eot", "tokenizer"});
  CHECK(s.at("model") == std::vector<std::string>{"type", "vocab_size", "seq_len", "d_model", "n_layers",
                                                  "n_heads", "n_kv_heads", "ffn_hidden", "norm_eps",
                                                  "rope_theta", "rope_scaling", "tie_embeddings",
                                                  "init_from"});
  CHECK(s.at("model.rope_scaling") == std::vector<std::string>{"type", "factor", "low_freq_factor",
                                                               "high_freq_factor",
                                                               "original_max_position_embeddings"});
  for (const auto& [path, keys] : s) {
    INFO("section '" << path << "'");
    CHECK_FALSE(keys.empty());
    for (size_t i = 0; i < keys.size(); ++i)
      for (size_t j = i + 1; j < keys.size(); ++j) CHECK(keys[i] != keys[j]);
  }
}

TEST_CASE("schema: every key a table declares is accepted and read", "[core][spec]") {
  REQUIRE(errors_of(kMinimal).empty());
  const YAML::Node not_a_value = YAML::Load("{not_a_value: 1}");
  size_t keys = 0;
  for (const auto& [path, section_keys] : sd::schema()) {
    for (const auto& key : section_keys) {
      const std::string dotted = sd::child(path, key);
      INFO("key '" << dotted << "'");
      // No getter takes a mapping, and a section is refused as a number: either way the message
      // names the key, which shows that it was known and then read.
      const std::string text = with_key(path, key, is_section(dotted) ? YAML::Node(3) : not_a_value);
      const auto ds = errors_of(text);
      INFO("spec:\n" << text << "diagnostics:\n" << all_of(ds));
      CHECK(all_of(ds).find("unknown key") == std::string::npos);
      bool named = false;
      for (const auto& d : ds) named |= d.message.find("'" + dotted + "'") != std::string::npos;
      CHECK(named);
      ++keys;
    }
  }
  CHECK(keys >= 50);
}

TEST_CASE("schema: a made-up key in every section is refused with a suggestion", "[core][spec]") {
  for (const auto& [path, section_keys] : sd::schema()) {
    INFO("section '" << path << "'");
    const std::string where = path.empty() ? "at the top level" : "in " + path;

    const std::string typo = section_keys.front() + "x";
    auto ds = errors_of(with_key(path, typo, YAML::Node(1)));
    REQUIRE(ds.size() == 1);
    CHECK(ds[0].message == "unknown key '" + typo + "' " + where);
    CHECK(ds[0].hint == "did you mean '" + section_keys.front() + "'?");

    ds = errors_of(with_key(path, "qqq_not_a_key", YAML::Node(1)));
    REQUIRE(ds.size() == 1);
    CHECK(ds[0].message == "unknown key 'qqq_not_a_key' " + where);
    std::string listed;
    for (const auto& k : section_keys) listed += (listed.empty() ? "" : ", ") + k;
    CHECK(ds[0].hint == "known keys " + where + ": " + listed);
  }
}

TEST_CASE("schema: a key of another section is pointed to where it belongs", "[core][spec]") {
  // "keep" is only a checkpoint key, "heartbeat" only a fault key.
  auto ds = errors_of(with_key("train", "keep", YAML::Node(2)));
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].hint == "'keep' belongs in checkpoint: did you mean 'checkpoint.keep'?");
  ds = errors_of(with_key("model", "heartbeat", YAML::Node("1s")));
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].hint == "'heartbeat' belongs in fault: did you mean 'fault.heartbeat'?");
}

TEST_CASE("schema: every name borrowed from another framework points at a declared key", "[core][spec]") {
  for (const auto& [name, target] : sd::synonyms()) {
    INFO(name << " -> " << target);
    const size_t dot = target.rfind('.');
    REQUIRE(dot != std::string::npos);
    const std::string section = target.substr(0, dot), leaf = target.substr(dot + 1);
    REQUIRE(sd::schema().count(section) == 1);
    const auto& keys = sd::schema().at(section);
    CHECK(std::find(keys.begin(), keys.end(), leaf) != keys.end());
    CHECK_FALSE(is_section(target));
  }
}

TEST_CASE("schema: diagnostics at one position come in table order", "[core][spec]") {
  // An empty model section misses its required keys, all reported at the section's key.
  const auto ds = errors_of(
      "name: x\nmodel: {}\ndata:\n  source: synthetic\ntrain:\n  steps: 1\n"
      "  global_batch: 1\n");
  std::vector<std::string> got;
  for (const auto& d : ds) {
    CHECK(d.line == 2);
    got.push_back(d.message);
  }
  CHECK(got == std::vector<std::string>{"missing required key 'model.type' in model",
                                        "missing required key 'model.seq_len' in model",
                                        "missing required key 'model.d_model' in model",
                                        "missing required key 'model.n_layers' in model"});
}

TEST_CASE("schema: a reader may read only the keys its table declares", "[core][spec]") {
  std::vector<Diagnostic> out;
  const std::string file = "job.yaml";
  sd::Ctx ctx(file, out);
  sd::Section model(ctx, YAML::Load("type: gpt"), "model", sd::Loc{});
  int x = 0;
  CHECK_NOTHROW(model.integer("seq_len", x, 1, 10));
  CHECK_THROWS_AS(model.integer("sequence_length", x, 1, 10), std::logic_error);
  CHECK_THROWS_AS(model.sub("layers"), std::logic_error);
  CHECK(out.empty());
}
