// The schema walk: every mapping of the document is checked against its known keys, every value
// against its type and range, then the rules that tie fields together. Nothing stops at the first
// problem; each one becomes a Diagnostic and the walk goes on, so a user fixes a file in one pass.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/spec_internal.hpp"

namespace troupe::spec_detail {

size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  // Keys and values are short; a pathological one (the file may hold a 1 MiB key) is simply "far".
  if (n > 64 || m > 64) return std::max(n, m);
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

namespace {

struct Loc {
  int line = 1, col = 1;  // 1-based
};

Loc loc_of(const YAML::Mark& m) {
  if (m.is_null() || m.line < 0 || m.column < 0) return Loc{};
  return Loc{m.line + 1, m.column + 1};
}

// Every key the schema knows, by section path ("" is the root). Used for did-you-mean across
// sections ("lr" under train belongs in train.optimizer).
const std::map<std::string, std::vector<std::string>>& schema() {
  static const std::map<std::string, std::vector<std::string>> s = {
      {"", {"name", "model", "data", "train", "parallel", "resources", "checkpoint", "fault", "elastic"}},
      {"model", {"type", "vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "init_from"}},
      {"data", {"source", "path", "val_fraction"}},
      {"train",
       {"steps", "global_batch", "micro_batch", "optimizer", "lr_schedule", "warmup_steps", "min_lr",
        "grad_clip", "precision", "recompute", "seed", "eval_every", "eval_batches", "log_every"}},
      {"train.optimizer", {"type", "lr", "beta1", "beta2", "betas", "eps", "weight_decay"}},
      {"parallel", {"data", "pipeline", "tensor", "schedule", "virtual_stages"}},
      {"resources", {"device", "threads_per_worker", "memory_per_device"}},
      {"checkpoint", {"dir", "every", "keep", "async"}},
      {"fault", {"max_restarts", "heartbeat", "step_timeout"}},
      {"elastic", {"min_devices", "max_devices"}},
  };
  return s;
}

// Names other frameworks (PyTorch, DeepSpeed, Megatron, nanoGPT, HF) use for our keys.
const std::map<std::string, std::string>& synonyms() {
  static const std::map<std::string, std::string> s = {
      {"learning_rate", "train.optimizer.lr"},
      {"weight-decay", "train.optimizer.weight_decay"},
      {"wd", "train.optimizer.weight_decay"},
      {"epsilon", "train.optimizer.eps"},
      {"adam_eps", "train.optimizer.eps"},
      {"adam_beta1", "train.optimizer.beta1"},
      {"adam_beta2", "train.optimizer.beta2"},
      {"batch_size", "train.global_batch"},
      {"train_batch_size", "train.global_batch"},
      {"micro_batch_size", "train.micro_batch"},
      {"train_micro_batch_size_per_gpu", "train.micro_batch"},
      {"max_steps", "train.steps"},
      {"max_iters", "train.steps"},
      {"iters", "train.steps"},
      {"num_steps", "train.steps"},
      {"train_iters", "train.steps"},
      {"warmup", "train.warmup_steps"},
      {"warmup_iters", "train.warmup_steps"},
      {"lr_warmup_iters", "train.warmup_steps"},
      {"grad_clip_norm", "train.grad_clip"},
      {"max_grad_norm", "train.grad_clip"},
      {"gradient_clipping", "train.grad_clip"},
      {"clip_grad", "train.grad_clip"},
      {"dtype", "train.precision"},
      {"mixed_precision", "train.precision"},
      {"activation_checkpointing", "train.recompute"},
      {"gradient_checkpointing", "train.recompute"},
      {"scheduler", "train.lr_schedule"},
      {"lr_scheduler", "train.lr_schedule"},
      {"eval_interval", "train.eval_every"},
      {"eval_iters", "train.eval_batches"},
      {"log_interval", "train.log_every"},
      {"n_embd", "model.d_model"},
      {"hidden_size", "model.d_model"},
      {"dim", "model.d_model"},
      {"n_layer", "model.n_layers"},
      {"num_layers", "model.n_layers"},
      {"layers", "model.n_layers"},
      {"n_head", "model.n_heads"},
      {"num_heads", "model.n_heads"},
      {"num_attention_heads", "model.n_heads"},
      {"block_size", "model.seq_len"},
      {"context_length", "model.seq_len"},
      {"max_position_embeddings", "model.seq_len"},
      {"seq_length", "model.seq_len"},
      {"vocab", "model.vocab_size"},
      {"checkpoint_dir", "checkpoint.dir"},
      {"save_interval", "checkpoint.every"},
      {"dp", "parallel.data"},
      {"pp", "parallel.pipeline"},
      {"tp", "parallel.tensor"},
      {"data_parallel_size", "parallel.data"},
      {"pipeline_model_parallel_size", "parallel.pipeline"},
      {"tensor_model_parallel_size", "parallel.tensor"},
      {"virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
      {"threads", "resources.threads_per_worker"},
      {"num_threads", "resources.threads_per_worker"},
      {"memory", "resources.memory_per_device"},
      {"dataset", "data.path"},
  };
  return s;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// Shortest decimal that reads back to the same double ("0.0003", "1e-08").
std::string fmt_real(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// Three significant digits, for suggestions in hints.
std::string short_real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Shortens a user's value for quoting it back in a message.
std::string shown(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
  if (s.size() > 40) out += "...";
  return out;
}

bool is_quoted(const YAML::Node& n) { return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str"; }

bool is_bool_word(const std::string& s) {
  static const std::set<std::string> w = {"true", "True", "TRUE", "false", "False", "FALSE",
                                          "yes",  "Yes",  "YES",  "no",    "No",    "NO",
                                          "on",   "On",   "ON",   "off",   "Off",   "OFF"};
  return w.count(s) > 0;
}

// What a node is, for "expected X, got Y".
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing (an empty value)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (is_quoted(n)) return "the string \"" + shown(s) + "\"";
      if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE")
        return "the boolean " + s;
      return "'" + shown(s) + "'";
    }
    default:
      return "an undefined value";
  }
}

// A plain decimal integer: optional sign, digits, nothing else.
enum class IntParse { ok, not_integer, looks_fractional, overflow };
IntParse parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return IntParse::not_integer;
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
  if (i == s.size()) return IntParse::not_integer;
  bool digits_only = true;
  for (size_t j = i; j < s.size(); ++j) digits_only &= (s[j] >= '0' && s[j] <= '9');
  if (!digits_only) {
    double d;
    const char* b = s.data() + (s[0] == '+' ? 1 : 0);
    auto r = std::from_chars(b, s.data() + s.size(), d);
    if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return IntParse::looks_fractional;
    return IntParse::not_integer;
  }
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  auto r = std::from_chars(b, s.data() + s.size(), out);
  if (r.ec == std::errc::result_out_of_range) return IntParse::overflow;
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return IntParse::not_integer;
  return IntParse::ok;
}

bool parse_real(std::string s, double& out) {
  if (s.empty()) return false;
  if (s[0] == '+') s.erase(0, 1);
  if (s.size() >= 2 && s[0] == '.' && s[1] >= '0' && s[1] <= '9') s.insert(0, "0");
  if (s.size() >= 3 && s[0] == '-' && s[1] == '.') s.insert(1, "0");
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

class Ctx {
 public:
  Ctx(const std::string& file, std::vector<Diagnostic>& out) : file_(file), out_(out) {}

  void error(Loc at, std::string message, std::string hint) {
    out_.push_back(Diagnostic{file_, at.line, at.col, std::move(message), std::move(hint)});
  }
  // A rejected or missing value: rules that use it stay quiet rather than pile on.
  void mark_bad(const std::string& path) { bad_.insert(path); }
  bool ok(const std::string& path) const {
    // A rejected section rejects everything under it.
    for (size_t e = 0;; ++e) {
      e = path.find('.', e);
      if (bad_.count(path.substr(0, e))) return false;
      if (e == std::string::npos) return true;
    }
  }
  void set_loc(const std::string& path, Loc l) { where_[path] = l; }
  std::map<std::string, SourcePos> positions() const {
    std::map<std::string, SourcePos> out;
    for (const auto& [path, l] : where_) out.emplace(path, SourcePos{l.line, l.col});
    return out;
  }
  bool present(const std::string& path) const { return where_.count(path) > 0; }
  // The value's position, or the closest enclosing section's when the key was not written.
  Loc loc(std::string path) const {
    for (;;) {
      auto it = where_.find(path);
      if (it != where_.end()) return it->second;
      size_t dot = path.rfind('.');
      if (dot == std::string::npos) {
        auto root = where_.find("");
        return root != where_.end() ? root->second : Loc{};
      }
      path.resize(dot);
    }
  }

 private:
  const std::string& file_;
  std::vector<Diagnostic>& out_;
  std::set<std::string> bad_;
  std::map<std::string, Loc> where_;
};

std::string suggest_key(const std::string& section, const std::string& key) {
  const auto& known = schema().at(section);
  auto syn = synonyms().find(key);
  if (syn != synonyms().end()) {
    const std::string& target = syn->second;
    std::string sec = target.substr(0, target.rfind('.'));
    std::string leaf = target.substr(target.rfind('.') + 1);
    if (sec == section) return "did you mean '" + leaf + "'?";
    return "did you mean '" + target + "'? (it belongs in " + sec + ")";
  }
  std::string lower = key;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : known) {
    size_t d = edit_distance(lower, k);
    if (d < best_d) best_d = d, best = k;
  }
  size_t limit = std::max<size_t>(1, std::min(key.size(), best.size()) / 3);
  if (best_d <= limit) return "did you mean '" + best + "'?";
  for (const auto& [sec, keys] : schema()) {
    if (sec == section) continue;
    for (const auto& k : keys)
      if (k == lower && !schema().count(child(sec, k)))
        return "'" + k + "' belongs in " + (sec.empty() ? "the top level" : sec) + ": did you mean '" +
               child(sec, k) + "'?";
  }
  return "known keys " + std::string(section.empty() ? "at the top level" : "in " + section) + ": " +
         join(known);
}

// One mapping of the document: checks its keys on construction, then hands out typed values.
class Section {
 public:
  // `node` may be undefined (section absent: every key takes its default) or null (written but
  // empty, same meaning); anything else but a mapping is an error.
  Section(Ctx& ctx, const YAML::Node& node, std::string path, Loc at) : ctx_(ctx), path_(std::move(path)) {
    ctx_.set_loc(path_, at);
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsMap()) {
      ctx_.error(at,
                 (path_.empty() ? std::string("a job spec") : "'" + path_ + "'") +
                     " must be a mapping of keys, got " + describe(node),
                 path_.empty() ? std::string("write it as 'key: value' lines, starting with 'name: my-job'")
                               : "put '" + path_.substr(path_.rfind('.') + 1) +
                                     ":' on its own line and its keys indented below it, e.g. '  " +
                                     schema().at(path_).front() + ": ...'");
      ctx_.mark_bad(path_);
      valid_ = false;
      return;
    }
    const auto& known = schema().at(path_);
    std::map<std::string, Loc> seen;
    for (const auto& kv : node) {
      const YAML::Node& k = kv.first;
      Loc kl = loc_of(k.Mark());
      if (!k.IsScalar()) {
        ctx_.error(kl, "a key must be a plain name, got " + describe(k),
                   "write keys as plain words, e.g. 'steps: 100'");
        continue;
      }
      const std::string& key = k.Scalar();
      auto prev = seen.find(key);
      if (prev != seen.end()) {
        ctx_.error(kl,
                   "duplicate key '" + child(path_, key) + "' (first given at line " +
                       std::to_string(prev->second.line) + ")",
                   "a key may appear once in a mapping; delete one of the two");
        ctx_.mark_bad(child(path_, key));
        continue;
      }
      seen.emplace(key, kl);
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        ctx_.error(kl,
                   "unknown key '" + shown(key) + "' " +
                       (path_.empty() ? std::string("at the top level") : "in " + path_),
                   suggest_key(path_, key));
        continue;
      }
      entries_[key] = Entry{kv.second, kl};
      const YAML::Node& v = kv.second;
      // A value on the next line (or none at all) has its mark there; the key is where users look.
      ctx_.set_loc(child(path_, key), v.IsNull() || v.IsMap() || v.IsSequence() ? kl : loc_of(v.Mark()));
    }
  }

  const std::string& path() const { return path_; }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }
  Loc key_loc(const std::string& key) const {
    auto it = entries_.find(key);
    return it != entries_.end() ? it->second.key : ctx_.loc(path_);
  }

