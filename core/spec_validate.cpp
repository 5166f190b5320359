// The schema walk: every mapping of the document is checked against the keys its table declares
// (spec_sections*.cpp), every value against its type and range (spec_values.cpp), then the rules
// that tie fields together. Nothing stops at the first problem; each one becomes a Diagnostic and
// the walk goes on, so a user fixes a file in one pass.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <map>
#include <stdexcept>

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

Loc loc_of(const YAML::Mark& m) {
  if (m.is_null() || m.line < 0 || m.column < 0) return Loc{};
  return Loc{m.line + 1, m.column + 1};
}

namespace {

void collect_keys(const Table& t, const std::string& path,
                  std::map<std::string, std::vector<std::string>>& out) {
  std::vector<std::string>& keys = out[path];
  for (const Field& f : t.fields) {
    keys.push_back(f.key);
    if (f.section) collect_keys(*f.section, child(path, f.key), out);
  }
}

}  // namespace

// Derived from the tables, so a key is known exactly when a reader is declared for it. Used for
// did-you-mean across sections too ("lr" under train belongs in train.optimizer).
const std::map<std::string, std::vector<std::string>>& schema() {
  static const std::map<std::string, std::vector<std::string>> s = [] {
    std::map<std::string, std::vector<std::string>> m;
    collect_keys(spec_table(), "", m);
    return m;
  }();
  return s;
}

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

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string fmt_real(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string short_real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string shown(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
  if (s.size() > 40) out += "...";
  return out;
}

bool is_quoted(const YAML::Node& n) { return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str"; }

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

bool Ctx::ok(const std::string& path) const {
  // A rejected section rejects everything under it.
  for (size_t e = 0;; ++e) {
    e = path.find('.', e);
    if (bad_.count(path.substr(0, e))) return false;
    if (e == std::string::npos) return true;
  }
}

std::map<std::string, SourcePos> Ctx::positions() const {
  std::map<std::string, SourcePos> out;
  for (const auto& [path, l] : where_) out.emplace(path, SourcePos{l.line, l.col});
  return out;
}

Loc Ctx::loc(std::string path) const {
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

namespace {

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

}  // namespace

Section::Section(Ctx& ctx, const YAML::Node& node, std::string path, Loc at)
    : ctx_(ctx), path_(std::move(path)), known_(&schema().at(path_)) {
  ctx_.set_loc(path_, at);
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    ctx_.error(at,
               (path_.empty() ? std::string("a job spec") : "'" + path_ + "'") +
                   " must be a mapping of keys, got " + describe(node),
               path_.empty() ? std::string("write it as 'key: value' lines, starting with 'name: my-job'")
                             : "put '" + path_.substr(path_.rfind('.') + 1) +
                                   ":' on its own line and its keys indented below it, e.g. '  " +
                                   known_->front() + ": ...'");
    ctx_.mark_bad(path_);
    valid_ = false;
    return;
  }
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
    if (std::find(known_->begin(), known_->end(), key) == known_->end()) {
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

Loc Section::key_loc(const std::string& key) const {
  auto it = entries_.find(key);
  return it != entries_.end() ? it->second.key : ctx_.loc(path_);
}

Section Section::sub(const std::string& key, bool required) {
  check_declared(key);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (required && valid_ && ctx_.ok(path_)) missing(key, "a '" + key + ":' section");
    return Section(ctx_, YAML::Node(YAML::NodeType::Undefined), child(path_, key), ctx_.loc(path_));
  }
  return Section(ctx_, it->second.value, child(path_, key), it->second.key);
}

void Section::missing(const std::string& key, const std::string& what) {
  ctx_.error(
      ctx_.loc(path_),
      "missing required key '" + child(path_, key) + "'" + (path_.empty() ? std::string() : " in " + path_),
      "add " + what);
  ctx_.mark_bad(child(path_, key));
}

void Section::refuse(const std::string& key, std::string message, std::string hint) {
  ctx_.error(key_loc(key), std::move(message), std::move(hint));
  ctx_.mark_bad(child(path_, key));
}

const YAML::Node* Section::value(const std::string& key, bool required, const std::string& what) {
  check_declared(key);
  if (!valid_ || !ctx_.ok(path_)) return nullptr;
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (required) missing(key, "'" + key + ": <" + what + ">'");
    return nullptr;
  }
  return &it->second.value;
}

void Section::check_declared(const std::string& key) const {
  if (std::find(known_->begin(), known_->end(), key) == known_->end())
    throw std::logic_error("spec reader asks for '" + child(path_, key) +
                           "', which its table does not declare");
}

namespace {

// A section's fields in table order, then its rules: the order in which values are checked is the
// order of the tables, which is the order diagnostics at one position come in.
void read_table(Section& s, const Table& t, JobSpec& spec) {
  for (const Field& f : t.fields) {
    if (f.section) {
      Section sub = s.sub(f.key, f.required);
      read_table(sub, *f.section, spec);
    } else {
      f.read(s, f.key, spec);
    }
  }
  if (t.rules) t.rules(s, spec);
}

}  // namespace

JobSpec build_spec(const YAML::Node& root_node, const std::string& file, std::vector<Diagnostic>& out) {
  Ctx ctx(file, out);
  JobSpec spec;
  spec.source_file = file;
  Section root(ctx, root_node, "", loc_of(root_node.Mark()));
  read_table(root, spec_table(), spec);
  spec.positions = ctx.positions();
  return spec;
}

}  // namespace troupe::spec_detail
