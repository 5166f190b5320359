// Shared between the spec's translation units; not part of the public API.
#pragma once

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/spec.hpp"

namespace troupe::spec_detail {

// The YAML spellings of an enum, indexed by the enum's value.
template <class E>
struct EnumNames;
template <>
struct EnumNames<ModelType> {
  static constexpr const char* what = "model type";
  static constexpr std::string_view names[] = {"gpt", "mlp", "llama"};
};
template <>
struct EnumNames<DataSource> {
  static constexpr const char* what = "data source";
  static constexpr std::string_view names[] = {"text", "synthetic", "tokens"};
};
template <>
struct EnumNames<TokenDType> {
  static constexpr const char* what = "token dtype";
  static constexpr std::string_view names[] = {"uint16", "uint32"};
};
template <>
struct EnumNames<Precision> {
  static constexpr const char* what = "precision";
  static constexpr std::string_view names[] = {"fp32", "bf16", "fp16"};
};
template <>
struct EnumNames<Recompute> {
  static constexpr const char* what = "recompute mode";
  static constexpr std::string_view names[] = {"none", "selective", "full", "auto"};
};
template <>
struct EnumNames<Offload> {
  static constexpr const char* what = "offload";
  static constexpr std::string_view names[] = {"none", "optimizer"};
};
template <>
struct EnumNames<Schedule> {
  static constexpr const char* what = "pipeline schedule";
  static constexpr std::string_view names[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
};
template <>
struct EnumNames<DeviceKind> {
  static constexpr const char* what = "device kind";
  static constexpr std::string_view names[] = {"cpu", "cuda"};
};
template <>
struct EnumNames<Placement> {
  static constexpr const char* what = "placement";
  static constexpr std::string_view names[] = {"pack", "spread"};
};
template <>
struct EnumNames<LrSchedule> {
  static constexpr const char* what = "learning-rate schedule";
  static constexpr std::string_view names[] = {"constant", "cosine", "linear"};
};

// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions): "lrr" -> "lr" is 1,
// "n_haeds" -> "n_heads" is 1.
size_t edit_distance(std::string_view a, std::string_view b);

// ---- text for messages (spec_validate.cpp)

struct Loc {
  int line = 1, col = 1;  // 1-based
};
Loc loc_of(const YAML::Mark& m);

std::string join(const std::vector<std::string>& v, const char* sep = ", ");
// The dotted path of `key` in section `path` ("" is the root): child("train", "steps") = "train.steps".
std::string child(const std::string& path, const std::string& key);
// Shortest decimal that reads back to the same double ("0.0003", "1e-08").
std::string fmt_real(double v);
// Three significant digits, for suggestions in hints.
std::string short_real(double v);
// Shortens a user's value for quoting it back in a message.
std::string shown(const std::string& s);
bool is_quoted(const YAML::Node& n);
// What a node is, for "expected X, got Y".
std::string describe(const YAML::Node& n);

// ---- the walk's state: diagnostics, rejected values, positions

class Ctx {
 public:
  Ctx(const std::string& file, std::vector<Diagnostic>& out) : file_(file), out_(out) {}

  void error(Loc at, std::string message, std::string hint) {
    out_.push_back(Diagnostic{file_, at.line, at.col, std::move(message), std::move(hint)});
  }
  // A rejected or missing value: rules that use it stay quiet rather than pile on.
  void mark_bad(const std::string& path) { bad_.insert(path); }
  // False when `path` or a section above it was rejected.
  bool ok(const std::string& path) const;
  void set_loc(const std::string& path, Loc l) { where_[path] = l; }
  std::map<std::string, SourcePos> positions() const;
  // Whether `path` has a position: a key that was written, or a section the walk has entered.
  bool present(const std::string& path) const { return where_.count(path) > 0; }
  // The value's position, or the closest enclosing section's when the key was not written.
  Loc loc(std::string path) const;

 private:
  const std::string& file_;
  std::vector<Diagnostic>& out_;
  std::set<std::string> bad_;
  std::map<std::string, Loc> where_;
};

// ---- one mapping of the document

// Checks the mapping's keys against those its table declares on construction (unknown and
// duplicate keys, a value that is not a mapping), then hands out typed values (spec_values.cpp).
class Section {
 public:
  // `node` may be undefined (section absent: every key takes its default) or null (written but
  // empty, same meaning); anything else but a mapping is an error.
  Section(Ctx& ctx, const YAML::Node& node, std::string path, Loc at);

  Ctx& ctx() { return ctx_; }
  const std::string& path() const { return path_; }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }
  Loc key_loc(const std::string& key) const;

  // The nested section `key`; `required` reports it missing when it was not written.
  Section sub(const std::string& key, bool required = false);

