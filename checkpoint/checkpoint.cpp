#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace troupe::checkpoint {

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kTmpSuffix = ".tmp";

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + " to fsync it");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("fsync failed on " + path);
}

// step_000500 -> 500; -1 for names that are not committed checkpoints.
int64_t parse_step_dir(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

nlohmann::json to_json(const Manifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"size", f.size}, {"xxh64", f.xxh64}});
  return {{"format", "troupe-checkpoint"},
          {"format_version", m.format_version},
          {"step", m.step},
          {"data_cursor", m.data_cursor},
          {"layout", {{"data", m.dp}, {"pipeline", m.pp}, {"tensor", m.tp}}},
          {"rng", {{"seed", m.seed}}},
          {"spec_hash", m.spec_hash},
          {"optimizer", m.optimizer},
          {"spec", m.spec_yaml},
          {"files", files}};
}

Manifest manifest_from_json(const nlohmann::json& j) {
  try {
    if (j.value("format", "") != "troupe-checkpoint")
      throw CheckpointError("not a troupe checkpoint manifest");
    Manifest m;
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version != kFormatVersion)
      throw CheckpointError("manifest format_version " + std::to_string(m.format_version) +
                            ", this build reads " + std::to_string(kFormatVersion));
    m.step = j.at("step").get<int64_t>();
    m.data_cursor = j.at("data_cursor").get<int64_t>();
    m.dp = j.at("layout").at("data").get<int>();
    m.pp = j.at("layout").at("pipeline").get<int>();
    m.tp = j.at("layout").at("tensor").get<int>();
    m.seed = j.at("rng").at("seed").get<uint64_t>();
    m.spec_hash = j.value("spec_hash", "");
    m.optimizer = j.value("optimizer", nlohmann::json::object());
    m.spec_yaml = j.value("spec", "");
    for (const auto& f : j.at("files"))
      m.files.push_back(
          {f.at("name").get<std::string>(), f.at("size").get<uint64_t>(), f.at("xxh64").get<std::string>()});
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(std::string("malformed manifest: ") + e.what());
  }
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

std::string begin(const std::string& root, int64_t step) {
  std::string tmp = root + "/" + step_dir_name(step) + kTmpSuffix;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error("cannot create checkpoint directory " + tmp + ": " + ec.message());
  return tmp;
}

std::string file_xxh64(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError(path + ": cannot be read");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    if (f.gcount() > 0) XXH64_update(st, buf.data(), size_t(f.gcount()));
  }
  unsigned long long h = XXH64_digest(st);
  XXH64_freeState(st);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", h);
  return out;
}

FileRecord write_shard(const std::string& tmp_dir, const std::string& file_name,
                       const std::vector<safetensors::WriteEntry>& entries,
                       const safetensors::Metadata& metadata) {
  const std::string path = tmp_dir + "/" + file_name;
  safetensors::WriteOptions opt;
  opt.fsync = true;
  uint64_t size = safetensors::write(path, entries, metadata, opt);
  return {file_name, size, file_xxh64(path)};
}

