// Reading a Hugging Face directory slice by slice, and writing one from a checkpoint.
#include "checkpoint/hf.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/dtype_convert.hpp"
#include "core/json_read.hpp"

namespace fs = std::filesystem;

namespace troupe::checkpoint::hf {

namespace {

constexpr const char* kConfig = "config.json";
constexpr const char* kModel = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
// A config is a few KiB; an index lists every tensor once (a 70B model's is ~100 KiB).
constexpr uintmax_t kMaxConfigBytes = uintmax_t(1) << 20;
constexpr uintmax_t kMaxIndexBytes = uintmax_t(16) << 20;

// A JSON object from a small file, read as hostile input (core/json_read): CheckpointError
// naming the file when it is missing, too large, not a regular file or not a JSON object.
nlohmann::json read_json(const std::string& path, uintmax_t max_bytes) {
  uint64_t size = 0;
  try {
    ::close(open_regular_file(path, "Hugging Face JSON file", &size));
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
  if (size > max_bytes)
    throw CheckpointError(path + ": " + std::to_string(size) + " bytes, more than the " +
                          std::to_string(max_bytes) + " such a file may have");
  json_read::Limits limits;
  limits.max_bytes = max_bytes;
  nlohmann::json j;
  try {
    j = json_read::read_file(path, "Hugging Face JSON file", limits);
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
  if (!j.is_object()) throw CheckpointError(path + ": not a JSON object");
  return j;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + path + " to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError("fsync failed on " + path);
}

// Runs [begin, begin + length) along one dim of a tensor and where each lands locally.
struct Run {
  int64_t begin = 0, length = 0, local = 0;
};

// The runs of [lo, lo + n) that `want` holds along dim `dim` of extent `extent`: want's pieces
// when it is split there, else all of it (local = global).
std::vector<Run> runs_along(const SliceSpec& want, int dim, int64_t lo, int64_t n) {
  std::vector<Run> out;
  if (want.split_dim != dim) {
    out.push_back({lo, n, lo});
    return out;
  }
  for (const Piece& p : want.pieces) {
    const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.length, lo + n);
    if (a < b) out.push_back({a, b - a, p.local_offset + (a - p.offset)});
  }
  return out;
}

}  // namespace

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path + "/" + kConfig, ec) &&
         !fs::exists(path + "/manifest.json", ec);
}

HfSource::~HfSource() = default;

HfSource::HfSource(const std::string& dir, const ModelDims& spec) : dir_(dir) {
  dims_ = check_config(read_json(dir + "/" + kConfig, kMaxConfigBytes), spec, dir + "/" + kConfig);

  // Which file holds each stored tensor.
  std::map<std::string, const safetensors::Reader*> where;
  std::error_code ec;
  if (fs::exists(dir + "/" + kModel, ec)) {
    readers_.push_back(std::make_unique<safetensors::Reader>(dir + "/" + kModel));
    for (const auto& n : readers_.back()->names()) where[n] = readers_.back().get();
  } else if (fs::exists(dir + "/" + kIndex, ec)) {
    const std::string ipath = dir + "/" + kIndex;
    const nlohmann::json index = read_json(ipath, kMaxIndexBytes);
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) throw CheckpointError(ipath + ": no \"weight_map\" object");
    std::map<std::string, const safetensors::Reader*> by_file;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        throw CheckpointError(ipath + ": weight_map[" + it.key() + "] is not a file name");
      const std::string file = it.value().get<std::string>();
      // Shards lie beside the index: a name that leaves the directory is refused.
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
        throw CheckpointError(ipath + ": weight_map[" + it.key() + "] names \"" + file +
                              "\", not a file in " + dir);
      auto r = by_file.find(file);
      if (r == by_file.end()) {
        readers_.push_back(std::make_unique<safetensors::Reader>(dir + "/" + file));
        r = by_file.emplace(file, readers_.back().get()).first;
      }
      if (!r->second->contains(it.key()))
        throw CheckpointError(ipath + ": weight_map puts tensor " + it.key() + " in " + file +
                              ", which does not hold it");
      where[it.key()] = r->second;
    }
  } else {
    throw CheckpointError(dir + ": neither " + kModel + " nor " + kIndex + " is there");
  }

  // A GPT-2 saved from GPT2Model has no "transformer." prefix.
  const std::string prefix = "transformer.";
  const bool bare = dims_.type == "gpt" && !where.count(prefix + "wte.weight") && where.count("wte.weight");
  for (const TensorMap& m : tensor_map(dims_)) {
    Part p{m, nullptr, bare ? m.hf_name.substr(prefix.size()) : m.hf_name};
    auto it = where.find(p.stored_name);
    if (it == where.end())
      throw CheckpointError(dir + ": tensor " + p.stored_name + " is missing (troupe's " + m.troupe_name +
                            ")");
    p.reader = it->second;
    const safetensors::TensorInfo& info = p.reader->info(p.stored_name);
    if (!is_floating(info.dtype))
      throw CheckpointError(p.reader->path() + ": tensor " + p.stored_name + " is " +
                            safetensors::dtype_to_string(info.dtype) + ", not a floating-point tensor");
    if (info.shape != m.hf_shape)
      throw CheckpointError(p.reader->path() + ": tensor " + p.stored_name + " has shape " +
                            shape_str(info.shape) + ", the job's model and config.json make it " +
                            shape_str(m.hf_shape));
    parts_[m.troupe_name].push_back(std::move(p));
  }
}

