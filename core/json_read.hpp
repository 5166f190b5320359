// The one JSON reader for text that comes from outside: manifests, traces, tokenizers,
// Hugging Face configs, safetensors headers, API requests and replies.
//
// nlohmann's parser is iterative, but what is built from its result is not: copying,
// comparing or dumping a value recurses once per level, so a manifest nested a million
// levels deep overflowed the stack long after parsing "succeeded"; and a DOM node costs
// 16 to 100 bytes, so 20 MB of '[' took 1.7 GB. Every text read here is therefore
//
//   * bounded in size before a byte is parsed (Limits::max_bytes);
//   * bounded in depth while it is parsed, without recursion: the events stop at the
//     first '[' or '{' past Limits::max_depth;
//   * bounded in memory: the value being built is charged what its nodes cost and refused
//     past Limits::memory_factor times its text (plus 1 MiB);
//   * strict: one value, valid UTF-8, finite numbers, no key twice in one object (each key
//     costs one ordered-map lookup, so a document is parsed in O(n log n) of its keys).
//
// A refusal is a troupe::Error "<where>: <what>", e.g.
//   "runs/a/ckpt/step_000020/manifest.json: JSON nested deeper than 64 levels (at byte 65)".
//
// Large documents that need not be held whole (a rank's trace) are read as events: a
// Handler sees each value in document order, and a DomBuilder can collect one part of it
// (one trace event) under the same budget.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/hostile_file.hpp"

namespace troupe::json_read {

struct Limits {
  uint64_t max_bytes = uint64_t(16) << 20;  // the text
  int max_depth = 64;                       // objects and arrays, one inside another
  // A DOM built from the text may take this many times the text's bytes (plus 1 MiB): a
  // manifest or a config takes 4 to 10, a text of nothing but "[]" or "{}" over 20.
  uint64_t memory_factor = 24;
};

// Parses `text` into a value. Throws troupe::Error "<where>: ..." for any text that is
// not one JSON value within the limits.
nlohmann::json parse(std::string_view text, const std::string& where, const Limits& limits = {});

// The same for a file, read as read_regular_file reads it (a regular file, opened without
// blocking, at most limits.max_bytes): "<path>: ..." on any failure.
nlohmann::json read_file(const std::string& path, const char* what, const Limits& limits = {},
                         Links links = Links::follow);

// The events of one JSON text, in document order, for a reader that keeps only what it needs.
// Each returns false to stop the reading, after calling fail() with the reason. `depth` is the
// nesting of the value the event belongs to (0 for the top-level value).
class Handler {
 public:
  virtual ~Handler() = default;
  virtual bool value(nlohmann::json&& scalar, int depth) = 0;  // null, bool, number or string
  virtual bool begin(bool object, int depth) = 0;              // '{' or '[' of a value at depth
  virtual bool key(std::string&& key, int depth) = 0;          // a key of the object at depth - 1
  virtual bool end(bool object, int depth) = 0;
  // The reason for the last `false`; the reader throws it as "<where>: <reason>".
  void fail(std::string why) { error_ = std::move(why); }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

// Reads `text` into `handler` within `limits` (depth, size, strictness; memory is the
// handler's to bound). Throws troupe::Error "<where>: ..." when the text is refused or the
// handler stops.
void read_events(std::string_view text, const std::string& where, const Limits& limits, Handler& handler);

// A Handler that builds one value, charging each node what it costs and refusing past
// `budget` bytes; refuses a key twice in one object. Feed it the events of one value (the
// whole document, or one part of one), then take() it.
class DomBuilder : public Handler {
 public:
  explicit DomBuilder(uint64_t budget) : budget_(budget) {}
  bool value(nlohmann::json&& scalar, int depth) override;
  bool begin(bool object, int depth) override;
  bool key(std::string&& key, int depth) override;
  bool end(bool object, int depth) override;
  bool done() const { return done_; }  // a whole value has arrived
  // The value built; the builder is empty again (its charge stays: one budget per builder).
  nlohmann::json take();
  uint64_t charged() const { return charged_; }

 private:
  bool charge(uint64_t bytes);
  bool place(nlohmann::json&& v, bool container);

  uint64_t budget_, charged_ = 0;
  nlohmann::json root_;
  std::vector<nlohmann::json*> stack_;  // open containers, innermost last
  std::string pending_key_;
  bool done_ = false;
};

// The memory a DOM of `text_bytes` of text may take under `limits`.
uint64_t dom_budget(uint64_t text_bytes, const Limits& limits);

}  // namespace troupe::json_read
