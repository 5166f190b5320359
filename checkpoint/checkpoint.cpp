#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
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