void HfSource::read_slice(const std::string& name, const SliceSpec& want, float* dst) const {
  auto it = parts_.find(name);
  if (it == parts_.end())
    throw CheckpointError(dir_ + ": the job's parameter " + name +
                          " has no tensor in the Hugging Face layout");
  const TensorMap& first = it->second.front().map;
  if (want.global_shape != first.troupe_shape)
    throw CheckpointError(dir_ + ": parameter " + name + " has shape " + shape_str(want.global_shape) +
                          ", the Hugging Face layout's is " + shape_str(first.troupe_shape));
  if (want.split_dim > 1 || want.split_dim >= int(want.global_shape.size()))
    throw CheckpointError(dir_ + ": parameter " + name + " split on dim " + std::to_string(want.split_dim) +
                          " cannot be read from a Hugging Face tensor");
  for (const Part& p : it->second) read_part(p, want, dst);
}

// Element run [elem, elem + count) of the stored tensor, converted to f32.
void HfSource::read_run(const Part& p, int64_t elem, int64_t count, float* dst) const {
  const DType dt = p.reader->info(p.stored_name).dtype;
  const uint64_t esz = dtype_size(dt);
  if (dt == DType::f32) {
    p.reader->read_bytes(p.stored_name, uint64_t(elem) * esz, uint64_t(count) * esz, dst);
  } else {
    staging_.resize(size_t(count) * esz);
    p.reader->read_bytes(p.stored_name, uint64_t(elem) * esz, uint64_t(count) * esz, staging_.data());
    convert(dt, staging_.data(), DType::f32, dst, size_t(count));
  }
  bytes_read_ += uint64_t(count) * esz;
}

// The part holds troupe rows [row_begin, row_begin + rows), all columns (C of them; 1-D: 1).
// Each (row run x column run) of `want` inside it is read from the stored tensor:
//   as is:      stored (rows', C), element (r - row_begin, c); full-width runs are one read.
//   transposed: stored (C, rows), element (c, r - row_begin); each stored row read once per
//               row run, then scattered into the (out, in) destination.
void HfSource::read_part(const Part& p, const SliceSpec& want, float* dst) const {
  const TensorMap& m = p.map;
  const int64_t C = m.troupe_shape.size() > 1 ? m.troupe_shape[1] : 1;
  const Shape local = local_shape(want);
  const int64_t local_cols = local.size() > 1 ? local[1] : 1;
  const std::vector<Run> rows = runs_along(want, 0, m.row_begin, m.rows);
  const std::vector<Run> cols =
      m.troupe_shape.size() > 1 ? runs_along(want, 1, 0, C) : std::vector<Run>{{0, 1, 0}};
  std::vector<float> block;
  for (const Run& r : rows)
    for (const Run& c : cols) {
      float* out = dst + r.local * local_cols + c.local;
      const int64_t r0 = r.begin - m.row_begin;  // first row within the part
      if (!m.transpose) {
        if (c.length == C && local_cols == C) {
          read_run(p, r0 * C, r.length * C, out);
        } else {
          for (int64_t i = 0; i < r.length; ++i)
            read_run(p, (r0 + i) * C + c.begin, c.length, out + i * local_cols);
        }
        continue;
      }
      block.resize(size_t(c.length * r.length));  // (c.length, r.length) of the stored (C, rows)
      if (r.length == m.rows)
        read_run(p, c.begin * m.rows, c.length * r.length, block.data());
      else
        for (int64_t j = 0; j < c.length; ++j)
          read_run(p, (c.begin + j) * m.rows + r0, r.length, block.data() + j * r.length);
      for (int64_t i = 0; i < r.length; ++i)
        for (int64_t j = 0; j < c.length; ++j) out[i * local_cols + j] = block[size_t(j * r.length + i)];
    }
}

