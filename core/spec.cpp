// Reading a spec file: the file-level checks (size, text, YAML syntax, alias and depth limits)
// come first, then the schema walk of spec_validate.cpp; to_yaml writes the resolved spec back.
#include "core/spec.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/spec_internal.hpp"

namespace troupe {

std::string Diagnostic::str() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line) + ":" + std::to_string(col);
  s += ": error: " + message;
  if (!hint.empty()) s += "\n  hint: " + hint;
  return s;
}

SpecError::SpecError(std::vector<Diagnostic> d) : diagnostics(std::move(d)) {}

const char* SpecError::what() const noexcept {
  if (what_.empty()) {
    for (const auto& d : diagnostics) what_ += d.str() + "\n";
    if (what_.empty()) what_ = "invalid job spec";
  }
  return what_.c_str();
}

template <class E>
static const char* enum_name(E v) {
  auto i = static_cast<size_t>(v);
  const auto& names = spec_detail::EnumNames<E>::names;
  return i < std::size(names) ? names[i].data() : "?";
}
const char* to_string(ModelType v) { return enum_name(v); }
const char* to_string(DataSource v) { return enum_name(v); }
const char* to_string(TokenDType v) { return enum_name(v); }
const char* to_string(Precision v) { return enum_name(v); }
DType compute_dtype(Precision v) {
  switch (v) {
    case Precision::bf16:
      return DType::bf16;
    case Precision::fp16:
      return DType::f16;
    case Precision::fp32:
      break;
  }
  return DType::f32;
}
const char* to_string(Recompute v) { return enum_name(v); }
const char* to_string(Offload v) { return enum_name(v); }
const char* to_string(Schedule v) { return enum_name(v); }
const char* to_string(DeviceKind v) { return enum_name(v); }
const char* to_string(Placement v) { return enum_name(v); }
const char* to_string(LrSchedule v) { return enum_name(v); }

Layout layout_of(const ParallelSpec& p) {
  auto degree = [](int d) { return d > 0 ? d : 1; };
  return {degree(p.data), degree(p.pipeline), degree(p.tensor)};
}

std::optional<int> layout_devices(const ParallelSpec& p) {
  if (p.data <= 0 || p.pipeline <= 0 || p.tensor <= 0) return std::nullopt;
  int64_t n = int64_t(p.data) * p.pipeline * p.tensor;
  if (n > INT32_MAX) return std::nullopt;
  return static_cast<int>(n);
}