std::string commit(const std::string& root, const Manifest& manifest, int keep) {
  const std::string name = step_dir_name(manifest.step);
  const std::string tmp = root + "/" + name + kTmpSuffix;
  const std::string final_dir = root + "/" + name;
  {
    std::ofstream f(tmp + "/" + kManifest, std::ios::trunc);
    f << to_json(manifest).dump(2) << "\n";
    f.close();
    if (!f) throw Error("cannot write " + tmp + "/" + kManifest);
  }
  fsync_path(tmp + "/" + kManifest, false);
  fsync_path(tmp, true);
  std::error_code ec;
  fs::remove_all(final_dir, ec);  // a re-run of the same step replaces it
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error("cannot rename " + tmp + " to " + final_dir + ": " + ec.message());
  // latest: a new symlink renamed over the old one is atomic.
  const std::string link_tmp = root + "/latest.tmp";
  fs::remove(link_tmp, ec);
  fs::create_directory_symlink(name, link_tmp, ec);
  if (ec) throw Error("cannot create " + link_tmp + ": " + ec.message());
  fs::rename(link_tmp, root + "/latest", ec);
  if (ec) throw Error("cannot update " + root + "/latest: " + ec.message());
  fsync_path(root, true);

  // Retention and leftovers: older committed checkpoints beyond `keep`, stale .tmp dirs.
  std::vector<std::string> all = list(root);
  if (keep > 0)
    for (size_t i = size_t(keep); i < all.size(); ++i) fs::remove_all(all[i], ec);
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.size() > 4 && n.compare(n.size() - 4, 4, kTmpSuffix) == 0 &&
        parse_step_dir(n.substr(0, n.size() - 4)) >= 0 &&
        parse_step_dir(n.substr(0, n.size() - 4)) <= manifest.step)
      fs::remove_all(e.path(), ec);
  }
  return final_dir;
}

Manifest verify(const std::string& dir) {
  const std::string mpath = dir + "/" + kManifest;
  std::ifstream f(mpath);
  if (!f) throw CheckpointError(dir + ": manifest.json is missing (an uncommitted or damaged checkpoint)");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw CheckpointError(dir + ": manifest.json is not valid JSON");
  Manifest m;
  try {
    m = manifest_from_json(j);
  } catch (const CheckpointError& e) {
    throw CheckpointError(dir + ": " + e.what());
  }
  for (const auto& rec : m.files) {
    const std::string p = dir + "/" + rec.name;
    std::error_code ec;
    if (!fs::exists(p, ec)) throw CheckpointError(dir + ": file " + rec.name + " is missing");
    uint64_t size = fs::file_size(p, ec);
    if (ec || size != rec.size)
      throw CheckpointError(dir + ": file " + rec.name + " has " + std::to_string(size) +
                            " bytes, the manifest says " + std::to_string(rec.size) +
                            " (truncated or overwritten)");
    std::string h = file_xxh64(p);
    if (h != rec.xxh64)
      throw CheckpointError(dir + ": file " + rec.name + " checksum " + h +
                            " does not match the manifest's " + rec.xxh64 + " (corrupt)");
  }
  return m;
}