SliceReader init_source(const std::string& path, const JobSpec& spec) {
  if (is_hf_dir(path)) {
    auto src = std::make_shared<const HfSource>(path, dims_of(spec));
    return [src](const std::string& name, const SliceSpec& want, float* dst) {
      src->read_slice(name, want, dst);
    };
  }
  auto src = std::make_shared<const TensorSource>(fs::is_directory(path) ? resolve(path) : path);
  return
      [src](const std::string& name, const SliceSpec& want, float* dst) { src->read_slice(name, want, dst); };
}

size_t export_hf(const std::string& checkpoint_dir, const std::string& out_dir, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    throw CheckpointError(std::string("export dtype ") + dtype_name(dtype) + ": choose f32, bf16 or f16");
  const TensorSource src(checkpoint_dir);
  if (!src.manifest())
    throw CheckpointError(checkpoint_dir +
                          ": not a checkpoint directory (the Hugging Face export reads the "
                          "model's spec from its manifest)");
  JobSpec spec;
  try {
    spec = parse_spec(src.manifest()->spec_yaml, checkpoint_dir + "/manifest.json");
  } catch (const SpecError& e) {
    throw CheckpointError(checkpoint_dir + ": the checkpoint's spec does not parse:\n" + e.what());
  }
  const ModelDims d = dims_of(spec);
  const std::vector<TensorMap> maps = tensor_map(d);

  // Every parameter the checkpoint holds has a place in the layout, and the other way round.
  std::set<std::string> mapped;
  for (const TensorMap& m : maps) mapped.insert(m.troupe_name);
  for (const auto& name : src.names())
    if (name.rfind("optim.", 0) != 0 && !mapped.count(name))
      throw CheckpointError(checkpoint_dir + ": tensor " + name + " has no place in the Hugging Face layout");
  std::map<std::string, Tensor> troupe;
  for (const TensorMap& m : maps) {
    if (troupe.count(m.troupe_name)) continue;
    Tensor t = Tensor::zeros(m.troupe_shape, DType::f32);
    src.read(m.troupe_name, m.troupe_shape, t.f32());  // names a missing tensor or another shape
    troupe.emplace(m.troupe_name, std::move(t));
  }
  std::map<std::string, Tensor> hf = to_hf(d, troupe);
  troupe.clear();
  std::vector<safetensors::WriteEntry> entries;
  for (const TensorMap& m : maps) {
    Tensor& t = hf.at(m.hf_name);
    if (dtype != DType::f32) {
      Tensor narrow = Tensor::empty(t.shape(), dtype);
      convert(DType::f32, t.data(), dtype, narrow.data(), size_t(t.numel()));
      t = std::move(narrow);
    }
    entries.push_back(safetensors::entry(m.hf_name, t));
  }

  // Each file whole or not at all: written under a temporary name, fsynced, renamed;
  // config.json last, so a directory with a config holds its tensors.
  std::error_code ec;
  if (fs::exists(out_dir + "/manifest.json", ec))
    throw CheckpointError(out_dir + ": a troupe checkpoint; export to another directory");
  fs::create_directories(out_dir, ec);
  if (ec) throw CheckpointError("cannot create " + out_dir + ": " + ec.message());
  const std::string model_path = out_dir + "/" + kModel, config_path = out_dir + "/" + kConfig;
  fs::remove(config_path, ec);  // an earlier export's config must not describe these tensors
  safetensors::WriteOptions wo;
  wo.fsync = true;
  safetensors::write(model_path + ".tmp", entries, {{"format", "pt"}}, wo);
  fs::rename(model_path + ".tmp", model_path, ec);
  if (ec) throw CheckpointError("cannot rename " + model_path + ".tmp: " + ec.message());
  {
    std::ofstream f(config_path + ".tmp", std::ios::trunc);
    f << config_json(d, dtype).dump(2) << "\n";
    f.close();
    if (!f) throw CheckpointError("cannot write " + config_path + ".tmp");
  }
  fsync_path(config_path + ".tmp", false);
  fs::rename(config_path + ".tmp", config_path, ec);
  if (ec) throw CheckpointError("cannot rename " + config_path + ".tmp: " + ec.message());
  fsync_path(out_dir, true);
  return entries.size();
}

}  // namespace troupe::checkpoint::hf