bool operator==(const ModelSpec& a, const ModelSpec& b) {
  return a.type == b.type && a.vocab_size == b.vocab_size && a.seq_len == b.seq_len &&
         a.d_model == b.d_model && a.n_layers == b.n_layers && a.n_heads == b.n_heads &&
         a.n_kv_heads == b.n_kv_heads && a.ffn_hidden == b.ffn_hidden && a.norm_eps == b.norm_eps &&
         a.rope_theta == b.rope_theta && a.rope_scaling.type == b.rope_scaling.type &&
         a.rope_scaling.factor == b.rope_scaling.factor &&
         a.rope_scaling.low_freq_factor == b.rope_scaling.low_freq_factor &&
         a.rope_scaling.high_freq_factor == b.rope_scaling.high_freq_factor &&
         a.rope_scaling.original_max_position_embeddings == b.rope_scaling.original_max_position_embeddings &&
         a.tie_embeddings == b.tie_embeddings && a.init_from == b.init_from;
}
bool operator==(const DataSpec& a, const DataSpec& b) {
  return a.source == b.source && a.path == b.path && a.val_fraction == b.val_fraction && a.dtype == b.dtype &&
         a.val_path == b.val_path && a.eot == b.eot && a.tokenizer == b.tokenizer;
}
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b) {
  return a.type == b.type && a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay;
}
bool operator==(const TrainSpec& a, const TrainSpec& b) {
  return a.steps == b.steps && a.global_batch == b.global_batch && a.micro_batch == b.micro_batch &&
         a.optimizer == b.optimizer && a.lr_schedule == b.lr_schedule && a.warmup_steps == b.warmup_steps &&
         a.min_lr == b.min_lr && a.grad_clip == b.grad_clip && a.precision == b.precision &&
         a.recompute == b.recompute && a.offload == b.offload && a.zero == b.zero &&
         a.trace.from_step == b.trace.from_step && a.trace.steps == b.trace.steps && a.seed == b.seed &&
         a.eval_every == b.eval_every && a.eval_batches == b.eval_batches && a.log_every == b.log_every;
}
bool operator==(const ParallelSpec& a, const ParallelSpec& b) {
  return a.data == b.data && a.pipeline == b.pipeline && a.tensor == b.tensor && a.schedule == b.schedule &&
         a.virtual_stages == b.virtual_stages && a.sequence_parallel == b.sequence_parallel;
}
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b) {
  return a.device == b.device && a.threads_per_worker == b.threads_per_worker &&
         a.memory_per_device == b.memory_per_device && a.hardware == b.hardware && a.spares == b.spares &&
         a.placement == b.placement;
}
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b) {
  return a.dir == b.dir && a.every == b.every && a.keep == b.keep && a.async == b.async &&
         a.memory_every == b.memory_every;
}
bool operator==(const FaultSpec& a, const FaultSpec& b) {
  return a.max_restarts == b.max_restarts && a.heartbeat == b.heartbeat && a.step_timeout == b.step_timeout;
}
bool operator==(const ElasticSpec& a, const ElasticSpec& b) {
  return a.min_devices == b.min_devices && a.max_devices == b.max_devices;
}
bool operator==(const JobSpec& a, const JobSpec& b) {
  return a.name == b.name && a.model == b.model && a.data == b.data && a.train == b.train &&
         a.parallel == b.parallel && a.resources == b.resources && a.checkpoint == b.checkpoint &&
         a.fault == b.fault && a.elastic == b.elastic;
}

namespace {

// Limits that keep a hostile or broken file from costing more than a moment: a job spec has
// about a hundred nodes, four levels deep.
constexpr int kMaxDepth = 32;
constexpr int kMaxNodes = 20000;

[[noreturn]] void fail(Diagnostic d) { throw SpecError({std::move(d)}); }

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= 1000000)
    std::snprintf(buf, sizeof buf, "%.3g MB", n / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3g kB", n / 1e3);
  return buf;
}

// 1-based line and byte column of a byte offset.
std::pair<int, int> line_col(const std::string& text, size_t offset) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  return {line, static_cast<int>(offset - line_start) + 1};
}

// Offset of the first NUL byte or malformed UTF-8 sequence, or npos for clean text.
size_t first_non_text_byte(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = b[i];
    if (c == 0) return i;
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07;
    else
      return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    // Overlong encodings, UTF-16 surrogates and values past U+10FFFF are not UTF-8.
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return i;
    i += len;
  }
  return std::string::npos;
}

struct StopScan {};

// First pass over the YAML events, before any node is built: refuses aliases (a few lines of
// nested aliases expand to billions of nodes for anything that walks them), deep nesting, huge
// node counts and a second document.
class Prescan : public YAML::EventHandler {
 public:
  Prescan(const std::string& file, std::vector<Diagnostic>& out) : file_(file), out_(out) {}
  int documents = 0;