std::vector<std::string> list(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory() || e.is_symlink()) continue;
    int64_t s = parse_step_dir(e.path().filename().string());
    if (s >= 0) found.emplace_back(s, e.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<std::string> latest_valid(const std::string& root, std::vector<std::string>* skipped) {
  for (const auto& dir : list(root)) {
    try {
      verify(dir);
      return dir;
    } catch (const CheckpointError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

TensorSource::TensorSource(const std::string& path) : path_(path) {
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    manifest_ = verify(path);
    for (const auto& f : manifest_->files) files.push_back(path + "/" + f.name);
  } else {
    if (!fs::exists(path)) throw CheckpointError(path + ": no such file or checkpoint directory");
    files.push_back(path);
  }
  for (const auto& f : files) readers_.emplace_back(f);
}

bool TensorSource::contains(const std::string& name) const {
  for (const auto& r : readers_)
    if (r.contains(name)) return true;
  return false;
}

void TensorSource::read(const std::string& name, const Shape& shape, float* dst) const {
  for (const auto& r : readers_) {
    if (!r.contains(name)) continue;
    const auto& info = r.info(name);
    if (info.dtype != DType::f32 || info.shape != shape)
      throw CheckpointError(path_ + ": tensor " + name + " has dtype " +
                            safetensors::dtype_to_string(info.dtype) + " and another shape than the model's");
    r.read_bytes(name, 0, info.nbytes(), dst);
    return;
  }
  throw CheckpointError(path_ + ": tensor " + name + " is missing");
}

namespace {

// The parameter a stored tensor belongs to: "optim.m.h.0.x" -> "h.0.x".
std::string param_of(const std::string& name) {
  for (const char* p : {"optim.m.", "optim.v."})
    if (name.rfind(p, 0) == 0) return name.substr(std::strlen(p));
  return name;
}

nlohmann::json shard_slices(const safetensors::Reader& r) {
  auto it = r.metadata().find("slices");
  if (it == r.metadata().end()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw CheckpointError(r.path() + ": malformed 'slices' metadata");
  return j;
}

}  // namespace

std::vector<std::string> tensor_names(const std::string& dir, const Manifest& m) {
  std::vector<std::string> names;
  for (const auto& f : m.files) {
    safetensors::Reader r(dir + "/" + f.name);
    for (auto& n : r.names()) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

Tensor read_full(const std::string& dir, const Manifest& m, const std::string& name) {
  Tensor full;
  std::vector<char> covered;  // per element along the split dim (or one flag when whole)
  int64_t rows_total = 0;
  for (const auto& f : m.files) {
    safetensors::Reader r(dir + "/" + f.name);
    if (!r.contains(name)) continue;
    const nlohmann::json slices = shard_slices(r);
    const std::string param = param_of(name);
    const auto& info = r.info(name);
    Shape global = info.shape;
    int split = -1;
    std::vector<std::array<int64_t, 3>> pieces;  // offset, length, local_offset
    if (slices.contains(param)) {
      const auto& sj = slices[param];
      global = sj.at("global_shape").get<Shape>();
      split = sj.at("split_dim").get<int>();
      for (const auto& pc : sj.at("pieces"))
        pieces.push_back({pc.at("offset").get<int64_t>(), pc.at("length").get<int64_t>(),
                          pc.at("local_offset").get<int64_t>()});
    }
    if (!full.defined()) {
      full = Tensor::zeros(global, DType::f32);
      rows_total = split < 0 ? 1 : global[size_t(split)];
      covered.assign(size_t(rows_total), 0);
    }
    if (full.shape() != global) throw CheckpointError(dir + ": shards disagree on the shape of " + name);
    Tensor local = r.read(name);
    if (split < 0 || pieces.empty()) {
      if (local.shape() != global)
        throw CheckpointError(r.path() + ": " + name + " is a slice without slice metadata");
      full.copy_from(local);
      std::fill(covered.begin(), covered.end(), 1);
      continue;
    }
    // Row-major (outer, split extent, inner): copy each run of the split dim into place.
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < split; ++d) outer *= global[size_t(d)];
    for (size_t d = size_t(split) + 1; d < global.size(); ++d) inner *= global[d];
    const int64_t gext = global[size_t(split)], lext = local.shape()[size_t(split)];
    const float* src = local.f32();
    float* dst = full.f32();
    for (const auto& pc : pieces) {
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + (o * gext + pc[0]) * inner, src + (o * lext + pc[2]) * inner,
                    size_t(pc[1] * inner) * sizeof(float));
      for (int64_t i = 0; i < pc[1]; ++i) covered[size_t(pc[0] + i)] = 1;
    }
  }
  if (!full.defined()) throw CheckpointError(dir + ": tensor " + name + " is in no shard");
  if (std::find(covered.begin(), covered.end(), 0) != covered.end())
    throw CheckpointError(dir + ": the shards do not cover all of " + name);
  return full;
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path + "/" + kManifest, ec);
}

std::string resolve(const std::string& dir) {
  if (fs::exists(dir + "/" + kManifest)) return dir;
  if (!fs::is_directory(dir)) throw CheckpointError(dir + ": not a checkpoint directory");
  std::vector<std::string> skipped;
  auto found = latest_valid(dir, &skipped);
  if (!found) {
    std::string why = dir + ": no valid checkpoint";
    for (const auto& s : skipped) why += "\n  skipped " + s;
    throw CheckpointError(why);
  }
  return *found;
}

}  // namespace troupe::checkpoint