  // Each getter leaves `out` at its default when the key is absent or its value is rejected.
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required = false,
               const std::string& range_hint = "");
  template <class T>
  void integer(const std::string& key, T& out, int64_t lo, int64_t hi, bool required = false,
               const std::string& range_hint = "") {
    int64_t x = static_cast<int64_t>(out);
    integer(key, x, lo, hi, required, range_hint);
    out = static_cast<T>(x);
  }
  void seed(const std::string& key, uint64_t& out);
  // A real number with `lo`/`hi` bounds, each inclusive or not ("lr > 0", "beta in [0, 1)").
  void real(const std::string& key, double& out, double lo, bool lo_incl, double hi, bool hi_incl,
            const std::string& hint = "");
  // A list of two numbers, each in [lo, hi), read into `a` and `b` (`betas: [0.9, 0.95]`, the
  // PyTorch and DeepSpeed spelling of beta1 and beta2); `names` say which is which in messages.
  void real_pair(const std::string& key, double& a, double& b, double lo, double hi,
                 const std::array<const char*, 2>& names, const std::string& hint);
  void boolean(const std::string& key, bool& out);
  // Any scalar is taken as text; `allow_empty` says whether "" is a meaningful value.
  void string(const std::string& key, std::string& out, bool required = false, bool allow_empty = true);
  template <class E>
  void enumeration(const std::string& key, E& out, bool required = false) {
    using N = EnumNames<E>;
    std::vector<std::string> valid(std::begin(N::names), std::end(N::names));
    size_t i = 0;
    if (enum_index(key, N::what, valid, std::is_same_v<E, Schedule>, required, i)) out = static_cast<E>(i);
  }
  // A text choice outside the enums (optimizer.type).
  void choice(const std::string& key, std::string& out, const std::vector<std::string>& valid);
  void duration(const std::string& key, std::chrono::milliseconds& out, bool allow_zero);
  void size(const std::string& key, uint64_t& out);
  // A parallel degree: a positive integer, or "auto" (stored as 0) for the planner to choose.
  void degree(const std::string& key, int& out, int64_t hi);
  // A hardware profile's name (plan/hardware.hpp): letters, digits, '.', '_', '-', at most 64;
  // never a path.
  void hardware_name(const std::string& key, std::string& out);
  // Whether `key` is written as the plain scalar `text` (an older spelling a reader accepts).
  bool scalar_is(const std::string& key, const char* text) const;

  void missing(const std::string& key, const std::string& what);
  // A key written where it does not apply (model.n_heads of an MLP): an error at the key, and the
  // value is not read.
  void refuse(const std::string& key, std::string message, std::string hint);

 private:
  struct Entry {
    YAML::Node value;
    Loc key;
  };

  // The written value of `key`, or nullptr when there is none to read (absent, or the section was
  // rejected); reports it missing when `required`.
  const YAML::Node* value(const std::string& key, bool required, const std::string& what);
  bool expect_plain_scalar(const std::string& key, const YAML::Node& v, const std::string& what);
  void reject(const std::string& key, std::string message, std::string hint);
  // The index of the value in `valid`; false (and an error) when it is none of them.
  bool enum_index(const std::string& key, const char* what, const std::vector<std::string>& valid,
                  bool is_schedule, bool required, size_t& index);
  // Readers may ask only for the keys their table declares, so that what is read is what is known.
  void check_declared(const std::string& key) const;

  Ctx& ctx_;
  std::string path_;
  const std::vector<std::string>* known_ = nullptr;
  bool valid_ = true;
  std::map<std::string, Entry> entries_;
};

// ---- the schema as data (spec_sections*.cpp)

// A mapping of the spec is a Table: its keys in order, each declared once with what reads it, so
// that the keys a section accepts (and suggests) are exactly the keys it reads.
struct Table;
struct Field {
  const char* key;
  // A value: reads and checks `key` of `s` into the spec. It may decline to read a key that does
  // not apply (model.n_heads of an MLP), but the key is still known.
  void (*read)(Section& s, const std::string& key, JobSpec& spec) = nullptr;
  // Or a nested section, read by its own table.
  const Table* section = nullptr;
  bool required = false;
};
struct Table {
  std::vector<Field> fields;  // read in this order; it is also the order hints list them in
  // The rules that tie this section's values to each other and to earlier sections' (d_model
  // divisible by n_heads); run after its fields.
  void (*rules)(Section& s, JobSpec& spec) = nullptr;
};

// The document's table: name, then the sections.
const Table& spec_table();

// Every key the tables declare, by section path ("" is the root, "train.optimizer" a nested
// section), in table order.
const std::map<std::string, std::vector<std::string>>& schema();

// Names other frameworks (PyTorch, DeepSpeed, Megatron, nanoGPT, HF) use for our keys, with the
// dotted path of ours ("learning_rate" -> "train.optimizer.lr").
const std::map<std::string, std::string>& synonyms();

// Validates a parsed document (its root already known to be a mapping) and builds the JobSpec.
// Problems are appended to `out`; the returned spec is meaningful only when none were added.
JobSpec build_spec(const YAML::Node& root, const std::string& file, std::vector<Diagnostic>& out);

}  // namespace troupe::spec_detail