  void OnDocumentStart(const YAML::Mark& m) override {
    if (++documents > 1) {
      error(m, "a spec file holds one YAML document, found a second one here",
            "delete the '---' line and what follows, or put the second job in its own file");
      throw StopScan{};
    }
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override {
    error(m, "YAML aliases (*name) are not supported in a job spec",
          "write the value out in full; anchors and aliases are refused so a spec cannot expand");
    if (++aliases >= 3) throw StopScan{};
  }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override {
    node(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void node(const YAML::Mark& m) {
    if (++nodes_ > kMaxNodes) {
      error(m, "the spec has more than " + std::to_string(kMaxNodes) + " YAML nodes",
            "a job spec has about a hundred values; is this the right file?");
      throw StopScan{};
    }
  }
  void open(const YAML::Mark& m) {
    node(m);
    if (++depth_ > kMaxDepth) {
      error(m, "the spec nests deeper than " + std::to_string(kMaxDepth) + " levels",
            "a job spec is at most three levels deep (train.optimizer.lr)");
      throw StopScan{};
    }
  }
  void error(const YAML::Mark& m, std::string msg, std::string hint) {
    int line = m.is_null() ? 1 : m.line + 1, col = m.is_null() ? 1 : m.column + 1;
    out_.push_back(Diagnostic{file_, line, col, std::move(msg), std::move(hint)});
  }
  int aliases = 0;
  int depth_ = 0;
  int nodes_ = 0;
  const std::string& file_;
  std::vector<Diagnostic>& out_;
};

std::string syntax_hint(const std::string& text, int line) {
  std::istringstream in(text);
  std::string l;
  for (int i = 1; std::getline(in, l); ++i) {
    if (i < line - 1 || i > line) continue;
    size_t first = l.find_first_not_of(' ');
    if (first != std::string::npos && l[first] == '\t')
      return "YAML indents with spaces, never tabs (line " + std::to_string(i) + " starts with a tab)";
  }
  return "check the indentation and quoting on this line and the one before; quote values that contain ': ' "
         "or ' #'";
}

void sort_diagnostics(std::vector<Diagnostic>& d) {
  std::stable_sort(d.begin(), d.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return a.line != b.line ? a.line < b.line : a.col < b.col;
  });
}

}  // namespace

JobSpec parse_spec(const std::string& text, const std::string& filename) {
  if (text.size() > kMaxSpecBytes)
    fail({filename, 0, 0, "spec file is " + human_bytes(text.size()) + "; a job spec is at most 1 MiB",
          "is this the right file? a job spec is a short YAML text"});
  if (size_t bad = first_non_text_byte(text); bad != std::string::npos) {
    auto [line, col] = line_col(text, bad);
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[bad]));
    fail({filename, line, col,
          std::string("not a text file: ") + (text[bad] == 0 ? "NUL byte" : "invalid UTF-8 byte ") +
              (text[bad] == 0 ? "" : byte) + " at byte " + std::to_string(bad),
          "a job spec is a YAML text file in UTF-8"});
  }

  std::vector<Diagnostic> diags;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    Prescan scan(filename, diags);
    try {
      while (parser.HandleNextDocument(scan)) {
      }
    } catch (const StopScan&) {
    }
  } catch (const YAML::ParserException& e) {
    int line = e.mark.is_null() ? 1 : e.mark.line + 1, col = e.mark.is_null() ? 1 : e.mark.column + 1;
    diags.push_back({filename, line, col, "YAML syntax error: " + e.msg, syntax_hint(text, line)});
  } catch (const YAML::Exception& e) {
    diags.push_back({filename, 1, 1, std::string("YAML error: ") + e.what(), syntax_hint(text, 1)});
  }
  if (!diags.empty()) {
    sort_diagnostics(diags);
    throw SpecError(std::move(diags));
  }

  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    int line = e.mark.is_null() ? 1 : e.mark.line + 1, col = e.mark.is_null() ? 1 : e.mark.column + 1;
    fail({filename, line, col, "YAML syntax error: " + e.msg, syntax_hint(text, line)});
  }
  if (!root.IsDefined() || root.IsNull())
    fail({filename, 1, 1, "spec file is empty",
          "a job spec needs at least name, model, data and train; see docs/job-spec.md for an example"});
  if (!root.IsMap()) {
    const char* got = root.IsSequence() ? "a list" : "a single value";
    int line = root.Mark().is_null() ? 1 : root.Mark().line + 1;
    int col = root.Mark().is_null() ? 1 : root.Mark().column + 1;
    fail({filename, line, col,
          std::string("a job spec is a mapping of keys (name:, model:, ...), got ") + got,
          "start the file with 'name: my-job' and the sections model:, data:, train:"});
  }

  JobSpec spec;
  try {
    spec = spec_detail::build_spec(root, filename, diags);
  } catch (const YAML::Exception& e) {
    // The walk reads nodes only in ways that cannot throw; this guards a yaml-cpp surprise.
    diags.push_back({filename, 1, 1, std::string("YAML error: ") + e.what(), ""});
  }
  if (!diags.empty()) {
    sort_diagnostics(diags);
    throw SpecError(std::move(diags));
  }
  return spec;
}