  Section sub(const std::string& key, bool required = false) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (required && valid_ && ctx_.ok(path_)) missing(key, "a '" + key + ":' section");
      return Section(ctx_, YAML::Node(YAML::NodeType::Undefined), child(path_, key), ctx_.loc(path_));
    }
    return Section(ctx_, it->second.value, child(path_, key), it->second.key);
  }

  // Each getter leaves `out` at its default when the key is absent or its value is rejected.
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required = false,
               const std::string& range_hint = "") {
    const YAML::Node* v = value(key, required, "an integer");
    if (!v) return;
    if (!expect_plain_scalar(key, *v, "an integer")) return;
    int64_t x = 0;
    switch (parse_int(v->Scalar(), x)) {
      case IntParse::ok:
        break;
      case IntParse::looks_fractional:
        return reject(key, "'" + child(path_, key) + "' must be a whole number, got " + shown(v->Scalar()),
                      "write it without a fraction or exponent, e.g. " + whole_hint(v->Scalar()));
      case IntParse::overflow:
        return reject(key, "'" + child(path_, key) + "' is out of range: " + shown(v->Scalar()),
                      range_text(lo, hi));
      case IntParse::not_integer:
        return reject(key, "'" + child(path_, key) + "' must be an integer, got " + describe(*v),
                      range_text(lo, hi));
    }
    if (x < lo || x > hi)
      return reject(key, "'" + child(path_, key) + "' is out of range: " + std::to_string(x),
                    range_hint.empty() ? range_text(lo, hi) : range_hint);
    out = x;
  }
  template <class T>
  void integer(const std::string& key, T& out, int64_t lo, int64_t hi, bool required = false,
               const std::string& range_hint = "") {
    int64_t x = static_cast<int64_t>(out);
    integer(key, x, lo, hi, required, range_hint);
    out = static_cast<T>(x);
  }

  void seed(const std::string& key, uint64_t& out) {
    const YAML::Node* v = value(key, false, "an integer");
    if (!v || !expect_plain_scalar(key, *v, "an integer")) return;
    const std::string& s = v->Scalar();
    bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    uint64_t x = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (!digits || r.ec != std::errc() || r.ptr != s.data() + s.size())
      return reject(key, "'" + child(path_, key) + "' must be an integer in [0, 2^64), got " + describe(*v),
                    "any whole number from 0 to 18446744073709551615, e.g. 0 or 1234");
    out = x;
  }

  // A real number with `lo`/`hi` bounds, each inclusive or not ("lr > 0", "beta in [0, 1)").
  void real(const std::string& key, double& out, double lo, bool lo_incl, double hi, bool hi_incl,
            const std::string& hint = "") {
    const YAML::Node* v = value(key, false, "a number");
    if (!v || !expect_plain_scalar(key, *v, "a number")) return;
    double x = 0;
    if (!parse_real(v->Scalar(), x))
      return reject(key, "'" + child(path_, key) + "' must be a number, got " + describe(*v),
                    hint.empty() ? interval_text(lo, lo_incl, hi, hi_incl) : hint);
    bool in = std::isfinite(x) && (lo_incl ? x >= lo : x > lo) && (hi_incl ? x <= hi : x < hi);
    if (!in)
      return reject(key,
                    "'" + child(path_, key) + "' is out of range: " + shown(v->Scalar()) + " is not in " +
                        interval_text(lo, lo_incl, hi, hi_incl),
                    hint.empty() ? "give a value in " + interval_text(lo, lo_incl, hi, hi_incl) : hint);
    out = x;
  }

  // A list of two numbers, each in [lo, hi), read into `a` and `b` (`betas: [0.9, 0.95]`, the
  // PyTorch and DeepSpeed spelling of beta1 and beta2); `names` say which is which in messages.
  void real_pair(const std::string& key, double& a, double& b, double lo, double hi,
                 const std::array<const char*, 2>& names, const std::string& hint) {
    const YAML::Node* v = value(key, false, "a list of two numbers");
    if (!v) return;
    const std::string what = "'" + child(path_, key) + "'";
    if (!v->IsSequence() || v->size() != 2)
      return reject(key,
                    what + " must be a list of two numbers, got " +
                        (v->IsSequence() ? "a list of " + std::to_string(v->size()) : describe(*v)),
                    hint);
    double x[2] = {0, 0};
    bool good = true;
    for (size_t i = 0; i < 2; ++i) {
      const YAML::Node e = (*v)[i];
      const Loc at = loc_of(e.Mark());
      if (!e.IsScalar() || is_quoted(e) || !parse_real(e.Scalar(), x[i])) {
        ctx_.error(at, what + " must be two numbers, but its " + names[i] + " is " + describe(e), hint);
        good = false;
      } else if (!std::isfinite(x[i]) || x[i] < lo || x[i] >= hi) {
        ctx_.error(at,
                   what + " is out of range: " + names[i] + " " + shown(e.Scalar()) + " is not in " +
                       interval_text(lo, true, hi, false),
                   hint);
        good = false;
      }
    }
    if (!good) return ctx_.mark_bad(child(path_, key));
    a = x[0];
    b = x[1];
  }

  void boolean(const std::string& key, bool& out) {
    const YAML::Node* v = value(key, false, "true or false");
    if (!v || !expect_plain_scalar(key, *v, "true or false")) return;
    const std::string& s = v->Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return void(out = true);
    if (s == "false" || s == "False" || s == "FALSE") return void(out = false);
    reject(key, "'" + child(path_, key) + "' must be true or false, got " + describe(*v),
           is_bool_word(s) ? "YAML 1.2 reads only true/false as booleans; write true or false"
                           : "write true or false");
  }

  // Any scalar is taken as text; `allow_empty` says whether "" is a meaningful value.
  void string(const std::string& key, std::string& out, bool required = false, bool allow_empty = true) {
    const YAML::Node* v = value(key, required, "a string");
    if (!v) return;
    if (!v->IsScalar())
      return reject(key, "'" + child(path_, key) + "' must be a string, got " + describe(*v),
                    "write a single value on the key's line, quoted if it contains ':' or '#'");
    if (!allow_empty && v->Scalar().empty())
      return reject(key, "'" + child(path_, key) + "' must not be empty", "give a value or delete the key");
    out = v->Scalar();
  }

  template <class E>
  void enumeration(const std::string& key, E& out, bool required = false) {
    using N = EnumNames<E>;
    std::vector<std::string> valid(std::begin(N::names), std::end(N::names));
    const YAML::Node* v = value(key, required, "one of " + join(valid));
    if (!v) return;
    if (!v->IsScalar())
      return reject(key,
                    "'" + child(path_, key) + "' must be one of " + join(valid) + ", got " + describe(*v),
                    "write one of: " + join(valid));
    const std::string& s = v->Scalar();
    for (size_t i = 0; i < valid.size(); ++i)
      if (s == valid[i]) return void(out = static_cast<E>(i));
    std::string hint = "valid values: " + join(valid);
    std::string lower = s;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const auto& name : valid) {
      size_t d = edit_distance(lower, name);
      if (d <= std::max<size_t>(1, name.size() / 3)) {
        hint = "did you mean '" + name + "'? valid values: " + join(valid);
        break;
      }
    }
    if (std::is_same_v<E, Schedule> && (lower == "one_f_one_b" || lower == "1f-1b" || lower == "pipedream"))
      hint = "did you mean '1f1b'? valid values: " + join(valid);
    reject(key, "unknown " + std::string(N::what) + " '" + shown(s) + "' for '" + child(path_, key) + "'",
           hint);
  }

  // A text choice outside the enums (optimizer.type).
  void choice(const std::string& key, std::string& out, const std::vector<std::string>& valid) {
    const YAML::Node* v = value(key, false, "one of " + join(valid));
    if (!v) return;
    if (v->IsScalar() && std::find(valid.begin(), valid.end(), v->Scalar()) != valid.end())
      return void(out = v->Scalar());
    reject(key, "unsupported value " + describe(*v) + " for '" + child(path_, key) + "'",
           "valid values: " + join(valid));
  }

  void duration(const std::string& key, std::chrono::milliseconds& out, bool allow_zero) {
    const YAML::Node* v = value(key, false, "a duration");
    if (!v) return;
    std::optional<std::chrono::milliseconds> d;
    if (v->IsScalar()) d = parse_duration(v->Scalar());
    if (!d)
      return reject(key, "'" + child(path_, key) + "' must be a duration, got " + describe(*v),
                    "write a number with a unit: 500ms, 30s, 2m, 1h (a plain number is seconds)");
    if (!allow_zero && d->count() == 0)
      return reject(key, "'" + child(path_, key) + "' must be longer than 0", "e.g. 1s");
    out = *d;
  }

  void size(const std::string& key, uint64_t& out) {
    const YAML::Node* v = value(key, false, "a size");
    if (!v) return;
    std::optional<uint64_t> s;
    if (v->IsScalar()) s = parse_size(v->Scalar());
    if (!s)
      return reject(key, "'" + child(path_, key) + "' must be a size in bytes, got " + describe(*v),
                    "write bytes or a number with a unit: 4096, 512MiB, 16GiB, 1.5GB");
    out = *s;
  }

  // A parallel degree: a positive integer, or "auto" (stored as 0) for the planner to choose.
  void degree(const std::string& key, int& out, int64_t hi) {
    const YAML::Node* v = value(key, false, "a positive integer or auto");
    if (!v) return;
    if (v->IsScalar() && v->Scalar() == "auto") return void(out = 0);
    int64_t x = 0;
    if (!v->IsScalar() || is_quoted(*v) || parse_int(v->Scalar(), x) != IntParse::ok || x < 1 || x > hi)
      return reject(key,
                    "'" + child(path_, key) + "' must be a positive integer or auto, got " + describe(*v),
                    "e.g. " + key + ": 2, or " + key + ": auto to let the planner choose");
    out = static_cast<int>(x);
  }

  void missing(const std::string& key, const std::string& what) {
    ctx_.error(
        ctx_.loc(path_),
        "missing required key '" + child(path_, key) + "'" + (path_.empty() ? std::string() : " in " + path_),
        "add " + what);
    ctx_.mark_bad(child(path_, key));
  }

 private:
  struct Entry {
    YAML::Node value;
    Loc key;
  };

  const YAML::Node* value(const std::string& key, bool required, const std::string& what) {
    if (!valid_ || !ctx_.ok(path_)) return nullptr;
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (required) missing(key, "'" + key + ": <" + what + ">'");
      return nullptr;
    }
    return &it->second.value;
  }

  bool expect_plain_scalar(const std::string& key, const YAML::Node& v, const std::string& what) {
    if (v.IsScalar() && !is_quoted(v)) return true;
    std::string hint = "write " + what + " on the key's line";
    if (v.IsScalar()) hint = "remove the quotes: a quoted value is a string";
    if (v.IsNull()) hint = "give a value, or delete the key to use the default";
    reject(key, "'" + child(path_, key) + "' must be " + what + ", got " + describe(v), hint);
    return false;
  }

  void reject(const std::string& key, std::string message, std::string hint) {
    ctx_.error(ctx_.loc(child(path_, key)), std::move(message), std::move(hint));
    ctx_.mark_bad(child(path_, key));
  }

  static std::string range_text(int64_t lo, int64_t hi) {
    if (hi == std::numeric_limits<int64_t>::max()) return "valid values: " + std::to_string(lo) + " or more";
    return "valid range: " + std::to_string(lo) + " to " + std::to_string(hi);
  }
  static std::string interval_text(double lo, bool lo_incl, double hi, bool hi_incl) {
    std::string h = std::isinf(hi) ? "inf" : fmt_real(hi);
    return std::string(lo_incl ? "[" : "(") + fmt_real(lo) + ", " + h +
           (hi_incl && !std::isinf(hi) ? "]" : ")");
  }
  static std::string whole_hint(const std::string& s) {
    double d = 0;
    if (parse_real(s, d) && std::isfinite(d) && std::fabs(d) < 9e15) {
      std::ostringstream os;
      os << static_cast<int64_t>(std::llround(d));
      return os.str();
    }
    return "100";
  }

  Ctx& ctx_;
  std::string path_;
  bool valid_ = true;
  std::map<std::string, Entry> entries_;
};

