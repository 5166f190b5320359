#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include "core/dtype_convert.hpp"

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

std::string prepare(const std::string& root, int64_t step) {
  std::string tmp = root + "/" + step_dir_name(step) + kTmpSuffix;
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) throw Error("cannot create checkpoint directory " + tmp + ": " + ec.message());
  return tmp;
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
  // Files no rank reported (left by a crashed earlier attempt at this step) stay out: each
  // name looked up, not compared with every listed one (N^2 at thousands of shards).
  std::unordered_set<std::string> listed;
  listed.reserve(manifest.files.size() + 1);
  listed.insert(kManifest);
  for (const auto& f : manifest.files) listed.insert(f.name);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec))
    if (!listed.count(e.path().filename().string())) fs::remove_all(e.path(), ec);
  fsync_path(tmp + "/" + kManifest, false);
  fsync_path(tmp, true);
  fault_point("commit", manifest.step);
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
  return latest_valid(root, skipped, [](const std::string& dir) { verify(dir); });
}

std::optional<std::string> latest_valid(const std::string& root, std::vector<std::string>* skipped,
                                        const std::function<void(const std::string&)>& check) {
  for (const auto& dir : list(root)) {
    try {
      check(dir);
      return dir;
    } catch (const CheckpointError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

Shape local_shape(const SliceSpec& s) {
  Shape l = s.global_shape;
  if (s.split_dim >= 0) {
    int64_t n = 0;
    for (const auto& p : s.pieces) n += p.length;
    l[size_t(s.split_dim)] = n;
  }
  return l;
}

SliceSpec whole(const Shape& global_shape) { return SliceSpec{global_shape, -1, {}}; }

Spread spread(const SliceSpec& held, int index, int count) {
  Spread out;
  const Shape local = local_shape(held);
  out.dim = held.split_dim >= 0 ? held.split_dim : 0;
  out.stored.global_shape = held.global_shape;
  out.stored.split_dim = out.dim;
  if (local.empty()) {  // a scalar: replica 0 stores it whole
    out.stored.split_dim = -1;
    out.end = index == 0 ? 1 : 0;
    return out;
  }
  const int64_t n = local[size_t(out.dim)];
  if (count == 1) {
    out.stored = held;
    out.end = n;
    return out;
  }
  out.begin = n * index / count;
  out.end = n * (index + 1) / count;
  if (held.split_dim < 0) {
    if (out.end > out.begin) out.stored.pieces.push_back({out.begin, out.end - out.begin, 0});
    return out;
  }
  for (const auto& p : held.pieces) {
    const int64_t a = std::max(p.local_offset, out.begin), b = std::min(p.local_offset + p.length, out.end);
    if (a < b) out.stored.pieces.push_back({p.offset + (a - p.local_offset), b - a, a - out.begin});
  }
  return out;
}

void copy_block(const float* src, const Shape& shape, int dim, int64_t begin, int64_t end, float* dst) {
  if (shape.empty()) {
    if (end > begin) *dst = *src;
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t ext = shape[size_t(dim)], n = end - begin;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + o * n * inner, src + (o * ext + begin) * inner, size_t(n * inner) * sizeof(float));
}

nlohmann::json slice_json(const SliceSpec& s) {
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& p : s.pieces)
    pieces.push_back({{"offset", p.offset}, {"length", p.length}, {"local_offset", p.local_offset}});
  return {{"global_shape", s.global_shape}, {"split_dim", s.split_dim}, {"pieces", pieces}};
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

// Global index ranges [lo, hi) per dim of the elements a piece covers.
struct Box {
  std::vector<int64_t> lo, hi;
};

Box piece_box(const Shape& g, int split, const Piece* p) {
  Box b{std::vector<int64_t>(g.size(), 0), std::vector<int64_t>(g.begin(), g.end())};
  if (split >= 0 && p) {
    b.lo[size_t(split)] = p->offset;
    b.hi[size_t(split)] = p->offset + p->length;
  }
  return b;
}

}  // namespace

TensorSource::TensorSource(const std::string& path, Verify verify_when) : path_(path) {
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    manifest_ = verify_when == Verify::all ? verify(path) : check_files(path);
    for (const auto& f : manifest_->files) files.push_back(path + "/" + f.name);
  } else {
    if (!fs::exists(path)) throw CheckpointError(path + ": no such file or checkpoint directory");
    files.push_back(path);
  }
  // A checkpoint's shards are read as regular files only, never through a link.
  for (const auto& f : files) readers_.emplace_back(f, manifest_ ? Links::refuse : Links::follow);
  verified_.assign(readers_.size(), manifest_ && verify_when == Verify::all ? 1 : 0);
  for (size_t i = 0; i < readers_.size(); ++i) {
    const auto& r = readers_[i];
    const nlohmann::json slices = shard_slices(r);
    for (const auto& name : r.names()) {
      const auto& info = r.info(name);
      Stored st;
      st.reader = i;
      st.local = info.shape;
      st.slice = whole(info.shape);
      const std::string param = param_of(name);
      try {
        if (slices.contains(param)) {
          const auto& sj = slices[param];
          st.slice.global_shape = sj.at("global_shape").get<Shape>();
          st.slice.split_dim = sj.at("split_dim").get<int>();
          for (const auto& pc : sj.at("pieces"))
            st.slice.pieces.push_back({pc.at("offset").get<int64_t>(), pc.at("length").get<int64_t>(),
                                       pc.at("local_offset").get<int64_t>()});
        }
      } catch (const nlohmann::json::exception& e) {
        throw CheckpointError(r.path() + ": malformed 'slices' entry of " + param + ": " + e.what());
      }
      if (!is_floating(info.dtype))
        throw CheckpointError(r.path() + ": tensor " + name + " is " +
                              safetensors::dtype_to_string(info.dtype) +
                              ", checkpoints hold floating-point tensors (F32, BF16, F16, F64)");
      st.dtype = info.dtype;
      if (local_shape(st.slice) != st.local || st.slice.split_dim >= int(st.local.size()))
        throw CheckpointError(r.path() + ": tensor " + name + " has shape " + shape_str(st.local) +
                              ", its slice metadata says " + shape_str(local_shape(st.slice)));
      index_[name].push_back(std::move(st));
    }
  }
}

bool TensorSource::contains(const std::string& name) const { return index_.count(name) != 0; }

size_t TensorSource::files_verified() const {
  return static_cast<size_t>(std::count(verified_.begin(), verified_.end(), 1));
}

std::vector<std::string> TensorSource::names() const {
  std::vector<std::string> out;
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

Shape TensorSource::global_shape(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw CheckpointError(path_ + ": tensor " + name + " is missing");
  return it->second.front().slice.global_shape;
}

void TensorSource::read(const std::string& name, const Shape& shape, float* dst) const {
  if (contains(name) && global_shape(name) != shape)
    throw CheckpointError(path_ + ": tensor " + name + " has shape " + shape_str(global_shape(name)) +
                          ", the model's is " + shape_str(shape));
  read_slice(name, whole(shape), dst);
}

void TensorSource::read_slice(const std::string& name, const SliceSpec& want, float* dst) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw CheckpointError(path_ + ": tensor " + name + " is missing");
  const Shape& G = want.global_shape;
  const size_t n = G.size();
  const Shape DL = local_shape(want);
  int64_t numel = 1;
  for (auto d : DL) numel *= d;
  std::vector<char> covered(size_t(numel), 0);
  std::vector<char> staging;  // a run of a BF16 / F16 / F64 tensor before conversion
  std::vector<Piece> want_pieces = want.pieces;
  if (want.split_dim < 0) want_pieces = {Piece{}};
  for (const Stored& st : it->second) {
    if (st.slice.global_shape != G)
      throw CheckpointError(readers_[st.reader].path() + ": tensor " + name + " has global shape " +
                            shape_str(st.slice.global_shape) + ", the model's is " + shape_str(G));
    const Shape& SL = st.local;
    std::vector<Piece> stored_pieces = st.slice.pieces;
    if (st.slice.split_dim < 0) stored_pieces = {Piece{}};
    for (const Piece& sp : stored_pieces) {
      const Box sb = piece_box(G, st.slice.split_dim, &sp);
      for (const Piece& wp : want_pieces) {
        const Box wb = piece_box(G, want.split_dim, &wp);
        Box b{std::vector<int64_t>(n), std::vector<int64_t>(n)};
        bool empty = false;
        for (size_t k = 0; k < n; ++k) {
          b.lo[k] = std::max(sb.lo[k], wb.lo[k]);
          b.hi[k] = std::min(sb.hi[k], wb.hi[k]);
          empty |= b.lo[k] >= b.hi[k];
        }
        if (empty) continue;
        // Global -> local index shift per dim in the stored and the wanted tensor.
        std::vector<int64_t> sshift(n, 0), dshift(n, 0);
        if (st.slice.split_dim >= 0) sshift[size_t(st.slice.split_dim)] = sp.offset - sp.local_offset;
        if (want.split_dim >= 0) dshift[size_t(want.split_dim)] = wp.offset - wp.local_offset;
        // Contiguous runs: the trailing dims the box spans whole in both tensors, plus one.
        size_t r = n == 0 ? 0 : n - 1;
        int64_t run = n == 0 ? 1 : b.hi[r] - b.lo[r];
        while (r > 0 && b.hi[r] - b.lo[r] == SL[r] && b.hi[r] - b.lo[r] == DL[r]) {
          --r;
          run *= b.hi[r] - b.lo[r];
        }
        std::vector<int64_t> sstride(n, 1), dstride(n, 1);
        for (size_t k = n; k-- > 1;) {
          sstride[k - 1] = sstride[k] * SL[k];
          dstride[k - 1] = dstride[k] * DL[k];
        }
        std::vector<int64_t> idx(b.lo.begin(), b.lo.end());
        while (true) {
          int64_t so = 0, dof = 0;
          for (size_t k = 0; k < n; ++k) {
            so += (idx[k] - sshift[k]) * sstride[k];
            dof += (idx[k] - dshift[k]) * dstride[k];
          }
          auto first = covered.begin() + dof, last = first + run;
          if (std::find(first, last, 0) != last) {
            if (manifest_ && !verified_[st.reader]) {
              verify_file(path_, manifest_->files[st.reader]);
              verified_[st.reader] = 1;
            }
            const uint64_t esz = dtype_size(st.dtype);
            if (st.dtype == DType::f32) {
              readers_[st.reader].read_bytes(name, uint64_t(so) * esz, uint64_t(run) * esz, dst + dof);
            } else {
              staging.resize(size_t(run) * esz);
              readers_[st.reader].read_bytes(name, uint64_t(so) * esz, uint64_t(run) * esz, staging.data());
              convert(st.dtype, staging.data(), DType::f32, dst + dof, size_t(run));
            }
            bytes_read_ += uint64_t(run) * esz;
            std::fill(first, last, 1);
          }
          int k = int(r) - 1;  // odometer over the dims [0, r) outside the run
          for (; k >= 0; --k) {
            if (++idx[size_t(k)] < b.hi[size_t(k)]) break;
            idx[size_t(k)] = b.lo[size_t(k)];
          }
          if (k < 0) break;
        }
      }
    }
  }
  if (std::find(covered.begin(), covered.end(), 0) != covered.end())
    throw CheckpointError(path_ + ": the stored slices do not cover the wanted part of " + name);
}

std::vector<std::string> tensor_names(const std::string& dir, const Manifest& m) {
  std::vector<std::string> names;
  for (const auto& f : m.files) {
    safetensors::Reader r(dir + "/" + f.name, Links::refuse);
    for (auto& n : r.names()) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

Tensor read_full(const std::string& dir, const Manifest&, const std::string& name) {
  TensorSource src(dir);
  Tensor full = Tensor::zeros(src.global_shape(name), DType::f32);
  src.read_slice(name, whole(full.shape()), full.f32());
  return full;
}

size_t export_model(const std::string& checkpoint_dir, const std::string& out_path, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error(std::string("export dtype ") + dtype_name(dtype) + ": choose f32, bf16 or f16");
  TensorSource src(checkpoint_dir);
  std::vector<Tensor> tensors;
  std::vector<safetensors::WriteEntry> entries;
  for (const auto& name : src.names()) {
    if (name.rfind("optim.", 0) == 0) continue;
    Tensor full = Tensor::zeros(src.global_shape(name), DType::f32);
    src.read_slice(name, whole(full.shape()), full.f32());
    if (dtype != DType::f32) {
      Tensor narrow = Tensor::empty(full.shape(), dtype);
      convert(DType::f32, full.data(), dtype, narrow.data(), size_t(full.numel()));
      full = std::move(narrow);
    }
    tensors.push_back(std::move(full));
  }
  size_t i = 0;
  for (const auto& name : src.names())
    if (name.rfind("optim.", 0) != 0) entries.push_back(safetensors::entry(name, tensors[i++]));
  safetensors::Metadata meta{{"format", "pt"}};
  if (src.manifest()) meta["troupe_step"] = std::to_string(src.manifest()->step);
  safetensors::WriteOptions wo;
  wo.fsync = true;
  safetensors::write(out_path, entries, meta, wo);
  return entries.size();
}

void fault_point(const std::string& where, int64_t step, int rank, int generation, const std::string& path) {
  const char* env = std::getenv("TROUPE_CKPT_FAULT");
  if (!env || generation != 0) return;
  std::string want = where + ":" + std::to_string(step);
  if (rank >= 0) want += ":" + std::to_string(rank);
  if (want != env) return;
  if (!path.empty()) {
    // Half a file on disk, then the process is gone: what a crash mid-write leaves.
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!ec) fs::resize_file(path, size / 2, ec);
  }
  std::fprintf(stderr, "troupe: TROUPE_CKPT_FAULT=%s: killing this process\n", env);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path + "/" + kManifest, ec);
}

namespace {

// The newest valid checkpoint under a root, or a CheckpointError listing what was skipped.
std::string latest_valid_or_throw(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<std::string> bad;
  auto found = latest_valid(dir, &bad);
  if (!found) {
    std::string why = dir + ": no valid checkpoint";
    for (const auto& s : bad) why += "\n  skipped " + s;
    throw CheckpointError(why);
  }
  if (skipped) skipped->insert(skipped->end(), bad.begin(), bad.end());
  return *found;
}

}  // namespace

std::string resolve(const std::string& dir) {
  if (fs::exists(dir + "/" + kManifest)) return dir;
  if (!fs::is_directory(dir)) throw CheckpointError(dir + ": not a checkpoint directory");
  return latest_valid_or_throw(dir, nullptr);
}

std::string resolve_verified(const std::string& dir, std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw CheckpointError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) throw CheckpointError(dir + ": not a directory");
  fs::path name = fs::path(dir).lexically_normal();
  if (name.filename().empty()) name = name.parent_path();  // "ckpt/step_000010/"
  if (fs::exists(dir + "/" + kManifest, ec) || parse_step_dir(name.filename().string()) >= 0) {
    verify(dir);  // throws, naming the missing manifest or the bad file
    return dir;
  }
  const auto found = list(dir);
  if (found.empty()) {
    if (fs::is_directory(dir + "/ckpt", ec))
      throw CheckpointError(dir + ": a run directory, not a checkpoint; its checkpoints are in " + dir +
                            "/ckpt");
    throw CheckpointError(dir +
                          ": not a checkpoint directory (no manifest.json, and no step_N checkpoints in it)");
  }
  return latest_valid_or_throw(dir, skipped);
}

}  // namespace troupe::checkpoint