JobSpec load_spec(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail({path, 0, 0, std::string("cannot open spec file: ") + std::strerror(errno),
          errno == ENOENT ? "check the path; it is read relative to the current directory" : ""});
  if (S_ISDIR(st.st_mode))
    fail({path, 0, 0, "spec file is a directory",
          "give the path of a .yaml file, e.g. configs/quickstart.yaml"});
  if (!S_ISREG(st.st_mode))
    fail({path, 0, 0, "spec file is not a regular file", "give the path of a .yaml file"});
  if (static_cast<uint64_t>(st.st_size) > kMaxSpecBytes)
    fail({path, 0, 0, "spec file is " + human_bytes(st.st_size) + "; a job spec is at most 1 MiB",
          "is this the right file? a job spec is a short YAML text"});
  std::ifstream in(path, std::ios::binary);
  if (!in) fail({path, 0, 0, std::string("cannot read spec file: ") + std::strerror(errno), ""});
  // Read at most one byte past the limit: the file may have grown since stat.
  std::string text(kMaxSpecBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) fail({path, 0, 0, "cannot read spec file", ""});
  text.resize(static_cast<size_t>(in.gcount()));
  return parse_spec(text, path);
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string real(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string degree(int v) { return v == 0 ? "auto" : std::to_string(v); }

}  // namespace

std::string to_yaml(const JobSpec& s) {
  std::ostringstream y;
  y << "name: " << quote(s.name) << "\n";
  y << "model:\n";
  y << "  type: " << to_string(s.model.type) << "\n";
  y << "  vocab_size: " << s.model.vocab_size << "\n";
  y << "  seq_len: " << s.model.seq_len << "\n";
  y << "  d_model: " << s.model.d_model << "\n";
  y << "  n_layers: " << s.model.n_layers << "\n";
  if (s.model.type != ModelType::mlp) y << "  n_heads: " << s.model.n_heads << "\n";
  if (s.model.type != ModelType::mlp) y << "  ffn_hidden: " << s.model.ffn_hidden << "\n";
  if (s.model.type == ModelType::llama) {
    y << "  n_kv_heads: " << s.model.n_kv_heads << "\n";
    y << "  norm_eps: " << real(s.model.norm_eps) << "\n";
    y << "  rope_theta: " << real(s.model.rope_theta) << "\n";
    const RopeScalingSpec& r = s.model.rope_scaling;
    if (!r.type.empty())
      y << "  rope_scaling: {type: " << r.type << ", factor: " << real(r.factor)
        << ", low_freq_factor: " << real(r.low_freq_factor)
        << ", high_freq_factor: " << real(r.high_freq_factor)
        << ", original_max_position_embeddings: " << r.original_max_position_embeddings << "}\n";
    y << "  tie_embeddings: " << (s.model.tie_embeddings ? "true" : "false") << "\n";
  }
  y << "  init_from: " << quote(s.model.init_from) << "\n";
  y << "data:\n";
  y << "  source: " << to_string(s.data.source) << "\n";
  if (s.data.source != DataSource::synthetic) y << "  path: " << quote(s.data.path) << "\n";
  y << "  val_fraction: " << real(s.data.val_fraction) << "\n";
  if (s.data.source == DataSource::tokens) {
    // dtype and eot have no default value to write: without them a header decides the width,
    // and there is no end-of-text id.
    if (s.data.dtype) y << "  dtype: " << to_string(*s.data.dtype) << "\n";
    y << "  val_path: " << quote(s.data.val_path) << "\n";
    if (s.data.eot >= 0) y << "  eot: " << s.data.eot << "\n";
    y << "  tokenizer: " << quote(s.data.tokenizer) << "\n";
  }
  const TrainSpec& t = s.train;
  y << "train:\n";
  y << "  steps: " << t.steps << "\n";
  y << "  global_batch: " << t.global_batch << "\n";
  y << "  micro_batch: " << degree(t.micro_batch) << "\n";
  y << "  optimizer:\n";
  y << "    type: " << t.optimizer.type << "\n";
  y << "    lr: " << real(t.optimizer.lr) << "\n";
  y << "    beta1: " << real(t.optimizer.beta1) << "\n";
  y << "    beta2: " << real(t.optimizer.beta2) << "\n";
  y << "    eps: " << real(t.optimizer.eps) << "\n";
  y << "    weight_decay: " << real(t.optimizer.weight_decay) << "\n";
  y << "  lr_schedule: " << to_string(t.lr_schedule) << "\n";
  y << "  warmup_steps: " << t.warmup_steps << "\n";
  y << "  min_lr: " << real(t.min_lr) << "\n";
  y << "  grad_clip: " << real(t.grad_clip) << "\n";
  y << "  precision: " << to_string(t.precision) << "\n";
  y << "  recompute: " << to_string(t.recompute) << "\n";
  if (t.offload != Offload::none) y << "  offload: " << to_string(t.offload) << "\n";
  y << "  zero: " << t.zero << "\n";
  y << "  trace:\n";
  y << "    from_step: " << t.trace.from_step << "\n";
  y << "    steps: " << t.trace.steps << "\n";
  y << "  seed: " << t.seed << "\n";
  y << "  eval_every: " << t.eval_every << "\n";
  y << "  eval_batches: " << t.eval_batches << "\n";
  y << "  log_every: " << t.log_every << "\n";
  y << "parallel:\n";
  y << "  data: " << degree(s.parallel.data) << "\n";
  y << "  pipeline: " << degree(s.parallel.pipeline) << "\n";
  y << "  tensor: " << degree(s.parallel.tensor) << "\n";
  y << "  schedule: " << to_string(s.parallel.schedule) << "\n";
  y << "  virtual_stages: " << degree(s.parallel.virtual_stages) << "\n";
  y << "  sequence_parallel: " << (s.parallel.sequence_parallel ? "true" : "false") << "\n";
  y << "resources:\n";
  y << "  device: " << to_string(s.resources.device) << "\n";
  y << "  threads_per_worker: " << s.resources.threads_per_worker << "\n";
  y << "  memory_per_device: " << format_size(s.resources.memory_per_device) << "\n";
  y << "  hardware: " << quote(s.resources.hardware) << "\n";
  y << "  spares: " << s.resources.spares << "\n";
  y << "  placement: " << to_string(s.resources.placement) << "\n";
  y << "checkpoint:\n";
  y << "  dir: " << quote(s.checkpoint.dir) << "\n";
  y << "  every: " << s.checkpoint.every << "\n";
  y << "  keep: " << s.checkpoint.keep << "\n";
  y << "  memory_every: " << s.checkpoint.memory_every << "\n";
  y << "  async: " << (s.checkpoint.async ? "true" : "false") << "\n";
  y << "fault:\n";
  y << "  max_restarts: " << s.fault.max_restarts << "\n";
  y << "  heartbeat: " << format_duration(s.fault.heartbeat) << "\n";
  y << "  step_timeout: " << format_duration(s.fault.step_timeout) << "\n";
  y << "elastic:\n";
  y << "  min_devices: " << s.elastic.min_devices << "\n";
  y << "  max_devices: " << s.elastic.max_devices << "\n";
  return y.str();
}

}  // namespace troupe