// Divisors of n nearest to `near`, to suggest a value that satisfies a divisibility rule.
std::string nearby_divisors(int64_t n, int64_t near, int64_t min = 1) {
  std::vector<int64_t> ds;
  for (int64_t d = 1; d * d <= n && d < 1000000; ++d)
    if (n % d == 0) {
      if (d >= min) ds.push_back(d);
      if (n / d >= min) ds.push_back(n / d);
    }
  if (ds.empty())
    return "none: no divisor of " + std::to_string(n) + " is " + std::to_string(min) + " or more";
  std::sort(ds.begin(), ds.end());
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  std::sort(ds.begin(), ds.end(), [&](int64_t a, int64_t b) {
    return std::llabs(a - near) < std::llabs(b - near) ||
           (std::llabs(a - near) == std::llabs(b - near) && a < b);
  });
  if (ds.size() > 3) ds.resize(3);
  std::sort(ds.begin(), ds.end());
  std::string s;
  for (size_t i = 0; i < ds.size(); ++i)
    s += (i ? (i + 1 == ds.size() ? " or " : ", ") : "") + std::to_string(ds[i]);
  return s;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

}  // namespace

JobSpec build_spec(const YAML::Node& root_node, const std::string& file, std::vector<Diagnostic>& out) {
  Ctx ctx(file, out);
  JobSpec spec;
  spec.source_file = file;
  Section root(ctx, root_node, "", loc_of(root_node.Mark()));

  root.string("name", spec.name, true);
  if (ctx.present("name") && ctx.ok("name") && !valid_name(spec.name))
    ctx.error(ctx.loc("name"), "job name '" + shown(spec.name) + "' is not a valid name",
              "use 1-64 letters, digits, '-', '_' or '.', not starting with '-' or '.'; it names the run "
              "directory");

  // ---- model
  ModelSpec& m = spec.model;
  Section model = root.sub("model", true);
  model.enumeration("type", m.type, true);
  model.integer("vocab_size", m.vocab_size, 2, 1 << 24);
  model.integer("seq_len", m.seq_len, 1, 1 << 20, true);
  model.integer("d_model", m.d_model, 1, 1 << 16, true);
  model.integer("n_layers", m.n_layers, 1, 4096, true);
  const bool gpt = ctx.ok("model.type") && m.type == ModelType::gpt;
  if (ctx.ok("model.type") && m.type == ModelType::mlp) {
    if (model.has("n_heads")) {
      ctx.error(model.key_loc("n_heads"), "'model.n_heads' applies only to model.type gpt",
                "delete it (an MLP has no attention heads), or set model.type: gpt");
      ctx.mark_bad("model.n_heads");
    }
  } else {
    model.integer("n_heads", m.n_heads, 1, 1 << 16, gpt);
  }
  model.string("init_from", m.init_from);
  if (gpt && ctx.ok("model.d_model") && ctx.ok("model.n_heads") && m.n_heads > 0 &&
      m.d_model % m.n_heads != 0)
    ctx.error(
        ctx.loc("model.n_heads"),
        "model.d_model (" + std::to_string(m.d_model) + ") is not divisible by model.n_heads (" +
            std::to_string(m.n_heads) + ")",
        "each head gets d_model / n_heads channels; e.g. n_heads: " + nearby_divisors(m.d_model, m.n_heads));

  // ---- data
  DataSpec& d = spec.data;
  Section data = root.sub("data", true);
  data.enumeration("source", d.source);
  data.real("val_fraction", d.val_fraction, 0.0, true, 1.0, false,
            "the share of the data held out for evaluation, in [0, 1); e.g. 0.05");
  if (ctx.ok("data") && ctx.ok("data.source")) {
    if (d.source == DataSource::text) {
      if (ctx.present("data")) data.string("path", d.path, true, false);
    } else if (data.has("path")) {
      ctx.error(data.key_loc("path"), "'data.path' is read only when data.source is text",
                "delete it, or set data.source: text");
      ctx.mark_bad("data.path");
    }
  }

  // ---- train
  TrainSpec& t = spec.train;
  Section train = root.sub("train", true);
  train.integer("steps", t.steps, 1, kI64Max, true, "train.steps must be 1 or more");
  train.integer("global_batch", t.global_batch, 1, 1 << 24, true);
  bool micro_auto = false;
  {
    // micro_batch: a positive integer or auto; absent means global_batch / data (known below).
    int micro = -1;
    train.degree("micro_batch", micro, 1 << 24);
    if (micro == 0) micro_auto = true;
    if (micro > 0) t.micro_batch = micro;
  }
  Section opt = train.sub("optimizer");
  OptimizerSpec& o = t.optimizer;
  opt.choice("type", o.type, {"adamw"});
  opt.real("lr", o.lr, 0.0, false, 10.0, true, "a learning rate > 0; AdamW typically uses 1e-4 to 3e-3");
  opt.real("beta1", o.beta1, 0.0, true, 1.0, false, "beta1 is in [0, 1); PyTorch's default is 0.9");
  opt.real("beta2", o.beta2, 0.0, true, 1.0, false,
           "beta2 is in [0, 1); GPT training uses 0.95, PyTorch 0.999");
  opt.real_pair(
      "betas", o.beta1, o.beta2, 0.0, 1.0, {"beta1", "beta2"},
      "betas is [beta1, beta2], each in [0, 1); GPT training uses [0.9, 0.95], PyTorch [0.9, 0.999]");
  if (opt.has("betas") && (opt.has("beta1") || opt.has("beta2"))) {
    const std::string both = opt.has("beta1") && opt.has("beta2") ? "'beta1' and 'beta2'"
                             : opt.has("beta1")                   ? "'beta1'"
                                                                  : "'beta2'";
    ctx.error(
        ctx.loc("train.optimizer.betas"),
        "'train.optimizer.betas' is given together with " + both + ": both spellings set the same values",
        "keep one spelling: delete betas, or delete " + both + " and write betas: [beta1, beta2]");
    ctx.mark_bad("train.optimizer.betas");
  }
  opt.real("eps", o.eps, 0.0, false, 1.0, true, "eps is > 0; the usual value is 1e-8");
  opt.real("weight_decay", o.weight_decay, 0.0, true, 1e9, true, "weight_decay is >= 0, e.g. 0.1 (0 = off)");
  train.enumeration("lr_schedule", t.lr_schedule);
  train.integer("warmup_steps", t.warmup_steps, 0, kI64Max);
  train.real("min_lr", t.min_lr, 0.0, true, 10.0, true, "min_lr is >= 0 and at most the optimizer's lr");
  train.real("grad_clip", t.grad_clip, 0.0, true, 1e12, true,
             "grad_clip is a max L2 norm >= 0 (0 = off), e.g. 1.0");
  train.enumeration("precision", t.precision);
  train.enumeration("recompute", t.recompute);
  train.seed("seed", t.seed);
  train.integer("eval_every", t.eval_every, 0, kI64Max, false,
                "eval_every is 0 (off) or a step interval >= 1");
  train.integer("eval_batches", t.eval_batches, 1, 1 << 20);
  train.integer("log_every", t.log_every, 1, kI64Max);

  if (ctx.ok("train.steps") && ctx.ok("train.warmup_steps") && t.warmup_steps > t.steps)
    ctx.error(ctx.loc("train.warmup_steps"),
              "train.warmup_steps (" + std::to_string(t.warmup_steps) + ") is longer than train.steps (" +
                  std::to_string(t.steps) + ")",
              "warm-up is part of the run; use warmup_steps <= steps");
  if (ctx.ok("train.min_lr") && ctx.ok("train.optimizer.lr") && t.min_lr > o.lr)
    ctx.error(
        ctx.loc("train.min_lr"),
        "train.min_lr (" + fmt_real(t.min_lr) + ") is above train.optimizer.lr (" + fmt_real(o.lr) + ")",
        "the schedule decays from lr down to min_lr; e.g. min_lr: " + short_real(o.lr / 10));
  if (ctx.ok("train.global_batch") && ctx.ok("train.micro_batch") && t.micro_batch > t.global_batch)
    ctx.error(ctx.loc("train.micro_batch"),
              "train.micro_batch (" + std::to_string(t.micro_batch) +
                  ") is larger than train.global_batch (" + std::to_string(t.global_batch) + ")",
              "a micro-batch is a slice of the global batch; use micro_batch <= global_batch");
  if (ctx.ok("train.eval_every") && t.eval_every > 0 && ctx.ok("data.val_fraction") &&
      ctx.ok("data.source") && d.source == DataSource::text && d.val_fraction == 0)
    ctx.error(ctx.loc("train.eval_every"), "train.eval_every is set but data.val_fraction is 0",
              "evaluation reads the held-out split; set data.val_fraction (e.g. 0.05) or eval_every: 0");

  // ---- parallel
  ParallelSpec& p = spec.parallel;
  Section par = root.sub("parallel");
  par.degree("data", p.data, 65536);
  par.degree("pipeline", p.pipeline, 4096);
  par.degree("tensor", p.tensor, 4096);
  par.enumeration("schedule", p.schedule);
  par.integer("virtual_stages", p.virtual_stages, 1, 1024);

  const bool tp_ok = ctx.ok("parallel.tensor") && p.tensor > 0;
  if (tp_ok && gpt && ctx.ok("model.n_heads") && m.n_heads > 0 && m.n_heads % p.tensor != 0)
    ctx.error(
        ctx.loc("parallel.tensor"),
        "model.n_heads (" + std::to_string(m.n_heads) + ") is not divisible by parallel.tensor (" +
            std::to_string(p.tensor) + ")",
        "tensor parallelism splits attention by heads; e.g. tensor: " + nearby_divisors(m.n_heads, p.tensor));
  if (tp_ok && ctx.ok("model.d_model") && m.d_model > 0 && m.d_model % p.tensor != 0)
    ctx.error(
        ctx.loc("parallel.tensor"),
        "model.d_model (" + std::to_string(m.d_model) + ") is not divisible by parallel.tensor (" +
            std::to_string(p.tensor) + ")",
        "tensor parallelism splits the model's width; e.g. tensor: " + nearby_divisors(m.d_model, p.tensor));

  const bool dp_ok = ctx.ok("parallel.data") && p.data > 0;
  if (dp_ok && ctx.ok("train.global_batch") && ctx.ok("train.micro_batch") && t.global_batch > 0) {
    if (train.has("micro_batch") && !micro_auto) {
      int64_t per_step = int64_t(p.data) * t.micro_batch;
      if (t.global_batch % per_step != 0)
        ctx.error(
            ctx.loc("train.micro_batch"),
            "train.global_batch (" + std::to_string(t.global_batch) +
                ") is not divisible by parallel.data x train.micro_batch (" + std::to_string(p.data) + " x " +
                std::to_string(t.micro_batch) + " = " + std::to_string(per_step) + ")",
            "each data-parallel rank runs a whole number of micro-batches per step; e.g. micro_batch: " +
                nearby_divisors(t.global_batch / std::max(1, p.data), t.micro_batch));
    } else if (!micro_auto) {
      if (t.global_batch % p.data != 0)
        ctx.error(ctx.loc("train.global_batch"),
                  "train.global_batch (" + std::to_string(t.global_batch) +
                      ") is not divisible by parallel.data (" + std::to_string(p.data) + ")",
                  "every data-parallel rank takes an equal share; use a global_batch that is a multiple of " +
                      std::to_string(p.data));
      else
        t.micro_batch = t.global_batch / p.data;
    }
  }

  const bool vs_ok = ctx.ok("parallel.virtual_stages");
  const bool sched_ok = ctx.ok("parallel.schedule");
  const bool pp_ok = ctx.ok("parallel.pipeline") && p.pipeline > 0;
  if (sched_ok && vs_ok && p.schedule == Schedule::interleaved && p.virtual_stages < 2)
    ctx.error(ctx.loc("parallel.schedule"), "schedule interleaved needs parallel.virtual_stages of 2 or more",
              "set parallel.virtual_stages: 2 (model chunks per pipeline rank), or use schedule: 1f1b");
  if (sched_ok && pp_ok && p.schedule == Schedule::interleaved && p.pipeline < 2)
    ctx.error(ctx.loc("parallel.schedule"), "schedule interleaved needs parallel.pipeline of 2 or more",
              "interleaving spreads model chunks over pipeline ranks; set pipeline: 2 or use schedule: 1f1b");
  if (sched_ok && vs_ok && p.schedule != Schedule::interleaved && p.virtual_stages > 1)
    ctx.error(ctx.loc("parallel.virtual_stages"),
              "parallel.virtual_stages " + std::to_string(p.virtual_stages) + " needs schedule interleaved",
              "set parallel.schedule: interleaved, or virtual_stages: 1");
  if (pp_ok && vs_ok && ctx.ok("model.n_layers") && m.n_layers > 0) {
    int64_t chunks = int64_t(p.pipeline) * p.virtual_stages;
    if (m.n_layers < chunks)
      ctx.error(ctx.loc("parallel.pipeline"),
                "model.n_layers (" + std::to_string(m.n_layers) + ") is fewer than the " +
                    std::to_string(chunks) + " pipeline stages (pipeline x virtual_stages = " +
                    std::to_string(p.pipeline) + " x " + std::to_string(p.virtual_stages) + ")",
                "every stage needs at least one layer; lower parallel.pipeline or raise model.n_layers");
    else if (sched_ok && p.schedule == Schedule::interleaved && p.virtual_stages > 1 &&
             m.n_layers % chunks != 0)
      ctx.error(ctx.loc("parallel.virtual_stages"),
                "model.n_layers (" + std::to_string(m.n_layers) +
                    ") is not divisible by pipeline x virtual_stages (" + std::to_string(chunks) + ")",
                "the interleaved schedule gives every model chunk the same number of layers; e.g. "
                "virtual_stages: " +
                    nearby_divisors(m.n_layers / std::max(1, p.pipeline), p.virtual_stages, 2));
  }

  // ---- resources
  ResourcesSpec& r = spec.resources;
  Section res = root.sub("resources");
  res.enumeration("device", r.device);
  res.integer("threads_per_worker", r.threads_per_worker, 1, 1024);
  res.size("memory_per_device", r.memory_per_device);

  // ---- checkpoint
  CheckpointSpec& c = spec.checkpoint;
  Section ck = root.sub("checkpoint");
  ck.string("dir", c.dir);
  ck.integer("every", c.every, 0, kI64Max, false, "checkpoint.every is 0 (off) or a step interval >= 1");
  ck.integer("keep", c.keep, 1, 1 << 20, false, "checkpoint.keep is how many checkpoints to keep, 1 or more");
  ck.boolean("async", c.async);

  // ---- fault
  FaultSpec& f = spec.fault;
  Section fault = root.sub("fault");
  fault.integer("max_restarts", f.max_restarts, 0, 1 << 20);
  fault.duration("heartbeat", f.heartbeat, false);
  fault.duration("step_timeout", f.step_timeout, true);

  // ---- elastic
  ElasticSpec& e = spec.elastic;
  Section el = root.sub("elastic");
  el.integer("min_devices", e.min_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
  el.integer("max_devices", e.max_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
  const bool min_ok = ctx.ok("elastic.min_devices") && e.min_devices > 0;
  const bool max_ok = ctx.ok("elastic.max_devices") && e.max_devices > 0;
  if (min_ok && max_ok && e.min_devices > e.max_devices)
    ctx.error(ctx.loc("elastic.min_devices"),
              "elastic.min_devices (" + std::to_string(e.min_devices) + ") is above elastic.max_devices (" +
                  std::to_string(e.max_devices) + ")",
              "min_devices <= max_devices");
  if (ctx.ok("parallel.data") && ctx.ok("parallel.pipeline") && ctx.ok("parallel.tensor")) {
    if (auto n = layout_devices(p)) {
      std::string layout =
          std::to_string(p.data) + "x" + std::to_string(p.pipeline) + "x" + std::to_string(p.tensor);
      if (min_ok && *n < e.min_devices)
        ctx.error(ctx.loc("elastic.min_devices"),
                  "the layout " + layout + " uses " + std::to_string(*n) +
                      " devices, fewer than elastic.min_devices (" + std::to_string(e.min_devices) + ")",
                  "data x pipeline x tensor must lie within [min_devices, max_devices]");
      if (max_ok && *n > e.max_devices)
        ctx.error(ctx.loc("elastic.max_devices"),
                  "the layout " + layout + " uses " + std::to_string(*n) +
                      " devices, more than elastic.max_devices (" + std::to_string(e.max_devices) + ")",
                  "data x pipeline x tensor must lie within [min_devices, max_devices]");
    }
  }
  spec.positions = ctx.positions();
  return spec;
}

}  // namespace troupe::spec_detail
